"""Prepared token shards: training rows in a seeded shuffled order, whole held-out documents; written, sealed, checked.

Used by train.py (RowSampler) and eval.py (TokenSplit.documents). A row is seq_len + 1 consecutive tokens; rows tile
each shard, overlapping by one token. Row k is a pure function of (seed, k), so a checkpoint's data position is a row
count, and DDP ranks read disjoint rows of one order.
python train.py data.bos_aligned=true: every training row starts with BOS, as in nanochat; sinks then formed in 74%
of heads against 18% with arbitrary first tokens (Gu et al. 2024). Validation rows stay the plain tiling.
Datasets with position ids (data=grids) are read a whole document per row, all of one length and ids, so a batch
shares its positions.
"""

import hashlib
import json
import shlex
from pathlib import Path

import numpy as np
import torch

from utils.errors import UserError
from utils.files import shape_problem


class TokenSplit:
    def __init__(self, folder, split: str):
        folder = Path(folder)
        meta = load_meta(folder)
        check_split(folder, meta, split)  # a damaged shard is never read as tokens
        info = meta["splits"][split]
        self.shards = [np.memmap(folder / s["file"], dtype=meta["dtype"], mode="r") for s in info["shards"]]
        self.shard_starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.doc_starts = np.load(folder / f"{split}_docs.npy")
        self.n_tokens, self.bos = int(info["n_tokens"]), meta["bos"]
        self.folder, self.split = folder, split
        self.position_axes = int(meta.get("position_axes", 0))  # 0: text
        self.positions = [np.load(folder / s["positions"], mmap_mode="r") for s in info["shards"] if "positions" in s]

    def _locate(self, i: int) -> tuple[int, int, int]:
        """(shard, start, end) of document i within its shard (documents never straddle shards)."""
        start = int(self.doc_starts[i])
        end = int(self.doc_starts[i + 1]) if i + 1 < len(self.doc_starts) else self.n_tokens
        s = int(np.searchsorted(self.shard_starts, start, side="right")) - 1
        return s, start - int(self.shard_starts[s]), end - int(self.shard_starts[s])

    def document(self, i: int) -> np.ndarray:
        """Tokens of document i, its BOS first."""
        s, lo, hi = self._locate(i)
        return np.asarray(self.shards[s][lo:hi], dtype=np.int64)

    def documents(self) -> list[np.ndarray]:
        return [self.document(i) for i in range(len(self.doc_starts))]


def aligned_starts(doc_starts: np.ndarray, n_tokens: int, seq_len: int) -> np.ndarray:
    """Where one shard's BOS-aligned rows start. A long document is not cropped (a 40K-token play would lose all but one
    row): its rest starts a row every seq_len tokens. A row runs on past its document; the one it cuts starts the next
    row, so that part is read twice (nanochat's "bestfit" crops it instead)."""
    ends = np.append(doc_starts[1:], n_tokens).tolist()
    starts, covered = [], 0  # covered: where the last row ends
    for s, e in zip(doc_starts.tolist(), ends, strict=True):
        if e <= covered or e - s < 2:  # held by the row before, or a lone BOS
            continue
        rows = range(s, e - 1, seq_len)
        starts.extend(rows)
        covered = rows[-1] + seq_len + 1
    starts = np.asarray(starts, dtype=np.int64)
    return starts[starts + seq_len + 1 <= n_tokens]


def select_axes(ids: np.ndarray, axes: int) -> np.ndarray | None:
    """The stored ids (S, T) a scheme of `axes` axes reads: all, (height, width) of 3, or None (token order)."""
    if axes == 1:
        return None
    if axes == len(ids) or (axes == 2 and len(ids) == 3):
        return ids[-axes:]
    raise UserError(f"a scheme of {axes} position axes cannot read data with {len(ids)}; pick another positional")


