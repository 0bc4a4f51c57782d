"""The held-out text a length table scores: pieces of the longest eval length, spread over the held-out works.

python eval.py checkpoint=out/rope eval.tokens=65536      (evaluation/length.py scores them at every length)
Every length and mode scores exactly these tokens, so lengths and schemes are comparable; each piece's NLL is kept
for the bootstrap. Pieces come equally from each distinct held-out work, spread over the whole document; a piece's
region adds up to M tokens before it, the context sliding windows read.
"""

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Piece:
    """Targets doc[start + 1 .. start + size] of held-out work `work` (document index `doc`)."""

    work: str
    doc: int
    start: int
    size: int


@dataclass
class Region:
    """A piece's tokens after up to M tokens of context (targets from `first`)."""

    tokens: np.ndarray
    first: int


def equal_shares(total: int, caps: list[int]) -> list[int]:
    """Split `total` as evenly as the capacities allow (water-filling): min(total, sum(caps)) in all."""
    take, left = [0] * len(caps), min(total, sum(caps))
    order = sorted(range(len(caps)), key=lambda i: caps[i])
    for k, i in enumerate(order):
        take[i] = min(caps[i], -(-left // (len(order) - k)))  # a ceiling share: the remainder goes first
        left -= take[i]
    return take


def evenly(n: int, k: int) -> list[int]:
    """k evenly spaced indices of range(n), first and last included; one alone is the middle."""
    return [n // 2] if k == 1 else [round(i * (n - 1) / (k - 1)) for i in range(k)]


def spread(slots: int, k: int) -> list[int]:
    """k distinct slots of 0..slots-1, evenly spaced; slot 0 (no text before it for sliding windows) only if need be."""
    cands = range(1 if slots > k else 0, slots)
    return [cands[i] for i in evenly(len(cands), k)]


DEFAULT_MULTIPLES = (0.5, 1, 2, 4, 8, 16)  # eval.lengths=null: these multiples of the training length


def default_lengths(train_length: int) -> list[int]:
    return [max(1, int(m * train_length)) for m in DEFAULT_MULTIPLES]


MIN_WORKS = 4  # a budget smaller than this many pieces is raised: one work's text says little about another's


def scoring_pieces(works: list[tuple[str, np.ndarray]], max_len: int, budget: int) -> list[Piece]:
    """Pieces of max_len targets, aligned to multiples of max_len: ceil(budget / max_len), at least one from each of
    MIN_WORKS works, rounded up to an equal count per work (water-filled where a work is short), spread over each
    document. With more works than pieces, one piece from each of an evenly spaced selection of the works."""
    slots = [(len(doc) - 1) // max_len for _, doc in works]
    usable = [i for i, s in enumerate(slots) if s > 0]
    if not usable:
        return []
    wanted = max(math.ceil(budget / max_len), min(len(usable), MIN_WORKS))
    if len(usable) > wanted:
        usable = [usable[j] for j in evenly(len(usable), wanted)]
    wanted = math.ceil(wanted / len(usable)) * len(usable)
    pieces = []
    for i, k in zip(usable, equal_shares(wanted, [slots[i] for i in usable]), strict=True):
        pieces += [Piece(works[i][0], i, s * max_len, max_len) for s in spread(slots[i], k)]
    return pieces


def read_span(p: Piece, max_len: int) -> tuple[int, int]:
    """[lo, hi): the tokens of its document a piece's region holds."""
    return max(0, p.start - max_len), p.start + p.size + 1


def read_spans(pieces: list[Piece], max_len: int) -> dict[str, list[tuple[int, int]]]:
    """Per work name, the [lo, hi) token spans the pieces' regions read."""
    spans = {}
    for p in pieces:
        spans.setdefault(p.work, []).append(read_span(p, max_len))
    return spans


def regions(works: list[tuple[str, np.ndarray]], pieces: list[Piece], max_len: int) -> list[Region]:
    spans = [read_span(p, max_len) for p in pieces]
    return [Region(works[p.doc][1][lo:hi], p.start - lo) for p, (lo, hi) in zip(pieces, spans, strict=True)]
