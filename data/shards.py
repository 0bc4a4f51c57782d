"""The on-disk form of a prepared dataset: token shards with document boundaries, and their meta.json.

python -m data.prepare data=shakespeare      (data/prepare.py writes them; data/loader.py reads them)
Per split, <split>_NNN.bin holds token ids (a BOS before each document), <split>_docs.npy where each document
starts; a dataset with position ids (data/grids.py) has <split>_NNN.pos.npy beside each shard. Every writer
(prepare.py's corpora, grids.py, passkey.py) and the reader go through this module, which imports none of them.
"""

import json
from pathlib import Path

import numpy as np

from utils.errors import UserError

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


def load_meta(folder: Path) -> dict:
    path = Path(folder) / "meta.json"
    if not path.exists():
        raise UserError(f"dataset not prepared at {folder}; run python -m data.prepare with the same data= options")
    return json.loads(path.read_text())