class RowSampler:
    def __init__(self, split: TokenSplit, seq_len: int, seed: int, bos_aligned: bool = False, axes: int = 1):
        self.split, self.seq_len, self.seed, self.axes = split, seq_len, seed, axes
        if split.position_axes:  # rows are whole documents
            lengths = sorted(set(np.diff(np.append(split.doc_starts, split.n_tokens)).tolist()))
            if lengths != [seq_len + 1]:
                raise UserError(
                    f"train.seq_len={seq_len}: this dataset has position ids and is read one whole document per row, "
                    f"and its documents hold {lengths[0] - 1} tokens after BOS; pass train.seq_len={lengths[0] - 1}"
                )
            select_axes(np.zeros((split.position_axes, 1)), axes)  # a scheme that cannot read them fails here
            bos_aligned = True
        self.bos, self.starts = None, None  # plain tiling: row j starts at j * seq_len
        per_shard = [max(0, (len(s) - 1) // seq_len) for s in split.shards]
        if bos_aligned:
            self.bos, docs, bounds = split.bos, split.doc_starts, split.shard_starts
            self.starts = [
                aligned_starts(docs[(docs >= lo) & (docs < hi)] - lo, hi - lo, seq_len)
                for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
            ]
            per_shard = [len(s) for s in self.starts]
        self.row_starts = np.cumsum([0] + per_shard)
        self.n_rows = int(self.row_starts[-1])
        if self.n_rows == 0:
            aligned = " starting at a document's BOS (data.bos_aligned=true)" if bos_aligned else ""
            raise UserError(
                f"train.seq_len={seq_len}: the {split.split} split of {split.folder} holds {split.n_tokens:,} tokens, "
                f"fewer than one row of seq_len + 1{aligned}; pass a smaller train.seq_len, or more text"
            )
        self._epoch, self._order = -1, None

    def _where(self, k: int) -> tuple[int, int]:
        """(shard, offset) of row k of the run."""
        epoch, i = divmod(k, self.n_rows)
        if epoch != self._epoch:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.n_rows)
            self._epoch = epoch
        r = int(self._order[i])
        s = int(np.searchsorted(self.row_starts, r, side="right")) - 1
        j = r - int(self.row_starts[s])
        return s, j * self.seq_len if self.starts is None else int(self.starts[s][j])

    def _row(self, k: int) -> np.ndarray:
        s, lo = self._where(k)
        return self.split.shards[s][lo : lo + self.seq_len + 1]

    def positions(self, first_row: int, n: int, device="cpu") -> torch.Tensor | None:
        """The position ids (axes, seq_len) a batch's rows share; None for text or a 1-axis scheme."""
        if not self.split.position_axes or self.axes == 1:
            return None
        rows = [self._where(first_row + j) for j in range(n)]
        ids = [self.split.positions[s][:, lo : lo + self.seq_len] for s, lo in rows]
        if any(not np.array_equal(ids[0], other) for other in ids[1:]):
            raise ValueError("rows of one batch have different position ids; a batch shares one set of positions")
        return torch.from_numpy(select_axes(np.asarray(ids[0], dtype=np.int64), self.axes).copy()).to(device)

    def batch(self, first_row: int, n: int, device="cpu"):
        rows = np.stack([self._row(first_row + j) for j in range(n)]).astype(np.int64)
        if self.bos is not None:  # a BOS before a long document's rest
            rows[:, 0] = self.bos
        rows = torch.from_numpy(rows)
        if device != "cpu" and torch.device(device).type == "cuda":
            rows = rows.pin_memory().to(device, non_blocking=True)
        return rows[:, :-1], rows[:, 1:]


# ---- the prepared folder's token shards: written, sealed, and checked as they are read ----
# python -m data.prepare data=shakespeare
# Per split: <split>_NNN.bin (token ids, a BOS before each document), <split>_docs.npy (document starts), and with
# position ids <split>_NNN.pos.npy. meta.json records every file's size, sha256 and mtime (seal); opening a split
# compares sizes, and hashes a file whose mtime changed (once per process). Bit rot that keeps size and mtime is not
# looked for: that would read the whole corpus at every start.

SPLITS = ("train", "val")


def write_token_split(folder: Path, split: str, docs, dtype, shard_tokens: int) -> dict:
    """Write documents (BOS first; or (tokens, position ids (axes, n)) pairs) as shards split at document bounds."""
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

    for doc in docs:
        if isinstance(doc, tuple):
            doc, ids = doc
            if ids.shape[-1] != doc.size:
                raise ValueError(f"a document of {doc.size} tokens with position ids of shape {ids.shape}")
            pos_buf.append(ids)
        starts.append(n_total)
        buf.append(doc)
        n_total += doc.size
        if n_total - starts[-len(buf)] >= shard_tokens:  # the buffered documents' tokens, from its first start
            flush()
    flush()
    np.save(folder / f"{split}_docs.npy", np.asarray(starts, dtype=np.int64))
    return {"shards": shards, "n_docs": len(starts), "n_tokens": n_total}


def write_splits(folder: Path, data: dict, spec: dict, meta: dict, docs, what: str, log):
    """A prepared folder's tokenizer.json, both splits and meta.json (meta gains "splits"); docs(i, split): the
    documents of SPLITS[i], as write_token_split takes them; what: their name in the log."""
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    meta["splits"], shard_tokens = {}, int(data.get("shard_tokens", 2**28))
    for i, split in enumerate(SPLITS):
        info = meta["splits"][split] = write_token_split(folder, split, docs(i, split), meta["dtype"], shard_tokens)
        log(f"  {split}: {info['n_docs']} {what}, {info['n_tokens']:,} tokens")
        if info["n_docs"] == 0:
            raise UserError(f"data={data['name']}: the {split} split is empty; add documents or change the split")
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


META = {"vocab_size": int, "bos": int, "dtype": str, "splits": dict}  # read from meta.json
SPLIT = {"shards": list, "n_docs": int, "n_tokens": int}
SHARD = {"file": str, "tokens": int}
RECORD = {"bytes": int, "sha256": str, "mtime_ns": int}  # of each file (seal)


def load_meta(folder: Path) -> dict:
    """A prepared folder's meta.json, checked."""
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
    """What meta.json lacks (META, SPLIT, SHARD, RECORD), or None; a missing split is named by check_split."""
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
    """Record every file's size, sha256 and mtime in meta.json, before the rename into place (which keeps times)."""
    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != "meta.json")
    meta["files"] = {
        p.name: {"bytes": p.stat().st_size, "sha256": sha256(p), "mtime_ns": p.stat().st_mtime_ns} for p in files
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


_verified = set()  # (path, size, mtime) whose checksum matched in this process


def check_files(folder: Path, names, meta: dict):
    """Refuse the folder if a file is missing, or its size or (when its mtime changed) sha256 differs."""
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
    """check_files for a split; an older folder without records: each shard's size against its token count."""
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
