"""Perplexity at and far beyond the training length, as a table, a JSON file and a plot.

python eval.py checkpoint=out/rope                            lengths 0.5..16 x training length, two modes
python eval.py checkpoint=out/rope eval.rope_scaling=all      + linear, ntk, dynamic_ntk and yarn extension
python eval.py checkpoint=out/rope eval.rope_scaling=longrope eval.lengths=[256,1024]   factors searched beforehand
                                                              (python -m evaluation.longrope_search, its docstring)
python eval.py checkpoint=out/rope eval.rope_scaling=rerope   + ReRoPE (or leaky_rerope; eval.rerope_window, _leak)
python eval.py checkpoint=out/rope eval.rope_scaling=all eval.rerope=true   every training-free row in one table
python eval.py checkpoint=out/alibi eval.log_scaling=true     + a `log` row: logits x log_L n past L (any scheme)
python eval.py sweep_dir=multirun/2026-11-22_10-00-00         every run of a training sweep, one table
python eval.py -m checkpoint=out/rope,out/alibi,out/learned   likewise, as a Hydra multirun
python eval.py checkpoint=out/sink eval.mode=stream           streaming perplexity through sink caches
python eval.py checkpoint=out/rope-passkey-256 eval.mode=passkey   passkey retrieval by length and depth
python eval.py checkpoint=out/rope-passkey-256 eval.mode=passkey eval.rope_scaling=rerope   + under an extension
python eval.py sweep_dir=runs/grids eval.mode=grids            data=grids runs: loss on larger grids (grids.py)
Writes <run>/eval/length.{json,png} (or stream.*, passkey.*, passkey-<variant>.*); the length tables also go to the
run's wandb project.
"""

import json
import resource
import time
from functools import partial
from pathlib import Path

import hydra
import torch
import torch._dynamo
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from evaluation import bootstrap, compare, longrope, report
from evaluation.heldout import held_out_works
from evaluation.length import default_lengths, read_span, regions, score, scoring_pieces
from model.variant import AS_TRAINED, Variant
from positional import rerope
from positional.rope_scaling import KINDS, SEARCHED, Scaling, refusal
from utils import checkpoint, runtime, schema
from utils.errors import UserError, cli, hydra_cli
from utils.logger import start_wandb
from utils.progress import progress, say

LOG = "log"  # the variant row of eval.log_scaling
ALL = KINDS  # what eval.rope_scaling=all scores


def resolve_lengths(lengths, train_length: int) -> list[int]:
    if lengths is None:
        return default_lengths(train_length)
    return sorted({int(n) for n in lengths})  # positive and not empty: utils/schema.py Scoring


def resolve_variants(requested: str, pe, trained: str | None = None) -> list[str]:
    """The eval-time RoPE extensions to score. A model that was fine-tuned with positional.scaling has its
    frequencies built in: another scaling would replace them, not add to them, so it is refused, and `all` (as in a
    sweep) scores that model as it is."""
    if requested == "all":  # the closed-form kinds; with_searched adds a SEARCHED one where its search has been run
        if trained:
            say(f"note: trained with positional.scaling={trained}: scored as it is, with no eval-time scaling")
            return ["none"]
        return list(ALL) if pe.rotary else ["none"]
    if why := refusal("eval.rope_scaling", requested, pe, trained):
        raise UserError(why)
    return [requested]


def with_log_scaling(variants: list[str], requested: bool, ckpt: dict) -> list[str]:
    """The variants plus `log` (model/log_scaling.py: unscaled RoPE, logits x max(1, ln n / ln L)) when asked for:
    first, or right after `none`, before any RoPE variant, whose frequencies would otherwise linger into it. A model
    trained with model.ssmax already scales its logits by ln n: a second log factor is not scored."""
    if not requested:
        return variants
    if ckpt["model_config"].get("ssmax"):
        say("note: trained with model.ssmax=true (logits x s ln n): eval.log_scaling adds no row")
        return variants
    at = 1 if variants[0] == "none" else 0
    return [*variants[:at], LOG, *variants[at:]]


