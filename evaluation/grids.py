"""Grid evaluation (data=grids): loss on held-out grids of the training size and larger, one table per sweep.

python eval.py checkpoint=out/rope2d eval.mode=grids                 -> out/rope2d/eval/grids.{json,txt}
python eval.py sweep_dir=runs/grids eval.mode=grids                  every run, and one table (seeds as mean, sd)
python eval.py checkpoint=out/mrope eval.mode=grids eval.grid_sizes=[[16,14],[16,62]]
No held-out grid starts with a first row a training grid of its width had (the first row fixes the whole grid).
Scored: every token after row 0 (row 0 is random: ln 2 a cell at best), walls included: mean NLL in nats (0 is
perfect) and cell accuracy, with a bootstrap over grids (and a seed group's runs).
"""

import time
from pathlib import Path

import numpy as np
import torch

from data import grids
from data.loader import select_axes
from evaluation import bootstrap, report
from evaluation.compare import group_runs
from utils import checkpoint
from utils.errors import UserError
from utils.progress import say


def default_sizes(data: dict) -> list[list[int]]:
    h, w = data["height"], data["width"]
    return [[h, w], [2 * h, w], [h, 2 * w], [2 * h, 2 * w]]


def training_first_rows(data: dict) -> set[bytes]:
    """The first rows of the training grids, regenerated from the data seed (the draws of data/grids.py)."""
    rng = np.random.default_rng([int(data["seed"]), 0])
    rows = (rng.random(data["width"]) < data["density"] for _ in range(int(data["train_docs"])))
    return {r.astype(np.uint8).tobytes() for r in rows}


def held_out_grids(data: dict, height: int, width: int, n: int, seed: int) -> np.ndarray:
    """(n, height, width) cells from random first rows not among the training grids' (at the training width)."""
    seen = training_first_rows(data) if width == data["width"] else set()
    if width == data["width"] and len(seen) >= 2**width - n:
        raise UserError(f"eval.grids={n}: too few first rows of width {width} are left unseen by training")
    rng = np.random.default_rng([seed, height, width])
    out = []
    while len(out) < n:
        first = (rng.random(width) < data["density"]).astype(np.uint8)
        if first.tobytes() not in seen:
            out.append(grids.evolve(first, height, data["rule"]))
    return np.stack(out)


@torch.no_grad()
def score_size(model, data: dict, height: int, width: int, n: int, seed: int, device, batch: int = 16) -> dict:
    """Per-grid summed NLL over the scored tokens, and the size's mean NLL and cell accuracy."""
    cells = held_out_grids(data, height, width, n, seed)
    docs = torch.from_numpy(np.stack([grids.tokens(c) for c in cells])).to(device)
    ids = select_axes(grids.positions(height, width), model.pe.axes)
    pos = None if ids is None else torch.from_numpy(ids[:, :-1]).to(device)
    row = width + 2
    scored = torch.arange(docs.size(1) - 1, device=device) >= row  # targets from row 1 on (target t is token t + 1)
    column = torch.arange(docs.size(1) - 1, device=device) % row  # of target t: 0 the left wall, width + 1 the right
    is_cell = scored & (column >= 1) & (column <= width)
    nll, correct, by_column = [], [], torch.zeros(row, dtype=torch.float64)
    for lo in range(0, n, batch):
        x, y = docs[lo : lo + batch, :-1], docs[lo : lo + batch, 1:]
        logits = model(x, pos=pos).float()
        token_nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none")
        nll.append((token_nll * scored).sum(dim=1).double().cpu())
        by_column.index_add_(0, column.cpu(), (token_nll * scored).sum(dim=0).double().cpu())
        correct.append(((logits.argmax(-1) == y) & is_cell).sum(dim=1).cpu())
    grid_nll, n_tokens, n_cells = torch.cat(nll).numpy(), int(scored.sum()), int(is_cell.sum())
    draws = bootstrap.resample(grid_nll[None], np.full(n, n_tokens), bootstrap.block_draws(n, [height, width, seed]))
    return {
        "size": [height, width],
        "tokens": docs.size(1) - 1,
        "nll": float(grid_nll.sum() / (n * n_tokens)),
        "ci": [round(x, 5) for x in bootstrap.interval(draws)],
        "cell_accuracy": float(torch.cat(correct).sum()) / (n * n_cells),
        "grid_nll": [round(float(x) / n_tokens, 6) for x in grid_nll],
        # mean NLL of the tokens in each column (0 the left wall, width + 1 the right): where a size goes wrong
        "nll_by_column": [round(float(x) / (n * (height - 1)), 5) for x in by_column],
        "scored_tokens": n_tokens,
    }


