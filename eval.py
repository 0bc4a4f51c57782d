"""Perplexity at and far beyond the training length, as a table, a JSON file and a plot; and the other eval modes.

python eval.py checkpoint=out/rope                            lengths 0.5..16 x training length, two modes
python eval.py checkpoint=out/rope eval.rope_scaling=all      + linear, ntk, dynamic_ntk, yarn, yarn_released, llama3
python eval.py sweep_dir=multirun/2026-11-22_10-00-00         every run of a training sweep, one table
python eval.py -m checkpoint=out/rope,out/alibi,out/learned   likewise, as a Hydra multirun
python eval.py checkpoint=out/sink eval.mode=stream           also passkey, grids, tasks (docs/evaluation.md)
Writes <run>/eval/length.{json,png} (or stream.*, passkey.*); the length tables also go to wandb. Each mode's driver is
evaluation/<mode>.py; this file checks the config, walks a sweep, and compares. More rows: docs/extension.md.
"""

import importlib
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

import utils.eval_schema  # noqa: F401  (registers this entry point's settings)
from utils import checkpoint, checks, files, runtime, schema
from utils.errors import UserError, cli, hydra_cli
from utils.logger import start_wandb
from utils.progress import Eta

OWN_DATA = ("grids", "tasks")  # modes that score only models of their own data= (and those models only them)


def mode_module(name: str):
    """evaluation/<name>.py: run_<name>(path, cfg, rt, out_dir) writes and returns a result; compare() makes tables."""
    return importlib.import_module(f"evaluation.{name}")


def log_wandb(cfg, ckpt_config: dict, out_dir: Path, result: dict):
    """The length table and plot (logger.wandb=true)."""
    if not cfg.logger.wandb:
        return
    import wandb

    run = start_wandb(
        ckpt_config["logger"]["project"],
        out_dir,
        {"eval": schema.plain(cfg.eval), "train": ckpt_config},
        cfg.logger.mode,
        name=f"eval-length-{out_dir.parent.name}",
        job_type="eval",
    )
    if run is None:
        return
    rows = result["results"]
    columns = sorted({k for r in rows for k in r} - {"piece_nll"})  # bootstrap inputs stay in length.json
    cell = lambda v: str(v) if isinstance(v, list) else v  # an interval as one table cell
    run.log(
        {
            "length/table": wandb.Table(columns=columns, data=[[cell(r.get(c)) for c in columns] for r in rows]),
            "length/plot": wandb.Image(str(out_dir / "length.png")),
        }
    )
    run.summary.update({f"length/{r.get('variant', '')}/{r['mode']}/{r.get('length', '')}": r.get("ppl") for r in rows})
    run.finish()


def evaluate_one(path, cfg, rt, which: str = "") -> dict:
    run_dir = checkpoint.checkpoint_path(path).parent
    out_dir = run_dir / "eval"
    print(f"evaluating {run_dir}{which}", flush=True)
    ckpt_config = checkpoint.load(path, mmap=True)["config"]
    source, mode = ckpt_config["data"].get("source"), cfg.eval.mode
    if source != mode and (source in OWN_DATA or mode in OWN_DATA):
        own = source if source in OWN_DATA else mode
        raise UserError(
            f"eval.mode={mode} does not fit {run_dir}, trained on data.source={source}: "
            f"eval.mode={own} scores the data={own} models, and they take no other mode"
        )
    result = getattr(mode_module(mode), f"run_{mode}")(path, cfg, rt, out_dir)
    if mode == "length":
        log_wandb(cfg, ckpt_config, out_dir, result)
    return result


def output_folders(cfg, paths: list[Path]):
    """Check every folder the evaluation will write, before any scoring."""
    for p in paths:
        files.check_writable(
            checkpoint.checkpoint_path(p).parent / "eval", "checkpoint" if cfg.checkpoint else "sweep_dir"
        )
    if cfg.sweep_dir:
        files.check_writable(Path(cfg.sweep_dir) / "eval", "sweep_dir")


def evaluate_all(cfg, rt, paths: list[Path]) -> list[dict]:
    """Each run in turn; a stop (SIGTERM, Ctrl-C) keeps the runs done."""
    results, eta = [], Eta(len(paths))
    try:
        for p in paths:
            if "torch._dynamo" in sys.modules:  # loaded by a compile alone (importing it costs 2 s): else none to reset
                torch.compiler.reset()  # each model's compiled flex versions must not add up to the recompile cap
            which = f" (run {eta.done + 1} of {len(paths)})" if len(paths) > 1 else ""
            results.append(evaluate_one(p, cfg, rt, which))
            if len(paths) > 1:
                print(f"evaluated {eta.step('runs')}", flush=True)
    except runtime.Stopped as e:
        kept = f"the runs evaluated before it ({len(results)} of {len(paths)}) keep their results; " if results else ""
        runtime.say(f"stopped by {e.name}: {kept}the evaluation under way wrote nothing; run the command again")
        raise
    return results


def run(cfg: DictConfig, job_dir: Path | None = None):
    checks.preflight(cfg)  # every setting, and the checkpoints it names
    paths = checks.checkpoints(cfg)
    output_folders(cfg, paths)
    rt = runtime.setup(cfg.device, cfg.dtype, 0)
    results = evaluate_all(cfg, rt, paths)
    if cfg.sweep_dir:
        if cfg.eval.mode == "length" or cfg.eval.mode in OWN_DATA:
            table = mode_module("compare" if cfg.eval.mode == "length" else cfg.eval.mode)
            print(table.compare(results, Path(cfg.sweep_dir) / "eval"))
        return results
    result = results[0]
    if job_dir is not None and cfg.eval.mode == "length":  # a -m job: a copy for CompareCallback
        files.write_json(job_dir / "length.json", result, indent=None)
    return result


class CompareCallback(Callback):
    """After `python eval.py -m checkpoint=a,b,...`: compare every job's length.json (configs/eval.yaml)."""

    def on_multirun_end(self, config, **kwargs):
        sweep = Path(config.hydra.sweep.dir)
        results = [mode_module("report").read_result(p) for p in sorted(sweep.glob("*/length.json"))]
        if len(results) > 1:
            print(mode_module("compare").compare(results, sweep))
            print(f"comparison written to {sweep}/compare.{{json,txt,png}}")


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
def main(cfg: DictConfig):
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir) if hc.mode == RunMode.MULTIRUN else None
    with runtime.raising():  # stop at once, keeping the runs done
        cli(lambda: run(cfg, job_dir))


if __name__ == "__main__":
    hydra_cli(main)
