"""eval.mode=grids: loss on held-out grids (data=grids) of the training size and larger, one table per sweep.

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
from evaluation.report import markdown
from utils import checkpoint
from utils.errors import UserError
from utils.progress import say

LEGEND = (
    "mean NLL (nats) per token after row 0 [95% bootstrap interval over grids and seeds], cell accuracy; "
    "*: lowest NLL in its column, ~: within noise of it (paired bootstrap), ±: sd over seeds"
)


def training_first_rows(data: dict) -> set[bytes]:
    """The first rows of the training grids, drawn again as data/grids.py drew them."""
    rng = np.random.default_rng([int(data["seed"]), 0])
    first_row = lambda: grids.random_grid(rng, 1, data["width"], data["rule"], data["density"])  # a grid of one row
    return {first_row().tobytes() for _ in range(int(data["train_docs"]))}


def held_out_grids(data: dict, height: int, width: int, n: int, seed: int) -> np.ndarray:
    """(n, height, width) cells from random first rows not among the training grids' (at the training width)."""
    seen = training_first_rows(data) if width == data["width"] else set()
    if width == data["width"] and len(seen) >= 2**width - n:
        raise UserError(f"eval.grids={n}: too few first rows of width {width} are left unseen by training")
    rng = np.random.default_rng([seed, height, width])
    out = []
    while len(out) < n:
        grid = grids.random_grid(rng, height, width, data["rule"], data["density"])
        if grid[0].tobytes() not in seen:
            out.append(grid)
    return np.stack(out)


@torch.no_grad()
def score_size(model, data: dict, height: int, width: int, n: int, seed: int, device, batch: int = 16) -> dict:
    """Per-grid summed NLL over the scored tokens, the size's mean NLL and cell accuracy, and the mean NLL per column
    (0 the left wall, width + 1 the right): where a size goes wrong."""
    cells = held_out_grids(data, height, width, n, seed)
    docs = torch.from_numpy(np.stack([grids.tokens(c) for c in cells])).to(device)
    ids = select_axes(grids.positions(height, width), model.pe.axes)
    pos = None if ids is None else torch.from_numpy(ids[:, :-1]).to(device)
    target = torch.arange(docs.size(1) - 1, device=device)  # target t is token t + 1
    scored, column = target >= width + 2, target % (width + 2)  # scored from row 1 on
    is_cell = scored & (column >= 1) & (column <= width)
    nll, correct, by_column = [], [], torch.zeros(width + 2, dtype=torch.float64)
    for lo in range(0, n, batch):
        x, y = docs[lo : lo + batch, :-1], docs[lo : lo + batch, 1:]
        logits = model(x, pos=pos).float()
        token_nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none") * scored
        nll.append(token_nll.sum(dim=1).double().cpu())
        by_column.index_add_(0, column.cpu(), token_nll.sum(dim=0).double().cpu())
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
        "nll_by_column": [round(float(x) / (n * (height - 1)), 5) for x in by_column],
        "scored_tokens": n_tokens,
    }


def run_grids(path, cfg, rt, out_dir: Path) -> dict:
    model, ckpt = checkpoint.load_model(path, rt.device)
    data = ckpt["config"]["data"]  # data=grids: eval.py takes no other
    ev, t0, h, w = cfg.eval, time.time(), data["height"], data["width"]
    sizes = [[h, w], [2 * h, w], [h, 2 * w], [2 * h, 2 * w]] if ev.grid_sizes is None else ev.grid_sizes
    rows = []
    for height, width in sizes:
        r = score_size(model, data, int(height), int(width), ev.grids, ev.seed, rt.device)
        say(f"  {height} x {width} ({r['tokens']} tokens): nll {r['nll']:.4f} {r['ci']} cells {r['cell_accuracy']:.3f}")
        rows.append(r)
    result = {
        "checkpoint": str(checkpoint.checkpoint_path(path)),
        "scheme": ckpt["model_config"]["positional"]["name"],
        "train_config": ckpt["config"],
        "train_size": [h, w],
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


def group_cell(group: dict, size: tuple) -> tuple | None:
    """A seed group's mean NLL at one size, its bootstrap draws, and the cell as the table shows it: mean NLL (± sd over
    seeds), 95% interval, cell accuracy. None where a run lacks the size."""
    runs = [next((r for r in res["results"] if tuple(r["size"]) == size), None) for res in group["runs"]]
    if None in runs:
        return None
    tokens = runs[0]["scored_tokens"]
    per_grid = np.array([r["grid_nll"] for r in runs]) * tokens
    idx = bootstrap.block_draws(per_grid.shape[1], [list(size), group["runs"][0]["seed"]])
    draws = bootstrap.resample(per_grid, np.full(per_grid.shape[1], tokens), idx, run_key=[group["key"], list(size)])
    nlls = [r["nll"] for r in runs]
    nll, (lo, hi) = float(np.mean(nlls)), bootstrap.interval(draws)
    spread = f" ±{np.std(nlls, ddof=1):.4f}" if len(runs) > 1 else ""
    accuracy = np.mean([r["cell_accuracy"] for r in runs])
    return nll, draws, f"{nll:.4f}{spread} [{lo:.4f}, {hi:.4f}] {accuracy:.1%}"


def table(results: list[dict]) -> str:
    """A row per seed group, a column per size."""
    if len({(r["seed"], r["grids"]) for r in results}) > 1:
        raise UserError("these grids.json were scored on different grids (eval.seed, eval.grids): score them alike")
    groups = group_runs(results)
    sizes = list(dict.fromkeys(tuple(r["size"]) for res in results for r in res["results"]))
    cells = {(gi, size): group_cell(g, size) for gi, g in enumerate(groups) for size in sizes}
    shown = {key: "n/a" if cell is None else cell[2] for key, cell in cells.items()}
    for size in sizes:
        here = [gi for gi in range(len(groups)) if cells[gi, size] is not None]
        if len(here) < 2:
            continue
        best = min(here, key=lambda gi: cells[gi, size][0])
        for gi in here:
            same = bootstrap.difference(cells[gi, size][1], cells[best, size][1])["within_noise"]
            shown[gi, size] += "*" if gi == best else "~" if same else ""
    train = results[0]["train_size"]
    head = ["scheme", "seeds"] + [f"{h}x{w}" + (" (train)" if [h, w] == train else "") for h, w in sizes]
    body = [[g["label"], ",".join(map(str, g["seeds"]))] + [shown[gi, s] for s in sizes] for gi, g in enumerate(groups)]
    return markdown(head, body, text_columns=2) + "\n" + LEGEND


def compare(results: list[dict], out_dir: Path) -> str:
    text = table(results)
    report.write_result(out_dir, "grids", {"runs": [r["checkpoint"] for r in results]}, text=text)
    return text