def run_grids(path, cfg, rt, out_dir: Path) -> dict:
    model, ckpt = checkpoint.load_model(path, rt.device)
    data = ckpt["config"]["data"]
    if data.get("source") != "grids":
        raise UserError(f"eval.mode=grids scores models trained on data=grids; {path} was trained on {data['name']}")
    ev, t0 = cfg.eval, time.time()
    sizes = [list(s) for s in ev.grid_sizes] if ev.grid_sizes is not None else default_sizes(data)
    rows = []
    for height, width in sizes:
        row = score_size(model, data, int(height), int(width), ev.grids, ev.seed, rt.device)
        rows.append(row)
        say(
            f"  {height} x {width} ({row['tokens']} tokens): nll {row['nll']:.4f} {row['ci']} "
            f"cells {row['cell_accuracy']:.3f}"
        )
    result = {
        "checkpoint": str(checkpoint.checkpoint_path(path)),
        "scheme": ckpt["model_config"]["positional"]["name"],
        "train_config": ckpt["config"],
        "train_size": [data["height"], data["width"]],
        "step": ckpt["step"],
        "grids": ev.grids,
        "seed": ev.seed,
        "device": str(rt.device),
        "seconds": round(time.time() - t0, 1),
        "results": rows,
    }
    text = table([result])
    report.write_result(out_dir, "grids", result, text=text)
    print(text)
    return result


def table(results: list[dict]) -> str:
    """A row per seed group: each size's mean NLL over its runs (± sd over seeds), 95% interval, cell accuracy."""
    if len({(r["seed"], r["grids"]) for r in results}) > 1:
        raise UserError("these grids.json were scored on different grids (eval.seed, eval.grids): score them alike")
    groups = group_runs(results)
    sizes = list(dict.fromkeys(tuple(r["size"]) for res in results for r in res["results"]))
    cells = {}  # (group, size) -> (mean nll, sd, interval, accuracy, draws)
    for gi, g in enumerate(groups):
        for size in sizes:
            runs = [next((r for r in res["results"] if tuple(r["size"]) == size), None) for res in g["runs"]]
            if any(r is None for r in runs):
                continue
            per_grid = np.array([r["grid_nll"] for r in runs]) * runs[0]["scored_tokens"]
            tokens = np.full(per_grid.shape[1], runs[0]["scored_tokens"])
            idx = bootstrap.block_draws(per_grid.shape[1], [list(size), g["runs"][0]["seed"]])
            draws = bootstrap.resample(per_grid, tokens, idx, run_key=[g["key"], list(size)])
            nlls = [r["nll"] for r in runs]
            sd = float(np.std(nlls, ddof=1)) if len(runs) > 1 else None
            acc = float(np.mean([r["cell_accuracy"] for r in runs]))
            cells[gi, size] = (float(np.mean(nlls)), sd, bootstrap.interval(draws), acc, draws)
    marks = {}
    for size in sizes:
        here = [gi for gi in range(len(groups)) if (gi, size) in cells]
        if len(here) < 2:
            continue
        best = min(here, key=lambda gi: cells[gi, size][0])
        marks[best, size] = "*"
        for gi in here:
            if gi != best:
                same = bootstrap.difference(cells[gi, size][4], cells[best, size][4])["within_noise"]
                marks[gi, size] = "~" if same else ""
    train = results[0]["train_size"]
    head = ["scheme", "seeds"] + [f"{h}x{w}" + (" (train)" if [h, w] == train else "") for h, w in sizes]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * len(sizes)]
    for gi, g in enumerate(groups):
        out = [g["label"], ",".join(str(s) for s in g["seeds"])]
        for size in sizes:
            if (gi, size) not in cells:
                out.append("n/a")
                continue
            nll, sd, (lo, hi), acc, _ = cells[gi, size]
            spread = f" ±{sd:.4f}" if sd is not None else ""
            out.append(f"{nll:.4f}{spread} [{lo:.4f}, {hi:.4f}] {acc:.1%}{marks.get((gi, size), '')}")
        lines.append("| " + " | ".join(out) + " |")
    legend = (
        "mean NLL (nats) per token after row 0 [95% bootstrap interval over grids and seeds], cell accuracy; "
        "*: lowest NLL in its column, ~: within noise of it (paired bootstrap), ±: sd over seeds"
    )
    return "\n".join(lines + [legend])


def compare(results: list[dict], out_dir: Path) -> str:
    text = table(results)
    report.write_result(out_dir, "grids", {"runs": [r["checkpoint"] for r in results]}, text=text)
    return text
