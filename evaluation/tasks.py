"""eval.mode=tasks: exact-match accuracy per task and length, for models trained on data=tasks (trained short).

python eval.py checkpoint=out/tasks-rope eval.mode=tasks                 -> out/tasks-rope/eval/tasks.{json,txt,png}
python eval.py sweep_dir=multirun/tasks eval.mode=tasks                  every run, and a heatmap per task
python -m evaluation.tasks tasks                                         tasks/REPORT.md from the runs' tasks.json
A sample is right when every scored token (its answer and the closing '.') is the argmax given the true prefix:
greedy decoding, teacher-forced. A seed group's 95% interval is a bootstrap over the samples and the runs (samples
scored by several seeds' models are not independent trials), at least the Wilson interval over the distinct samples.
A model trained with random positions (data.random_positions=L, Ruoss et al. 2023) is scored at sorted random
positions from range(L), one draw per batch, as their released code does.
"""

import json
import time
import zlib
from itertools import combinations
from pathlib import Path

import numpy as np
import torch

from data import tasks
from evaluation import bootstrap, plots, report
from evaluation.bootstrap import wilson
from evaluation.compare import group_runs
from evaluation.report import markdown
from utils import checkpoint, files
from utils.errors import UserError, cli
from utils.progress import progress, say

BATCH = 32  # samples per forward


def random_positions(ckpt: dict) -> int | None:
    """data.random_positions of the run (a checkpoint older than that key has it among its scheme's options)."""
    old = ckpt["model_config"]["positional"].get("random_positions")
    return ckpt["config"]["data"].get("random_positions", old)


def positions(n_tokens: int, limit: int | None, rng: np.random.Generator, device) -> torch.Tensor | None:
    """0..n-1 (None), or a sorted random subset of range(limit)."""
    return None if limit is None else torch.from_numpy(np.sort(rng.choice(limit, n_tokens, replace=False))).to(device)


@torch.no_grad()
def score(model, samples: list[np.ndarray], limit: int | None, rng, device) -> np.ndarray:
    """1 or 0 per sample: are all its scored tokens the argmax at their positions (teacher-forced)."""
    right = np.zeros(len(samples), dtype=np.int64)
    for lo in range(0, len(samples), BATCH):
        chunk = samples[lo : lo + BATCH]
        width = max(len(s) for s in chunk)
        rows = np.stack([np.pad(s, (0, width - len(s)), constant_values=tasks.PAD) for s in chunk]).astype(np.int64)
        x = torch.from_numpy(rows[:, :-1]).to(device)
        guess = model(x, pos=positions(width - 1, limit, rng, device)).argmax(-1).cpu().numpy()
        for i, s in enumerate(chunk):
            span = tasks.answer_span(s)  # the scored tokens; token t is predicted at position t - 1
            right[lo + i] = np.array_equal(guess[i, span.start - 1 : span.stop - 1], s[span])
    return right


def cell(model, ckpt: dict, task: str, n: int, ev, device) -> dict:
    """One (task, length) cell: accuracy and its interval, or n/a with why."""
    samples = tasks.held_out(task, n, ev.trials, ev.seed)
    longest, limit, table = max(len(s) for s in samples) - 1, random_positions(ckpt), model.pe.max_positions
    row = {"task": task, "n": n, "tokens": longest}
    for cap, why in ((table, f"learned table covers {table}"), (limit, f"random range {limit}")):
        if cap is not None and longest > cap:
            return {**row, "accuracy": None, "trials": 0, "note": f"n/a: {why} positions, a sample needs {longest}"}
    rng = np.random.default_rng([ev.seed, n, zlib.crc32(task.encode())])  # the positions' draws, per cell
    right = score(model, samples, limit, rng, device)
    k = int(right.sum())
    ci = [round(x, 4) for x in wilson(k, len(right))]
    return {**row, "accuracy": k / len(right), "correct": k, "trials": len(right), "ci": ci, "right": right.tolist()}


def run_tasks(path, cfg, rt, out_dir: Path) -> dict:
    """eval.mode=tasks: every test length of every task the checkpoint trained on; tasks.{json,txt,png}."""
    model, ckpt = checkpoint.load_model(path, rt.device)
    data, t0, rows = ckpt["config"]["data"], time.time(), []
    for task in progress(data["tasks"], "tasks", unit="task"):
        for n in tasks.TASKS[task].test:
            rows.append(cell(model, ckpt, task, n, cfg.eval, rt.device))
            say(f"  {task:>8} n={n:<4} ({rows[-1]['tokens']} tokens): {shown(rows[-1])}")
    result = {
        "checkpoint": str(checkpoint.checkpoint_path(path)),
        "scheme": report.scheme_label(ckpt) + ("+random" if random_positions(ckpt) else ""),
        "train_config": ckpt["config"],
        "step": ckpt["step"],
        "train": {t: list(tasks.TASKS[t].train) for t in data["tasks"]},
        "trials": cfg.eval.trials,
        "seed": cfg.eval.seed,
        "device": str(rt.device),
        "seconds": round(time.time() - t0, 1),
        "results": rows,
    }
    text = table([result])
    print(text)
    report.write_result(out_dir, "tasks", result, lambda path: plots.plot_tasks(cells([result]), path), text)
    return result


