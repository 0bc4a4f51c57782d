"""LongRoPE's searched factors on disk, and the held-out text their search may read.

python -m evaluation.longrope_search checkpoint=out/rope target_length=1024   writes out/rope/longrope_x4.json
python eval.py checkpoint=out/rope eval.rope_scaling=longrope eval.lengths=[256,1024]   reads it
python sample.py checkpoint=out/rope rope_scaling=longrope cache.max_len=1024              and so does sample.py
One file per factor s = target length / training length, beside the checkpoint. The search reads only held-out text
that the length table (at eval.lengths and eval.tokens) reads neither as scored tokens nor as context, in one copy of
each work (evaluation/heldout.py: not the First Folio twins); eval.py says so if its pieces overlap those windows.
"""

import math
from pathlib import Path

from evaluation.pieces import equal_shares, evenly
from positional.rope_scaling import Scaling
from utils import files
from utils.errors import UserError

NUMBER = (int, float)
REQUIRED = {"factors": list, "start_tokens": int, "attn_scale": NUMBER, "original_length": int, "factor": NUMBER}


def file_name(factor: float) -> str:
    return f"longrope_x{factor:g}.json"


def save(run_dir: Path, record: dict) -> Path:
    path = Path(run_dir) / file_name(record["factor"])
    files.write_json(path, record)  # whole or not at all
    return path


def load(run_dir: Path, factor: float, train_length: int, key: str = "eval.rope_scaling") -> dict:
    """The record for this factor, or a UserError naming the command that makes it. key: the setting that asked."""
    path, target = Path(run_dir) / file_name(factor), round(factor * train_length)
    command = f"python -m evaluation.longrope_search checkpoint={run_dir} target_length={target}"
    if not path.exists():
        where = "eval length" if key.startswith("eval.") else "a cache of"
        raise UserError(
            f"{key}=longrope at {where} {target} ({factor:g} x {train_length}) needs {path}; make it with: {command}"
        )
    again = f"make it again with: {command}"
    record = files.read_json(path, REQUIRED, again, "a LongRoPE factors file")
    if not all(isinstance(f, NUMBER) and f > 0 for f in record["factors"]):
        raise UserError(f"{path} holds factors that are not positive numbers; {again}")
    if record["original_length"] != train_length or not math.isclose(record["factor"], factor):
        raise UserError(
            f"{path} was searched for x{record['factor']:g} of {record['original_length']} tokens, not x{factor:g} "
            f"of this checkpoint's {train_length}; {again}"
        )
    return record


def scaling(record: dict) -> Scaling:
    """The record as the Scaling it searched (positional/rope_scaling.py)."""
    options = {"rescale": record["factors"], "start_tokens": record["start_tokens"], "attn_scale": record["attn_scale"]}
    return Scaling("longrope", record["factor"], record["original_length"], **options)


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
        out += [{"work": name, "start": int(starts[i]), "tokens": length} for i in evenly(len(starts), k)]
    return out


def overlap(windows: list[dict], spans: dict) -> int:
    """How many tokens of the windows fall inside the spans (0: the search never read what is scored)."""
    total = 0
    for w in windows:
        a, b = w["start"], w["start"] + w["tokens"] + 1
        total += sum(max(0, min(b, hi) - max(a, lo)) for lo, hi in spans.get(w["work"], []))
    return total
