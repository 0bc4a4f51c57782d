"""eval.mode=tasks: exact-match accuracy per task and length, for models trained on data=tasks (trained short).

python eval.py checkpoint=out/tasks-rope eval.mode=tasks                 -> out/tasks-rope/eval/tasks.{json,txt,png}
python eval.py sweep_dir=multirun/tasks eval.mode=tasks                  every run, and a heatmap per task
For each task the checkpoint trained on and each of its test lengths (data/tasks.py TASKS: to 4x and 8x the longest
training length), eval.trials held-out samples drawn from a generator seeded by (eval.seed, task, n), which never
meets the training seeds. A sample is right when every scored token (its answer and the closing '.') is the most
likely one given the true prefix: greedy decoding of the answer, teacher-forced, as passkey mode scores its key.
Accuracy carries a Wilson 95% interval over the trials; a sweep pools a seed group's trials (mean and sd over seeds
beside it) and keeps each sample's right/wrong, so two groups scored on the same samples compare pairwise.
A model trained with random positions (positional.random_positions=L, Ruoss et al. 2023) is scored at sorted random
positions from range(L), one draw per batch, as it was trained (their released code draws at test time too); a
length whose samples need more than L positions, or more than a learned table holds, is n/a.
"""

import time
import zlib
from pathlib import Path

import numpy as np
import torch

from data import tasks
from evaluation import plots, report
from evaluation.bootstrap import wilson
from evaluation.compare import group_runs
from utils import checkpoint, files
from utils.errors import UserError, cli
from utils.progress import progress, say

BATCH = 32  # samples per forward


def random_positions(model_config: dict) -> int | None:
    return model_config["positional"].get("random_positions")


def positions(n_tokens: int, limit: int | None, rng: np.random.Generator, device) -> torch.Tensor | None:
    """The positions a batch of n_tokens is scored at: 0..n-1 (None), or a sorted random subset of range(limit)."""
    if limit is None:
        return None
    return torch.from_numpy(np.sort(rng.choice(limit, size=n_tokens, replace=False))).to(device)


@torch.no_grad()
def score(model, samples: list[np.ndarray], limit: int | None, rng, device) -> np.ndarray:
    """1 or 0 per sample: are all its scored tokens the argmax at their positions (teacher-forced)."""
    right = np.zeros(len(samples), dtype=np.int64)
    for lo in range(0, len(samples), BATCH):
        chunk = samples[lo : lo + BATCH]
        width = max(len(s) for s in chunk)
        rows = np.full((len(chunk), width), tasks.PAD, dtype=np.int64)
        for i, s in enumerate(chunk):
            rows[i, : len(s)] = s
        x = torch.from_numpy(rows[:, :-1]).to(device)
        guess = model(x, pos=positions(width - 1, limit, rng, device)).argmax(-1).cpu().numpy()
        for i, s in enumerate(chunk):
            span = tasks.answer_span(s)  # the scored tokens; token t is predicted at position t - 1
            right[lo + i] = np.array_equal(guess[i, span.start - 1 : span.stop - 1], s[span])
    return right