def peak_memory_mb(rt) -> float:
    if rt.device.type == "cuda":
        return torch.cuda.max_memory_allocated(rt.device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the process's peak so far (Linux: KiB)


def resolve_strides(stride: int | None, lengths: list[int]) -> dict[int, int]:
    """The sliding stride per length: eval.stride at every length, or by default half of each length."""
    if stride is None:
        return {n: max(1, n // 2) for n in lengths}
    if stride > lengths[0]:
        raise UserError(
            f"eval.stride={stride} is larger than the eval length {lengths[0]}; pass eval.stride<={lengths[0]}"
        )
    return dict.fromkeys(lengths, stride)


def scored_text(ckpt: dict, ev, max_len: int):
    """The pieces every cell scores (evaluation/length.py) and the regions of tokens they need."""
    works = held_out_works(ckpt, ev.prepare)
    pieces = scoring_pieces(works, max_len, ev.tokens)
    if not pieces:
        longest = max(len(d) - 1 for _, d in works)
        raise UserError(
            f"eval length {max_len} is longer than every held-out document (the longest has "
            f"{longest} tokens); ask for shorter eval.lengths"
        )
    if len(pieces) * max_len < ev.tokens:  # never fewer than asked without saying so
        say(
            f"note: eval.tokens={ev.tokens} is more than the held-out works hold in whole {max_len}-token pieces; "
            f"scoring {len(pieces) * max_len:,}"
        )
    return pieces, regions(works, pieces, max_len)


def with_searched(variants: list[str], requested: str, path, factors: list[float]) -> list[str]:
    """`all` also scores each SEARCHED kind whose search has been run for every factor past 1 here (its files are
    beside the checkpoint); one not searched yet is left out with a note, as it is for a scheme with no rotation."""
    if requested != "all" or "linear" not in variants:  # not rotary, or a fine-tune's scaling is built in
        return variants
    run_dir, past = checkpoint.checkpoint_path(path).parent, [f for f in factors if f > 1]
    missing = [f for f in past if not (run_dir / longrope.file_name(f)).exists()]
    if missing:
        say(f"note: eval.rope_scaling=all leaves out {', '.join(SEARCHED)}: not searched for x{missing[0]:g} here")
        return variants
    return variants + list(SEARCHED)


def with_rerope(variants: list[str], requested: bool, pe, trained: str | None) -> list[str]:
    """The variants plus rerope and leaky_rerope when asked for (eval.rerope=true): `all` leaves them out for their
    cost, and this puts a rotary model's whole training-free table in one run. A model they cannot apply to (no
    rotation, or a scaling built in by a fine-tune) gets a note and no rows, as `all` gives it no scaling rows."""
    if not requested:
        return variants
    if trained or not pe.rotary:
        why = f"trained with positional.scaling={trained}" if trained else f"{pe.name} has no rotation"
        say(f"note: eval.rerope=true adds no rows: {why}")
        return variants
    return variants + [k for k in rerope.KINDS if k not in variants]


def searched_scalings(path, pe, variants, lengths, factor_of, train_length: int) -> dict:
    """{(variant, length): its search record} for the SEARCHED variants past the training length, read from the
    files their search wrote beside the checkpoint (evaluation/longrope.py), all before any scoring: a missing or
    mismatched file stops the run at once, with the command that makes it."""
    run_dir, out = checkpoint.checkpoint_path(path).parent, {}
    for variant in (v for v in variants if v in SEARCHED):
        for length in (n for n in lengths if factor_of(n) > 1):
            record = longrope.load(run_dir, factor_of(length), train_length)
            try:
                pe.rotation(torch.zeros(1, dtype=torch.long), longrope.scaling(record))  # its factors fit this model
            except ValueError as e:
                raise UserError(f"{run_dir / longrope.file_name(factor_of(length))}: {e}") from None
            out[variant, length] = record
    return out


def note_search_overlap(searched: dict, pieces, max_len: int):
    """Say so when the text a search scored its candidates on is part of what this table reads (another
    eval.lengths or eval.tokens than the search kept clear of): those cells are then not independent of it."""
    spans = {}
    for p in pieces:
        spans.setdefault(p.work, []).append(read_span(p, max_len))
    for (variant, length), record in searched.items():
        if n := longrope.overlap(record.get("windows", []), spans):
            say(
                f"note: {variant} at {length}: {n:,} tokens of its search windows are read here too; search again "
                f"with this eval.lengths and eval.tokens for a table the search never saw"
            )


def plan_variants(path, ev, model, ckpt: dict, lengths: list[int]):
    """The variants to score (eval.rope_scaling, eval.log_scaling, eval.rerope), the SEARCHED ones' records, and
    at(variant, length) -> (the Variant value a cell passes into the forward, what its row records of it: ReRoPE's
    w and k). A fine-tuned model's built-in scaling is what `none` scores; resolve_variants allows no other."""
    pe, train_length = model.pe, ckpt["seq_len"]
    trained = report.trained_scaling(ckpt["model_config"])
    variants = with_log_scaling(resolve_variants(ev.rope_scaling, pe, trained), ev.log_scaling, ckpt)

    def factor_of(length: int) -> float:
        return length / train_length if ev.rope_factor == "auto" else float(ev.rope_factor)

    variants = with_searched(variants, ev.rope_scaling, path, [factor_of(n) for n in lengths])
    variants = with_rerope(variants, ev.rerope, pe, trained)
    searched = searched_scalings(path, pe, variants, lengths, factor_of, train_length)
    leak = None if ev.rerope_leak == "auto" else ev.rerope_leak

    def at(variant: str, length: int) -> tuple[Variant, dict]:
        if variant == "none":
            return AS_TRAINED, {}
        if variant == LOG:
            return Variant(log_length=train_length), {}
        if (variant, length) in searched:
            return Variant(longrope.scaling(searched[variant, length])), {}
        far = {"window": ev.rerope_window, "leak": leak} if variant in rerope.KINDS else {}
        scaling = Scaling(variant, factor_of(length), train_length, **far)
        row = {}
        if scaling.far:  # this cell's w and k (positional/rerope.py); rerope's k = inf is recorded as null
            row = {"window": scaling.window, "leak": None if variant == "rerope" else round(scaling.leak, 4)}
        return Variant(scaling), row

    return variants, searched, at


def evaluate_lengths(path, cfg, rt) -> dict:
    model, ckpt = checkpoint.load_model(path, rt.device)
    pe, train_length = model.pe, ckpt["seq_len"]
    ev = cfg.eval
    lengths = resolve_lengths(ev.lengths, train_length)
    strides = resolve_strides(ev.stride, lengths)
    name = report.scheme_label(ckpt)
    variants, searched, at = plan_variants(path, ev, model, ckpt, lengths)
    pieces, regs = scored_text(ckpt, ev, lengths[-1])
    note_search_overlap(searched, pieces, lengths[-1])
    draws = bootstrap.block_draws(len(pieces), [[p.work, p.start, p.size] for p in pieces])
    rows, by_position, t0 = [], {}, time.time()
    cells = [(v, n, m) for v in variants for n in lengths for m in ("nonoverlap", "sliding")]
    for variant, length, mode in progress(cells, "length eval", unit="cell"):
        row = {"scheme": name, "variant": variant, "length": length, "mode": mode}
        if mode == "sliding":
            row["stride"] = strides[length]
        if pe.max_positions is not None and length > pe.max_positions:
            note = f"n/a: learned table covers {pe.max_positions} positions"
            rows.append({**row, "ppl": None, "nll": None, "tokens": 0, "note": note})
            continue
        value, setting = at(variant, length)
        row.update(setting)
        t = time.time()
        cell = score(model, regs, length, mode, strides[length], ev.batch_tokens, rt, value)
        ci = bootstrap.ppl_interval(bootstrap.resample(cell.piece_nll, cell.piece_tokens, draws))
        rows.append(
            {
                **row,
                "ppl": cell.ppl,
                "nll": cell.nll,
                "ci": ci,
                "tokens": cell.tokens,
                "piece_nll": [round(float(x), 6) for x in cell.piece_nll / cell.piece_tokens],
                "seconds": round(time.time() - t, 2),
                "peak_memory_mb": round(peak_memory_mb(rt), 1),
            }
        )
        if mode == "nonoverlap":
            by_position.setdefault(variant, {})[str(length)] = report.binned(cell.by_position, cell.position_count)
        say(
            f"  {variant:>11} {mode:>10} {length:>6}: ppl {cell.ppl:9.2f} [{ci[0]:.2f}, {ci[1]:.2f}] on "
            f"{cell.tokens:,} tokens ({time.time() - t:.1f} s)"
        )
    return {
        "checkpoint": str(checkpoint.checkpoint_path(path)),
        "scheme": name,
        "positional": ckpt["model_config"]["positional"],
        "train_config": ckpt["config"],
        "train_length": train_length,
        "step": ckpt["step"],
        "stride": ev.stride if ev.stride is not None else "L/2",
        "lengths": lengths,
        "pieces": [{"work": p.work, "start": p.start, "tokens": p.size} for p in pieces],
        "works": list(dict.fromkeys(p.work for p in pieces)),
        "device": str(rt.device),
        "dtype": str(rt.dtype),
        "seconds": round(time.time() - t0, 1),
        "results": rows,
        "nll_by_position": by_position,
    }


def write_length_report(result: dict, out_dir: Path) -> str:
    title = (
        f"{result['scheme']} @ step {result['step']}, trained at {result['train_length']} tokens "
        f"(sliding stride {result['stride']}): perplexity by evaluation length"
    )
    text = report.table(result["results"], result["lengths"], title)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "length.json").write_text(json.dumps(result, indent=1))
    first = next(iter(result["nll_by_position"].values()), None)
    report.plot(result["results"], result["train_length"], out_dir / "length.png", result["scheme"], first)
    return text


def log_wandb(cfg, ckpt_config: dict, run_dir: Path, out_dir: Path, result: dict, image: Path, kind: str):
    if not cfg.logger.wandb:
        return
    import wandb

    run = start_wandb(
        ckpt_config["logger"]["project"],
        out_dir,
        {"eval": schema.plain(cfg.eval), "train": ckpt_config},
        cfg.logger.mode,
        name=f"eval-{kind}-{run_dir.name}",
        job_type="eval",
    )
    if run is None:
        return
    rows = result["results"]
    columns = sorted({k for r in rows for k in r} - {"piece_nll"})  # the bootstrap's inputs stay in length.json
    cell = lambda v: str(v) if isinstance(v, list) else v  # an interval as one table cell
    run.log(
        {
            f"{kind}/table": wandb.Table(columns=columns, data=[[cell(r.get(c)) for c in columns] for r in rows]),
            f"{kind}/plot": wandb.Image(str(image)),
        }
    )
    run.summary.update({f"{kind}/{r.get('variant', '')}/{r['mode']}/{r.get('length', '')}": r.get("ppl") for r in rows})
    run.finish()


def evaluate_passkey(path, cfg, rt, out_dir: Path) -> dict:
    """Passkey accuracy for every variant eval.rope_scaling, eval.log_scaling and eval.rerope ask for, each in its
    own passkey[-<variant>].json and .png: a training-free extension is scored by retrieval as by perplexity.
    Returns the first variant's result (the model as trained, unless eval.rope_scaling names one kind)."""
    from evaluation.passkey import run_passkey

    model, ckpt = checkpoint.load_model(path, rt.device)
    lengths = resolve_lengths(cfg.eval.lengths, ckpt["seq_len"])
    variants, _, at = plan_variants(path, cfg.eval, model, ckpt, lengths)
    results = [run_passkey(model, ckpt, path, cfg.eval, rt, out_dir, lengths, v, partial(at, v)) for v in variants]
    return results[0]


def evaluate_one(path, cfg, rt) -> dict:
    run_dir = checkpoint.checkpoint_path(path).parent
    out_dir = run_dir / "eval"
    print(f"evaluating {run_dir}", flush=True)
    source = checkpoint.load(path, mmap=True)["config"]["data"].get("source")
    if (source == "grids") != (cfg.eval.mode == "grids"):
        raise UserError(
            f"eval.mode={cfg.eval.mode} does not fit {run_dir}, trained on data.source={source}: "
            f"eval.mode=grids scores the data=grids models, and they take no other mode"
        )
    if cfg.eval.mode == "grids":
        from evaluation.grids import run_grids

        return run_grids(path, cfg, rt, out_dir)
    if cfg.eval.mode == "stream":
        from evaluation.stream import run_stream

        return run_stream(path, cfg, rt, out_dir)
    if cfg.eval.mode == "passkey":
        return evaluate_passkey(path, cfg, rt, out_dir)
    result = evaluate_lengths(path, cfg, rt)
    print(write_length_report(result, out_dir))
    print(f"written {out_dir}/length.json and length.png ({result['seconds']} s)")
    ckpt_config = checkpoint.load(path, mmap=True)["config"]
    log_wandb(cfg, ckpt_config, run_dir, out_dir, result, out_dir / "length.png", "length")
    return result


def run(cfg: DictConfig, job_dir: Path | None = None):
    schema.check(cfg)
    rt = runtime.setup(cfg.device, cfg.dtype, 0)
    if cfg.sweep_dir:
        found = sorted(Path(cfg.sweep_dir).glob("*/" + checkpoint.NAME))
        if not found:
            raise UserError(
                f"no */{checkpoint.NAME} under sweep_dir={cfg.sweep_dir}; point it at a training sweep folder"
            )
        results = []
        for p in found:
            torch._dynamo.reset()  # each model's compiled flex versions are its own: never add up to the cap
            results.append(evaluate_one(p, cfg, rt))
        if cfg.eval.mode == "length":
            print(compare.compare(results, Path(cfg.sweep_dir) / "eval"))
        if cfg.eval.mode == "grids":
            from evaluation.grids import compare as compare_grids

            print(compare_grids(results, Path(cfg.sweep_dir) / "eval"))
        return results
    if not cfg.checkpoint:
        raise UserError("pass checkpoint=<run folder or ckpt.pt> (or sweep_dir=<training sweep folder>)")
    result = evaluate_one(cfg.checkpoint, cfg, rt)
    if job_dir is not None and cfg.eval.mode == "length":  # a -m job: leave a copy for the comparison callback
        (job_dir / "length.json").write_text(json.dumps(result))
    return result


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
def main(cfg: DictConfig):
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir) if hc.mode == RunMode.MULTIRUN else None
    cli(lambda: run(cfg, job_dir))


if __name__ == "__main__":
    hydra_cli(main)
