"""Perplexity at and far past the training length, on held-out documents.

python eval.py checkpoint=out/rope eval.lengths=[128,512,4096] eval.stride=64
Scored text: `pieces` of the longest length M, an equal number from each distinct held-out work (one document of
each, evaluation/heldout.py), spread over the document (its beginning, middle and end rather than its opening
only), at least `tokens` in all (eval.tokens is rounded up to whole pieces, at least one from each of four works,
and an equal count per work). Every
length and mode scores exactly these tokens, so lengths and schemes are comparable, and the NLL of each piece is
kept for the bootstrap intervals (evaluation/bootstrap.py).
Two modes per length L:
  nonoverlap  each piece is cut into windows of L tokens; every token is scored with the context its window
              gives it (so NLL by position within the window shows where a scheme breaks down)
  sliding     windows of L tokens moved by a stride s; only the last s tokens of each are scored, so every scored
              token sees between L - s and L tokens of context. The text before a piece gives that context, so
              a piece is taken at least M tokens into its document where the document is long enough (a piece at
              a document's opening scores its first window whole: those tokens have no more context to give).
              Default stride: L / 2 (each scored token sees at least half the window). A fixed small stride costs
              L / s forwards of L tokens per scored window: at L = 4096, s = 128 that is 32x the nonoverlap cost,
              too slow for a 64K-token budget on a CPU; eval.stride=<n> asks for one stride at every length.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class Piece:
    """Targets doc[start + 1 .. start + size] of held-out work `work` (document index `doc`)."""

    work: str
    doc: int
    start: int
    size: int


@dataclass
class Region:
    """The tokens one piece needs: up to M tokens of context before it, then the piece (targets from `first`)."""

    tokens: np.ndarray
    first: int


@dataclass
class Cell:
    nll_sum: float = 0.0
    tokens: int = 0
    by_position: np.ndarray | None = None  # nonoverlap: summed NLL at each position within the window
    position_count: np.ndarray | None = None
    piece_nll: np.ndarray | None = None  # summed NLL of each piece's tokens: the bootstrap's units
    piece_tokens: np.ndarray | None = None
    extra: dict = field(default_factory=dict)

    @property
    def nll(self) -> float:
        return self.nll_sum / self.tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


def equal_shares(total: int, caps: list[int]) -> list[int]:
    """Split `total` as evenly as the capacities allow (water-filling): min(total, sum(caps)) in all."""
    take, left = [0] * len(caps), min(total, sum(caps))
    order = sorted(range(len(caps)), key=lambda i: caps[i])
    for k, i in enumerate(order):
        take[i] = min(caps[i], -(-left // (len(order) - k)))  # a ceiling share: the remainder goes first
        left -= take[i]
    return take


def spread(slots: int, k: int) -> list[int]:
    """k distinct slots of 0..slots-1, evenly spaced from first to last; slot 0 (the opening, which has no text
    before it for sliding windows) only when the others are too few."""
    cands = list(range(1, slots)) if slots - 1 >= k else list(range(slots))
    if k == 1:
        return [cands[len(cands) // 2]]
    return [cands[round(i * (len(cands) - 1) / (k - 1))] for i in range(k)]


DEFAULT_MULTIPLES = (0.5, 1, 2, 4, 8, 16)  # eval.lengths=null: these multiples of the training length


def default_lengths(train_length: int) -> list[int]:
    return [max(1, int(m * train_length)) for m in DEFAULT_MULTIPLES]


MIN_WORKS = 4  # a budget smaller than this many pieces is raised: one work's text says little about another's


def scoring_pieces(works: list[tuple[str, np.ndarray]], max_len: int, budget: int) -> list[Piece]:
    """Pieces of max_len targets, aligned to multiples of max_len in their documents: ceil(budget / max_len), at
    least one from each of MIN_WORKS works (where that many are long enough), rounded up to an equal count per
    work (water-filled where a work is short), spread over each document. With more works than pieces, one
    piece from each of an evenly spaced selection of the works."""
    slots = [(len(doc) - 1) // max_len for _, doc in works]
    usable = [i for i, s in enumerate(slots) if s > 0]
    if not usable:
        return []
    wanted = max(math.ceil(budget / max_len), min(len(usable), MIN_WORKS))
    if len(usable) > wanted:
        usable = [usable[round(j * (len(usable) - 1) / max(1, wanted - 1))] for j in range(wanted)]
    wanted = math.ceil(wanted / len(usable)) * len(usable)
    pieces = []
    for i, k in zip(usable, equal_shares(wanted, [slots[i] for i in usable]), strict=True):
        pieces += [Piece(works[i][0], i, s * max_len, max_len) for s in spread(slots[i], k)]
    return pieces


def read_span(p: Piece, max_len: int) -> tuple[int, int]:
    """[lo, hi): the tokens of its document a piece's region holds: max_len of context before it, then its own."""
    return max(0, p.start - max_len), p.start + p.size + 1