def cell(model, ckpt: dict, task: str, n: int, ev, device) -> dict:
    """One (task, length) cell: accuracy and its interval, or n/a with why."""
    samples = tasks.held_out(task, n, ev.trials, ev.seed)
    longest, limit = max(len(s) for s in samples) - 1, random_positions(ckpt["model_config"])
    row = {"task": task, "n": n, "tokens": longest}
    table = model.pe.max_positions
    if table is not None and longest > table or limit is not None and longest > limit:
        why = f"learned table covers {table}" if table is not None and longest > table else f"random range {limit}"
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
            r = rows[-1]
            shown = "n/a" if r["accuracy"] is None else f"{r['accuracy']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
            say(f"  {task:>8} n={n:<4} ({r['tokens']} tokens): {shown}")
    result = {
        "checkpoint": str(checkpoint.checkpoint_path(path)),
        "scheme": report.scheme_label(ckpt) + ("+random" if random_positions(ckpt["model_config"]) else ""),
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


def cells(results: list[dict]) -> dict:
    """{task: {label: {n: (accuracy, sd or None, [lo, hi], trials) or None}}}: a seed group's trials pooled. Runs
    are grouped within each task set (data.tasks) apart, so a battery of one run per task labels its groups by
    scheme, as a battery of mixtures does; where two task sets trained one task, the label names its set."""
    by_set = {}
    for res in results:
        by_set.setdefault(tuple(res["train_config"]["data"]["tasks"]), []).append(res)
    sets_of = {task: [s for s in by_set if task in s] for s in by_set for task in s}
    out = {}
    for task_set, members in by_set.items():
        for g in group_runs(members):
            runs = [{(r["task"], r["n"]): r for r in res["results"]} for res in g["runs"]]
            for task, n in runs[0]:
                label = g["label"] if len(sets_of[task]) == 1 else f"{g['label']} [data.tasks={','.join(task_set)}]"
                out.setdefault(task, {}).setdefault(label, {})[n] = pooled([run.get((task, n)) for run in runs])
    return out


def pooled(rs: list) -> tuple | None:
    """One cell of a seed group: its runs' trials pooled, the sd of their accuracies, a Wilson interval."""
    if any(r is None or r["accuracy"] is None for r in rs):
        return None
    k, trials = sum(r["correct"] for r in rs), sum(r["trials"] for r in rs)
    sd = float(np.std([r["accuracy"] for r in rs], ddof=1)) if len(rs) > 1 else None
    return (k / trials, sd, [round(x, 4) for x in wilson(k, trials)], trials)


def table(results: list[dict]) -> str:
    """Per task, a row per seed group and a column per length: accuracy ±sd over seeds [Wilson 95% interval]."""
    lines = []
    for task, groups in cells(results).items():
        lengths = sorted({n for by_n in groups.values() for n in by_n})
        train = next((r["train"][task] for r in results if task in r["train"]), None)
        lines += ["", f"{task} (trained on n in {train[0]}..{train[1]})" if train else task]
        lines += ["| scheme | " + " | ".join(f"n={n}" for n in lengths) + " |", "| --- |" + " ---: |" * len(lengths)]
        for label, by_n in groups.items():
            shown = []
            for n in lengths:
                c = by_n.get(n)
                sd = "" if c is None or c[1] is None else f" ±{c[1]:.2f}"
                shown.append("n/a" if c is None else f"{c[0]:.2f}{sd} [{c[2][0]:.2f}, {c[2][1]:.2f}]")
            lines.append(f"| {label} | " + " | ".join(shown) + " |")
    lines.append("exact-match accuracy; [lo, hi]: Wilson 95% interval over the trials (a seed group's pooled); ±: sd "
                 "over seeds")  # fmt: skip
    return "\n".join(lines).lstrip()


def compare(results: list[dict], out_dir: Path) -> str:
    """A sweep's runs: the table, tasks.json (every run's rows) and one heatmap per task (scheme x length)."""
    text = table(results)
    summary = {"runs": [r["checkpoint"] for r in results], "cells": cells(results)}
    report.write_result(out_dir, "tasks", summary, lambda path: plots.plot_tasks(summary["cells"], path), text)
    return text


def write_report(folder: Path) -> str:
    """<folder>/REPORT.md and <folder>/eval/tasks.{json,txt,png} from the runs' stored eval/tasks.json: the battery's
    tables without scoring anything again (runs/tasks.sh ends with it)."""
    found = sorted(p for p in folder.rglob("eval/tasks.json") if p.parent.parent != folder)  # not the summary
    if not found:
        raise UserError(f"no eval/tasks.json under {folder}; run python eval.py checkpoint=<run> eval.mode=tasks")
    results = [report.read_result(p) for p in found]
    text = compare(results, folder / "eval")
    lines = [
        f"# Length generalization on tasks: {len(results)} runs",
        "",
        f"`python -m evaluation.tasks {folder}` wrote this from each run's eval/tasks.json (`python eval.py "
        f"checkpoint=<run> eval.mode=tasks`: {results[0]['trials']} held-out samples per cell, seed "
        f"{results[0]['seed']}).",
        "",
        text,
        "",
        "![exact-match accuracy by task, scheme and length](eval/tasks.png)",
    ]
    files.write_text(folder / "REPORT.md", "\n".join(lines) + "\n")
    return text


if __name__ == "__main__":
    import sys

    print(cli(lambda: write_report(Path(sys.argv[1] if len(sys.argv) > 1 else "tasks"))))
