"""LongRoPE's searched factors on disk, and the held-out text their search may read.

python -m evaluation.longrope_search checkpoint=out/rope target_length=1024   writes out/rope/longrope_x4.json
python eval.py checkpoint=out/rope eval.rope_scaling=longrope eval.lengths=[256,1024]   reads it
python sample.py checkpoint=out/rope rope_scaling=longrope cache.max_len=1024              and so does sample.py
One file per factor s = target length / training length, beside the checkpoint. The search scores the spans of the
held-out works that the length table never reads, as scored tokens or as context (at eval.lengths and eval.tokens),
not the First Folio twins, near-duplicates of the very lines the table scores. eval.py says so if its own regions
overlap the recorded windows.
"""

import math
from pathlib import Path

import numpy as np

from evaluation.pieces import equal_shares, read_span, scoring_pieces
from positional.rope_scaling import Scaling
from utils import files
from utils.errors import UserError

COMMAND = "python -m evaluation.longrope_search"


def file_name(factor: float) -> str:
    return f"longrope_x{factor:g}.json"


def make_command(run_dir: Path, target_length: int) -> str:
    return f"{COMMAND} checkpoint={run_dir} target_length={target_length}"


def save(run_dir: Path, record: dict) -> Path:
    """Write the record beside the checkpoint, whole or not at all."""
    path = Path(run_dir) / file_name(record["factor"])
    files.write_json(path, record)
    return path


NUMBER = (int, float)
REQUIRED = {"factors": list, "start_tokens": int, "attn_scale": NUMBER, "original_length": int, "factor": NUMBER}


def load(run_dir: Path, factor: float, train_length: int, key: str = "eval.rope_scaling") -> dict:
    """The record for this factor, or a UserError: missing (with the command that makes it), unreadable, or searched for
    another training length. key: the setting that asked for it."""
    path = Path(run_dir) / file_name(factor)
    target = round(factor * train_length)
    if not path.exists():
        where = "eval length" if key.startswith("eval.") else "a cache of"
        raise UserError(
            f"{key}=longrope at {where} {target} ({factor:g} x {train_length}) needs {path}; "
            f"make it with: {make_command(run_dir, target)}"
        )
    again = f"make it again with: {make_command(run_dir, target)}"
    record = files.read_json(path, REQUIRED, again, "a LongRoPE factors file")
    if not all(isinstance(f, NUMBER) and f > 0 for f in record["factors"]):
        raise UserError(f"{path} holds factors that are not positive numbers; {again}")
    if record["original_length"] != train_length or not math.isclose(record["factor"], factor):
        raise UserError(
            f"{path} was searched for x{record['factor']:g} of {record['original_length']} tokens, not x{factor:g} "
            f"of this checkpoint's {train_length}; make it again with: {make_command(run_dir, target)}"
        )
    return record


def scaling(record: dict) -> Scaling:
    """The record as the Scaling it searched (positional/rope_scaling.py)."""
    return Scaling(
        "longrope",
        record["factor"],
        record["original_length"],
        rescale=record["factors"],
        start_tokens=record["start_tokens"],
        attn_scale=record["attn_scale"],
    )


def read_spans(works, max_len: int, tokens: int) -> dict[str, list[tuple[int, int]]]:
    """Per work name, the [lo, hi) token spans the length table reads at this longest length and token budget."""
    spans = {}
    for p in scoring_pieces(works, max_len, tokens):
        spans.setdefault(p.work, []).append(read_span(p, max_len))
    return spans


def free_windows(doc_len: int, spans: list[tuple[int, int]], length: int) -> list[int]:
    """Starts of back-to-back windows of length + 1 tokens inside [0, doc_len) and outside every span."""
    starts, lo = [], 0
    for a, b in [*sorted(spans), (doc_len, doc_len)]:
        starts += range(lo, a - length, length)  # a window [s, s + length + 1) must end by a
        lo = max(lo, b)
    return starts


def search_windows(works, length: int, count: int, spans: dict) -> list[dict]:
    """count windows of `length` targets outside the spans, an equal share from each work, evenly spaced along each;
    [{work, start, tokens}]."""
    free = [free_windows(len(doc), spans.get(name, []), length) for name, doc in works]
    if sum(map(len, free)) < count:
        raise UserError(
            f"the held-out text the length table leaves unread holds {sum(map(len, free))} windows of {length} "
            f"tokens, fewer than search.windows={count}; ask for fewer, or keep clear of a smaller table "
            f"(eval.tokens=, eval.lengths=)"
        )
    out = []
    for (name, _), starts, k in zip(works, free, equal_shares(count, list(map(len, free))), strict=True):
        picks = [len(starts) // 2] if k == 1 else [round(i * (len(starts) - 1) / (k - 1)) for i in range(k)]
        out += [{"work": name, "start": int(starts[i]), "tokens": length} for i in picks[:k]]
    return out


def window_tokens(works, windows: list[dict]) -> list[np.ndarray]:
    docs = dict(works)
    return [docs[w["work"]][w["start"] : w["start"] + w["tokens"] + 1] for w in windows]


def overlap(windows: list[dict], spans: dict) -> int:
    """How many tokens of the windows fall inside the spans (0: the search never read what is scored)."""
    total = 0
    for w in windows:
        a, b = w["start"], w["start"] + w["tokens"] + 1
        total += sum(max(0, min(b, hi) - max(a, lo)) for lo, hi in spans.get(w["work"], []))
    return total
