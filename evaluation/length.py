"""Perplexity at and far past the training length, on held-out documents.

python eval.py checkpoint=out/rope eval.lengths=[128,512,4096] eval.stride=64
Two modes per length L:
  nonoverlap  the region is cut into windows of L tokens; every token is scored with the context its window
              gives it (so NLL by position within the window shows where a scheme breaks down)
  sliding     windows of L tokens moved by `stride`; only the last `stride` tokens of each are scored, so every
              scored token sees between L - stride and L tokens of context (the first window of a document
              scores all its tokens, as a document's first tokens have no more context to give)
Every length and mode scores the same tokens: a prefix of each document long enough for the longest length,
taken in whole multiples of it, until `tokens` are reached.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Cell:
    nll_sum: float = 0.0
    tokens: int = 0
    by_position: np.ndarray | None = None  # nonoverlap: summed NLL at each position within the window
    position_count: np.ndarray | None = None
    extra: dict = field(default_factory=dict)

    @property
    def nll(self) -> float:
        return self.nll_sum / self.tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


def scoring_regions(docs: list[np.ndarray], max_len: int, budget: int) -> list[np.ndarray]:
    """Token arrays (targets + 1) to score: whole multiples of max_len from each long-enough document."""
    regions, total = [], 0
    for doc in docs:
        usable = (len(doc) - 1) // max_len * max_len
        if usable == 0:
            continue
        take = min(usable, math.ceil((budget - total) / max_len) * max_len)
        regions.append(doc[: take + 1])
        total += take
        if total >= budget:
            break
    return regions


def nonoverlap_windows(region: np.ndarray, length: int):
    """(start, n_tokens, first scored index within the window) for each window."""
    n = len(region) - 1
    return [(s, length, 0) for s in range(0, n - length + 1, length)]


def sliding_windows(region: np.ndarray, length: int, stride: int):
    """The first window scores all its tokens; each next one ends `stride` tokens later and scores only those.
    Every window is `length` long (one compiled shape per length on CUDA)."""
    n = len(region) - 1
    windows, prev = [(0, min(length, n), 0)], min(length, n)
    while prev < n:
        end = min(prev + stride, n)
        windows.append((end - length, length, prev - (end - length)))
        prev = end
    return windows


@torch.no_grad()
def score(model, regions, length: int, mode: str, stride: int, batch_tokens: int, rt) -> Cell:
    """Sum the NLL of the scored tokens over all windows of one (length, mode), batching equal-length windows."""
    cell = Cell()
    if mode == "nonoverlap":
        cell.by_position, cell.position_count = np.zeros(length), np.zeros(length)
    jobs = {}
    for r, region in enumerate(regions):
        windows = (
            nonoverlap_windows(region, length) if mode == "nonoverlap" else sliding_windows(region, length, stride)
        )
        for start, n, first in windows:
            jobs.setdefault(n, []).append((r, start, first))
    for n, items in sorted(jobs.items()):
        per_batch = min(len(items), max(1, batch_tokens // n))
        for b in range(0, len(items), per_batch):
            chunk = items[b : b + per_batch]
            rows = [regions[r][s : s + n + 1] for r, s, _ in chunk]
            rows += rows[-1:] * (per_batch - len(rows))  # a full last batch: one shape per length
            rows = torch.from_numpy(np.stack(rows).astype(np.int64)).to(rt.device)
            with rt.autocast():
                nll = model(rows[:, :-1], rows[:, 1:], reduction="none").float().view(per_batch, n)
            nll = nll.cpu().numpy().astype(np.float64)
            for i, (_, _, first) in enumerate(chunk):
                cell.nll_sum += nll[i, first:].sum()
                cell.tokens += n - first
                if cell.by_position is not None and n == length:
                    cell.by_position += nll[i]
                    cell.position_count += 1
    return cell
