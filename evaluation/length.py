"""eval.mode=length: perplexity at and far past the training length, on held-out documents.

python eval.py checkpoint=out/rope eval.lengths=[128,512,4096] eval.stride=64
Every cell scores the same held-out pieces (evaluation/pieces.py) under each variant (evaluation/variants.py), in two
modes per length L: nonoverlap (windows of L tokens; NLL by position shows where a scheme breaks down) and sliding
(windows moved by a stride s, scoring the last s of each). The default stride is L / 2: a small fixed one costs L / s
forwards per scored window (32x the nonoverlap cost at L = 4096, s = 128).
"""

import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from evaluation import bootstrap, plots, report
from evaluation.heldout import held_out_works
from evaluation.pieces import Region, default_lengths, regions, scoring_pieces
from evaluation.variants import note_search_overlap, plan_variants
from positional import hf_rope_scaling
from utils import checkpoint, runtime
from utils.errors import UserError
from utils.progress import Eta, progress, say


@dataclass
class Cell:
    nll_sum: float = 0.0
    tokens: int = 0
    by_position: np.ndarray | None = None  # nonoverlap: summed NLL at each position within the window
    position_count: np.ndarray | None = None
    piece_nll: np.ndarray | None = None  # summed NLL of each piece's tokens: the bootstrap's units
    piece_tokens: np.ndarray | None = None
    seconds: float = 0.0  # how long the cell took to score

    @property
    def nll(self) -> float:
        return self.nll_sum / self.tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


def windows(region: Region, length: int, mode: str, stride: int):
    """(start, n_tokens, first scored index) of each window. nonoverlap: windows of `length` from region.first, the last
    one shorter where needed. sliding: windows of `length` ending every `stride` tokens, each scoring the targets since
    the last end; with too little text before region.first, the first starts at 0 and scores every target up to
    `length`. Sliding windows are all `length` long where the region has the tokens (one compiled shape per length)."""
    n, prev = len(region.tokens) - 1, region.first
    if mode == "nonoverlap":
        return [(s, min(length, n - s), 0) for s in range(prev, n, length)]
    out = []
    if min(prev + stride, n) < length:
        out.append((0, min(length, n), prev))
        prev = min(length, n)
    while prev < n:
        end = min(prev + stride, n)
        out.append((end - length, length, prev - (end - length)))
        prev = end
    return out


