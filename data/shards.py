"""The on-disk form of a prepared dataset: token shards with document boundaries, and their meta.json.

python -m data.prepare data=shakespeare      (data/prepare.py writes them; data/loader.py reads them)
Per split, <split>_NNN.bin holds token ids (a BOS before each document), <split>_docs.npy where each document
starts; a dataset with position ids (data/grids.py) has <split>_NNN.pos.npy beside each shard. Every writer
(prepare.py's corpora, grids.py, passkey.py) and the reader go through this module, which imports none of them.

A damaged folder (a truncated shard or tokenizer.json, a file rewritten since) is refused, never read as tokens:
meta.json records every file's size, sha256 and mtime (seal, once the folder is whole). Opening a split (check_files)
compares sizes always, a stat per file; a file whose mtime differs from the recorded one (edited, or copied without
its times) is hashed, once per process and version of the file. A change that keeps both the size and the mtime (bit
rot) is not looked for: that would take a full read of the corpus at every start. A folder prepared before the record
was kept has its shards' sizes checked against their token counts.
"""

import hashlib
import json
import shlex
from pathlib import Path

import numpy as np

from utils.errors import UserError
from utils.files import shape_problem

SPLITS = ("train", "val")


def write_token_split(folder: Path, split: str, docs, dtype, shard_tokens: int) -> dict:
    """Write token documents (arrays, BOS first) as shards; start a new shard only at a document boundary.
    A document may also be a pair (tokens, position ids (axes, n)): each shard then has its ids beside it,
    <split>_NNN.pos.npy of shape (axes, its tokens), int32 (data/grids.py; data/loader.py reads them)."""
    shards, starts, buf, pos_buf, n_total = [], [], [], [], 0

    def flush():
        if buf:
            name = f"{split}_{len(shards):03d}.bin"
            arr = np.concatenate(buf).astype(dtype)
            arr.tofile(folder / name)
            shards.append({"file": name, "tokens": int(arr.size)})
            if pos_buf:
                shards[-1]["positions"] = name.replace(".bin", ".pos.npy")
                np.save(folder / shards[-1]["positions"], np.concatenate(pos_buf, axis=1).astype(np.int32))
            buf.clear()
            pos_buf.clear()

    in_buf = 0
    for doc in docs:
        if isinstance(doc, tuple):
            doc, ids = doc
            if ids.shape[-1] != doc.size:
                raise ValueError(f"a document of {doc.size} tokens with position ids of shape {ids.shape}")
            pos_buf.append(ids)
        starts.append(n_total)
        buf.append(doc)
        n_total += doc.size
        in_buf += doc.size
        if in_buf >= shard_tokens:
            flush()
            in_buf = 0
    flush()
    np.save(folder / f"{split}_docs.npy", np.asarray(starts, dtype=np.int64))
    return {"shards": shards, "n_docs": len(starts), "n_tokens": n_total}


META = {"vocab_size": int, "bos": int, "dtype": str, "splits": dict}  # what the readers take from meta.json
SPLIT = {"shards": list, "n_docs": int, "n_tokens": int}
SHARD = {"file": str, "tokens": int}
RECORD = {"bytes": int, "sha256": str, "mtime_ns": int}  # of each file (seal)


def load_meta(folder: Path) -> dict:
    """A prepared folder's meta.json, checked: what every reader takes from it is there, with its type."""
    path = Path(folder) / "meta.json"
    if not path.exists():
        raise UserError(f"dataset not prepared at {folder}; run python -m data.prepare with the same data= options")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        damaged(folder, "meta.json cannot be read (cut short, or not JSON)")
    if why := meta_problem(meta):
        damaged(folder, f"meta.json {why}")
    return meta


def meta_problem(meta) -> str | None:
    """What meta.json lacks of what the readers take from it (META, each split's SPLIT, each shard's SHARD), or None.
    A split it does not hold is named by check_split, when that split is read."""
    if why := shape_problem(meta, META):
        return why
    for split, info in meta["splits"].items():
        if why := shape_problem(info, SPLIT, f"splits.{split}"):
            return why
        for i, shard in enumerate(info["shards"]):
            if why := shape_problem(shard, SHARD, f"splits.{split}.shards[{i}]"):
                return why
    if "files" in meta and (why := shape_problem(meta, {"files": dict})):
        return why
    for name, record in meta.get("files", {}).items():
        if why := shape_problem(record, RECORD, f"files.{name}"):
            return why
    if meta["dtype"] not in ("uint8", "uint16", "uint32"):
        return f"holds dtype {meta['dtype']!r}, not a token type (uint8, uint16, uint32)"
    return None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def seal(folder: Path):
    """Record the size, sha256 and mtime of every file of a prepared folder in its meta.json (prepare.py, once the
    folder is whole, before it is renamed into place: a rename keeps the times)."""
    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != "meta.json")
    meta["files"] = {
        p.name: {"bytes": p.stat().st_size, "sha256": sha256(p), "mtime_ns": p.stat().st_mtime_ns} for p in files
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


_verified = set()  # (path, size, mtime) of the files whose checksum matched in this process


def check_files(folder: Path, names, meta: dict):
    """Refuse the folder if a file among names is missing, has another size than meta.json records, or was changed
    since (its mtime differs) and its sha256 no longer matches."""
    folder, recorded = Path(folder), meta.get("files", {})
    for name in names:
        path = folder / name
        if not path.exists():
            damaged(folder, f"{name} is missing")
        if name not in recorded:  # prepared before the record was kept
            continue
        st, want = path.stat(), recorded[name]
        if st.st_size != want["bytes"]:
            damaged(folder, f"{name} holds {st.st_size:,} bytes where meta.json records {want['bytes']:,}")
        key = (str(path), st.st_size, st.st_mtime_ns)
        if st.st_mtime_ns != want["mtime_ns"] and key not in _verified:
            if sha256(path) != want["sha256"]:
                damaged(folder, f"{name} changed since it was prepared (its sha256 differs from meta.json's)")
            _verified.add(key)


def check_split(folder: Path, meta: dict, split: str):
    """check_files for a split's shards, position ids and document starts; for a folder prepared before sizes were
    recorded, each shard's size against its token count."""
    if split not in meta["splits"]:
        damaged(folder, f"meta.json has no {split} split")
    info = meta["splits"][split]
    names = [s["file"] for s in info["shards"]] + [s["positions"] for s in info["shards"] if "positions" in s]
    check_files(folder, [*names, f"{split}_docs.npy"], meta)
    if "files" not in meta:
        itemsize = np.dtype(meta["dtype"]).itemsize
        for s in info["shards"]:
            size = (Path(folder) / s["file"]).stat().st_size
            if size != s["tokens"] * itemsize:
                damaged(folder, f"{s['file']} holds {size:,} bytes where meta.json records {s['tokens']:,} tokens")


def damaged(folder: Path, what: str):
    raise UserError(
        f"the prepared data at {folder} is damaged: {what}; rebuild it: rm -r {shlex.quote(str(folder))}, then run "
        f"again (train.py, or eval.py with eval.prepare=true, prepares it anew; so does python -m data.prepare with "
        f"the run's data= and tokenizer= options)"
    )