def regions(works: list[tuple[str, np.ndarray]], pieces: list[Piece], max_len: int) -> list[Region]:
    """Each piece's tokens with the max_len tokens before it (where the document has them) as context."""
    out = []
    for p in pieces:
        lo, hi = read_span(p, max_len)
        out.append(Region(works[p.doc][1][lo:hi], p.start - lo))
    return out


def nonoverlap_windows(n: int, first: int, length: int):
    """(start, n_tokens, first scored index within the window) for each window: windows of `length` from
    `first`; a last, shorter one if the scored span is not a multiple of it, so every target is scored."""
    return [(s, min(length, n - s), 0) for s in range(first, n, length)]


def sliding_windows(n: int, first: int, length: int, stride: int):
    """Windows of `length` ending every `stride` tokens from `first` on, each scoring the targets since the last
    end. With fewer than length - stride tokens of text before `first`, the first window starts at the region's
    start and scores every target up to `length`. Every window is `length` long where the region has the tokens
    (one compiled shape per length on CUDA)."""
    windows, prev = [], first
    if min(prev + stride, n) < length:
        end = min(length, n)
        windows.append((0, end, prev))
        prev = end
    while prev < n:
        end = min(prev + stride, n)
        windows.append((end - length, length, prev - (end - length)))
        prev = end
    return windows


def windows(region: Region, length: int, mode: str, stride: int):
    n = len(region.tokens) - 1
    if mode == "nonoverlap":
        return nonoverlap_windows(n, region.first, length)
    return sliding_windows(n, region.first, length, stride)


def scored_nll(model, inputs: torch.Tensor, targets: torch.Tensor, first: int, variant=None) -> torch.Tensor:
    """NLL (B, n - first) of targets[:, first:]; the head runs on the scored positions only (keep_from)."""
    return model(inputs, targets[:, first:], reduction="none", keep_from=first, variant=variant)


@torch.no_grad()
def score(model, regions: list[Region], length: int, mode: str, stride: int, batch_tokens: int, rt, variant=None):
    """Sum the NLL of the scored tokens over all windows of one (length, mode) into a Cell, batching windows of
    equal length and equal first scored index; variant: an evaluation variant (model/variant.py), None as trained."""
    cell = Cell(piece_nll=np.zeros(len(regions)), piece_tokens=np.zeros(len(regions), dtype=np.int64))
    if mode == "nonoverlap":
        cell.by_position, cell.position_count = np.zeros(length), np.zeros(length)
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
            with rt.autocast():
                nll = scored_nll(model, rows[:, :-1], rows[:, 1:], first, variant).float().view(per_batch, -1)
            nll = nll.cpu().numpy().astype(np.float64)
            for i, (r, _) in enumerate(chunk):
                cell.piece_nll[r] += nll[i].sum()
                cell.piece_tokens[r] += n - first
                if cell.by_position is not None and n == length:
                    cell.by_position += nll[i]
                    cell.position_count += 1
    cell.nll_sum, cell.tokens = float(cell.piece_nll.sum()), int(cell.piece_tokens.sum())
    return cell