@torch.no_grad()
def score(model, regions: list[Region], length: int, mode: str, stride: int, batch_tokens: int, rt, variant=None):
    """Sum the NLL of the scored tokens over all windows of one (length, mode) into a Cell, batching windows of equal
    length and first scored index."""
    cell = Cell(piece_nll=np.zeros(len(regions)), piece_tokens=np.zeros(len(regions), dtype=np.int64))
    if mode == "nonoverlap":
        cell.by_position, cell.position_count = np.zeros(length), np.zeros(length)
    if rt.device.type == "cuda":  # the cell's own peak (on the CPU the process's peak RSS, which never falls)
        torch.cuda.reset_peak_memory_stats(rt.device)
    t0 = time.time()
    jobs = {}
    for r, region in enumerate(regions):
        for start, n, first in windows(region, length, mode, stride):
            jobs.setdefault((n, first), []).append((r, start))
    for (n, first), items in sorted(jobs.items()):
        per_batch = min(len(items), max(1, batch_tokens // n))
        for b in range(0, len(items), per_batch):
            chunk = items[b : b + per_batch]
            rows = [regions[r].tokens[s : s + n + 1] for r, s in chunk]
            rows += rows[-1:] * (per_batch - len(rows))  # a full last batch: one shape per length
            rows = torch.from_numpy(np.stack(rows).astype(np.int64)).to(rt.device)
            with rt.autocast():  # the head runs on the scored positions only (keep_from)
                nll = model(rows[:, :-1], rows[:, first + 1 :], reduction="none", keep_from=first, variant=variant)
            nll = nll.float().view(per_batch, -1).cpu().numpy().astype(np.float64)
            for i, (r, _) in enumerate(chunk):
                cell.piece_nll[r] += nll[i].sum()
                cell.piece_tokens[r] += n - first
                if cell.by_position is not None and n == length:
                    cell.by_position += nll[i]
                    cell.position_count += 1
    cell.nll_sum, cell.tokens = float(cell.piece_nll.sum()), int(cell.piece_tokens.sum())
    cell.seconds = time.time() - t0
    return cell


def resolve_lengths(lengths, train_length: int) -> list[int]:
    if lengths is None:
        return default_lengths(train_length)
    return sorted({int(n) for n in lengths})  # positive and not empty: utils/schema.py Scoring


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
    """The pieces every cell scores and the regions of tokens they need."""
    works = held_out_works(ckpt, ev.prepare)
    pieces = scoring_pieces(works, max_len, ev.tokens)
    if not pieces:
        longest = max(len(d) - 1 for _, d in works)
        too_long = f"eval length {max_len} is longer than every held-out document (the longest has {longest} tokens)"
        raise UserError(too_long + "; ask for shorter eval.lengths")
    if len(pieces) * max_len < ev.tokens:  # never fewer than asked without saying so
        say(
            f"note: eval.tokens={ev.tokens} is more than the held-out works hold in whole {max_len}-token pieces; "
            f"scoring {len(pieces) * max_len:,}"
        )
    return pieces, regions(works, pieces, max_len)


def evaluate_lengths(path, cfg, rt) -> dict:
    """Every (variant, length, mode) cell of one checkpoint, on the same held-out pieces, with intervals."""
    model, ckpt = checkpoint.load_model(path, rt.device)
    ev, limit = cfg.eval, model.pe.max_positions
    lengths = resolve_lengths(ev.lengths, ckpt["seq_len"])
    strides = resolve_strides(ev.stride, lengths)
    variants, searched, at = plan_variants(path, ev, model, ckpt, lengths)
    pieces, regs = scored_text(ckpt, ev, lengths[-1])
    note_search_overlap(searched, pieces, lengths[-1])
    draws = bootstrap.block_draws(len(pieces), [[p.work, p.start, p.size] for p in pieces])
    name, rows, by_position, t0 = report.scheme_label(ckpt), [], {}, time.time()
    modes = ("nonoverlap", "sliding") if ev.sliding else ("nonoverlap",)
    cells = [(v, n, m) for v in variants for n in lengths for m in modes]
    eta = Eta(len(cells))
    for variant, length, mode in progress(cells, "length eval", unit="cell"):
        row = {"scheme": name, "variant": variant, "length": length, "mode": mode}
        row |= {"stride": strides[length]} if mode == "sliding" else {}
        if limit is not None and length > limit:
            note = f"n/a: learned table covers {limit} positions"
            rows.append({**row, "ppl": None, "nll": None, "tokens": 0, "note": note})
            eta.step()
            continue
        value, setting = at(variant, length)
        cell = score(model, regs, length, mode, strides[length], ev.batch_tokens, rt, value)
        rows.append(cell_row({**row, **setting}, cell, draws, rt, eta.step("cells")))
        if mode == "nonoverlap":
            by_position.setdefault(variant, {})[str(length)] = report.binned(cell.by_position, cell.position_count)
    return {
        "checkpoint": str(checkpoint.checkpoint_path(path)),
        "scheme": name,
        "positional": ckpt["model_config"]["positional"],
        "train_config": ckpt["config"],
        "train_length": ckpt["seq_len"],
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
        "hf_rope_scaling": hf_rope_scaling.as_dict(ev.hf_rope_scaling) or None,  # its row's keys, where given
    }


def cell_row(row: dict, cell: Cell, draws, rt, done: str) -> dict:
    """A scored cell's row (perplexity, its interval, the per-piece NLLs a comparison pairs on) and its progress line
    (done: the cells done and the time left)."""
    ci = bootstrap.ppl_interval(bootstrap.resample(cell.piece_nll, cell.piece_tokens, draws))
    say(
        f"  {row['variant']:>11} {row['mode']:>10} {row['length']:>6}: ppl {cell.ppl:9.2f} [{ci[0]:.2f}, "
        f"{ci[1]:.2f}] on {cell.tokens:,} tokens ({cell.seconds:.1f} s; {done})"
    )
    return {
        **row,
        "ppl": cell.ppl,
        "nll": cell.nll,
        "ci": ci,
        "tokens": cell.tokens,
        "piece_nll": [round(float(x), 6) for x in cell.piece_nll / cell.piece_tokens],
        "seconds": round(cell.seconds, 2),
        "peak_memory_mb": round(runtime.peak_memory_mb(rt.device), 1),
    }


def run_length(path, cfg, rt, out_dir: Path) -> dict:
    """eval.mode=length: the table, <out_dir>/length.json and length.png."""
    result = evaluate_lengths(path, cfg, rt)
    sliding = f"sliding stride {result['stride']}" if cfg.eval.sliding else "no sliding windows"
    title = (
        f"{result['scheme']} @ step {result['step']}, trained at {result['train_length']} tokens "
        f"({sliding}): perplexity by evaluation length"
    )
    print(report.table(result["results"], result["lengths"], title))
    first = next(iter(result["nll_by_position"].values()), None)
    draw = partial(plots.plot, result["results"], result["train_length"], title=result["scheme"], by_position=first)
    report.write_result(out_dir, "length", result, draw)
    return result