def by_length(res: dict, task: str) -> dict:
    """{n: row} of one run's task, each row with the key of the samples it scored (its draw)."""
    return {
        r["n"]: {**r, "draw": [res["seed"], task, r["n"], r["trials"]]} for r in res["results"] if r["task"] == task
    }


def seed_groups(results: list[dict]) -> dict:
    """{task: {label: [each run's {n: row}]}}, grouped within each task set (data.tasks): where two task sets trained
    one task, the label names its set."""
    by_set = {}
    for res in results:
        by_set.setdefault(tuple(res["train_config"]["data"]["tasks"]), []).append(res)
    sets_of = {task: [s for s in by_set if task in s] for s in by_set for task in s}
    out = {}
    for task_set, members in by_set.items():
        for g in group_runs(members):
            for task in g["runs"][0]["train"]:
                label = g["label"] if len(sets_of[task]) == 1 else f"{g['label']} [data.tasks={','.join(task_set)}]"
                out.setdefault(task, {})[label] = [by_length(res, task) for res in g["runs"]]
    return out


def accuracy_draws(rows: list[dict], key) -> np.ndarray:
    """Bootstrap draws of a seed group's accuracy: each run's samples resampled (the same indices for the same samples,
    so groups pair), then the runs. Where each seed scored its own samples, every group picks the same seeds in a
    draw, so that its samples still pair with another group's."""
    rows = sorted(rows, key=lambda r: r["draw"][0])
    per_run = [np.array(r["right"])[bootstrap.block_draws(r["trials"], r["draw"])].mean(axis=1) for r in rows]
    seeds = [r["draw"][0] for r in rows]
    return bootstrap.pick_runs(np.array(per_run), [seeds, *key[1:]] if len(set(seeds)) > 1 else key)


def group_cell(rows: list, key) -> tuple[dict | None, np.ndarray | None]:
    """A seed group's cell and its draws: the mean accuracy, each run's, their sd, and a 95% interval: one run's Wilson
    interval, or the bootstrap's over samples and seeds widened to the Wilson interval over the distinct samples (a cell
    right or wrong on every sample has no bootstrap spread)."""
    if any(r is None or r["accuracy"] is None for r in rows):
        return None, None
    seeds, draws = [r["accuracy"] for r in rows], accuracy_draws(rows, key)
    accuracy, ci, sd = float(np.mean(seeds)), rows[0]["ci"], None
    samples = sum(r["trials"] for r in {json.dumps(r["draw"]): r for r in rows}.values())
    if len(rows) > 1:
        boot, sample_only = bootstrap.interval(draws), wilson(accuracy * samples, samples)
        ci = [round(min(boot[0], sample_only[0]), 4), round(max(boot[1], sample_only[1]), 4)]
        sd = float(np.std(seeds, ddof=1))
    trials = sum(r["trials"] for r in rows)
    return {"accuracy": accuracy, "seeds": seeds, "sd": sd, "ci": ci, "samples": samples, "trials": trials}, draws


def difference(a: tuple[dict, np.ndarray], b: tuple[dict, np.ndarray]) -> dict:
    """Accuracy a - b of two (cell, draws) and the 95% interval of its draws; within noise when that holds 0."""
    lo, hi = bootstrap.interval(a[1] - b[1])
    diff, lo, hi = (round(x, 4) + 0.0 for x in (a[0]["accuracy"] - b[0]["accuracy"], lo, hi))  # + 0.0: never -0.0
    return {"diff": diff, "lo": lo, "hi": hi, "within_noise": lo <= 0 <= hi}


def summary(results: list[dict]) -> dict:
    """{"cells", "pairs"}: every seed group's cell and the paired difference of every two groups in every column; `*`
    marks a column's highest accuracy (above 0), `~` a cell whose difference from it holds 0."""
    cells, pairs = {}, []
    for task, groups in seed_groups(results).items():
        lengths = sorted({n for runs in groups.values() for run in runs for n in run})
        cells[task] = {label: {} for label in groups}
        for n in lengths:
            column = {}
            for label, runs in groups.items():
                cell, draws = group_cell([run.get(n) for run in runs], [label, task, n])
                cells[task][label][n] = cell
                if cell is not None:
                    column[label] = (cell, draws)
            for a, b in combinations(column, 2):
                pairs.append({"a": a, "b": b, "task": task, "n": n, **difference(column[a], column[b])})
            top = max((cell["accuracy"] for cell, _ in column.values()), default=0)
            best = next((label for label, (cell, _) in column.items() if cell["accuracy"] == top), None)
            for cell, draws in column.values():
                within = top > 0 and difference((cell, draws), column[best])["within_noise"]
                cell["mark"] = "*" if top > 0 and cell["accuracy"] == top else "~" if within else ""
    return {"cells": cells, "pairs": pairs}


def cells(results: list[dict]) -> dict:
    """{task: {label: {n: cell or None}}}"""
    return summary(results)["cells"]


def shown(c: dict | None) -> str:
    """A run's or a seed group's cell: accuracy, mark, ±sd over seeds, [95% interval]; n/a."""
    if c is None or c["accuracy"] is None:
        return "n/a"
    sd = "" if c.get("sd") is None else f" ±{c['sd']:.2f}"
    return f"{c['accuracy']:.2f}{c.get('mark', '')}{sd} [{c['ci'][0]:.2f}, {c['ci'][1]:.2f}]"


def table(results: list[dict], by_task: dict | None = None) -> str:
    """Per task, a row per seed group, a column per length."""
    lines = []
    for task, groups in (cells(results) if by_task is None else by_task).items():
        lengths = sorted({n for by_n in groups.values() for n in by_n})
        train = next((r["train"][task] for r in results if task in r["train"]), None)
        body = [[label] + [shown(by_n.get(n)) for n in lengths] for label, by_n in groups.items()]
        lines += ["", f"{task} (trained on n in {train[0]}..{train[1]})" if train else task]
        lines.append(markdown(["scheme"] + [f"n={n}" for n in lengths], body))
    lines.append(LEGEND)
    return "\n".join(lines).lstrip()


LEGEND = (
    "exact-match accuracy, the mean over a seed group's runs; ±: sd over seeds; [lo, hi]: 95% interval over the "
    "held-out samples and the seeds (a bootstrap that resamples both, at least the Wilson interval over the distinct "
    "samples); *: highest in its column; ~: no difference from it detected (the 95% interval of the paired bootstrap "
    "difference, the same samples drawn for both, holds 0)"
)


def compare(results: list[dict], out_dir: Path) -> str:
    """A sweep's runs: the table, tasks.json (every run's rows) and one heatmap per task (scheme x length)."""
    result = {"runs": [r["checkpoint"] for r in results], **summary(results)}
    text = table(results, result["cells"])
    report.write_result(out_dir, "tasks", result, lambda path: plots.plot_tasks(result["cells"], path), text)
    return text


def rests_on(results: list[dict]) -> str:
    """What a cell of these runs rests on: seeds per group, samples per run and whose samples they are."""
    seeds = sorted({len(runs) for groups in seed_groups(results).values() for runs in groups.values()})
    trials, draws = sorted({r["trials"] for r in results}), sorted({r["seed"] for r in results})
    shared = f"the same samples (eval.seed={draws[0]}) for every run"
    shared = shared if len(draws) == 1 else "samples drawn with eval.seed " + ", ".join(map(str, draws))
    seeds = f"{'-'.join(map(str, seeds))} seed{'s' * (seeds[-1] > 1)}"
    return f"A cell rests on {seeds} x {', '.join(map(str, trials))} held-out samples, {shared}."


def write_report(folder: Path) -> str:
    """<folder>/REPORT.md and eval/tasks.{json,txt,png} from the runs' stored eval/tasks.json, scoring nothing again."""
    found = sorted(p for p in folder.rglob("eval/tasks.json") if p.parent.parent != folder)  # not the summary
    if not found:
        raise UserError(f"no eval/tasks.json under {folder}; run python eval.py checkpoint=<run> eval.mode=tasks")
    results = [report.read_result(p) for p in found]
    text = compare(results, folder / "eval")
    lines = [
        f"# Length generalization on tasks: {len(results)} runs",
        "",
        f"`python -m evaluation.tasks {folder}` wrote this from each run's eval/tasks.json (`python eval.py "
        f"checkpoint=<run> eval.mode=tasks`). {rests_on(results)} `eval/tasks.json` holds every cell (`cells`: "
        "each seed's accuracy too) and the paired difference of every two groups in every column (`pairs`).",
        "",
        *report.made_by(folder),
        text,
        "",
        "![exact-match accuracy by task, scheme and length](eval/tasks.png)",
    ]
    files.write_text(folder / "REPORT.md", "\n".join(lines) + "\n")
    return text


if __name__ == "__main__":
    import sys

    print(cli(lambda: write_report(Path(sys.argv[1] if len(sys.argv) > 1 else "tasks"))))
