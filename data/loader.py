"""Reading prepared token shards: training rows in a seeded shuffled order, and whole held-out documents.

Used by train.py (RowSampler) and eval.py (TokenSplit.documents). A row is seq_len + 1 consecutive tokens
(inputs and shifted targets); rows tile each shard without overlap except that one token. Row k of a run is a
pure function of (seed, k), so the data position saved in a checkpoint is just the count of rows consumed,
and DDP ranks read disjoint rows of the same order.

python train.py data.bos_aligned=true: every training row starts with BOS (aligned_starts), as nanochat's loader
does, so the first token a model sees is always the same one: sinks then formed in 74% of heads against 18%
with arbitrary first tokens (Gu et al. 2024). Validation rows stay the plain tiling, so val_loss scores the same
tokens with and without it.
"""

from pathlib import Path

import numpy as np
import torch

from data.prepare import load_meta


class TokenSplit:
    def __init__(self, folder, split: str):
        folder = Path(folder)
        meta = load_meta(folder)
        info = meta["splits"][split]
        self.shards = [np.memmap(folder / s["file"], dtype=meta["dtype"], mode="r") for s in info["shards"]]
        self.shard_starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.doc_starts = np.load(folder / f"{split}_docs.npy")
        self.n_tokens, self.bos = int(info["n_tokens"]), meta["bos"]

    def document(self, i: int) -> np.ndarray:
        """Tokens of document i, its BOS first (documents never straddle shards)."""
        start = int(self.doc_starts[i])
        end = int(self.doc_starts[i + 1]) if i + 1 < len(self.doc_starts) else self.n_tokens
        s = int(np.searchsorted(self.shard_starts, start, side="right")) - 1
        lo = start - int(self.shard_starts[s])
        return np.asarray(self.shards[s][lo : lo + end - start], dtype=np.int64)

    def documents(self) -> list[np.ndarray]:
        return [self.document(i) for i in range(len(self.doc_starts))]


def aligned_starts(doc_starts: np.ndarray, n_tokens: int, seq_len: int) -> np.ndarray:
    """Where the BOS-aligned rows of one shard start (doc_starts: its documents' starts within it, the first 0).

    A row is the seq_len + 1 tokens from its start, with its first token made BOS. A document's first row starts
    at its own BOS. A document longer than a row is not cropped (a 40K-token play would lose all but its first
    row): its rest starts later rows every seq_len tokens, each a mid-document token replaced by BOS, so every
    token is still a target once. A row that runs past its document's end continues with the following
    documents, BOS-separated as stored; those it holds whole are done, and the one it cuts starts the next row
    at its own BOS, so the cut part is read twice (at most one document's part per row, where nanochat's
    "bestfit" crops it instead). Rows that would run past the shard's end are dropped, as in the plain tiling.
    """
    ends = np.append(doc_starts[1:], n_tokens).tolist()
    starts, covered = [], 0  # covered: where the last row ends
    for s, e in zip(doc_starts.tolist(), ends, strict=True):
        if e <= covered or e - s < 2:  # held whole by the row before, or a BOS and nothing after it
            continue
        rows = range(s, e - 1, seq_len)  # each row takes at least one target from this document
        starts.extend(rows)
        covered = rows[-1] + seq_len + 1
    starts = np.asarray(starts, dtype=np.int64)
    return starts[starts + seq_len + 1 <= n_tokens]


class RowSampler:
    def __init__(self, split: TokenSplit, seq_len: int, seed: int, bos_aligned: bool = False):
        self.split, self.seq_len, self.seed = split, seq_len, seed
        self.bos, self.starts = None, None  # plain tiling: row j of a shard starts at j * seq_len
        if bos_aligned:
            self.bos, self.starts = split.bos, []
            for i, shard in enumerate(split.shards):
                lo, hi = split.shard_starts[i], split.shard_starts[i + 1]
                docs = split.doc_starts[(split.doc_starts >= lo) & (split.doc_starts < hi)] - lo
                self.starts.append(aligned_starts(docs, len(shard), seq_len))
        per_shard = (
            [len(s) for s in self.starts] if bos_aligned else [max(0, (len(s) - 1) // seq_len) for s in split.shards]
        )
        self.row_starts = np.cumsum([0] + per_shard)
        self.n_rows = int(self.row_starts[-1])
        if self.n_rows == 0:
            raise ValueError(f"the split has {split.n_tokens} tokens, fewer than one row of seq_len={seq_len} + 1")
        self._epoch, self._order = -1, None

    def _row(self, k: int) -> np.ndarray:
        epoch, i = divmod(k, self.n_rows)
        if epoch != self._epoch:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.n_rows)
            self._epoch = epoch
        r = int(self._order[i])
        s = int(np.searchsorted(self.row_starts, r, side="right")) - 1
        j = r - int(self.row_starts[s])
        lo = j * self.seq_len if self.starts is None else int(self.starts[s][j])
        return self.split.shards[s][lo : lo + self.seq_len + 1]

    def batch(self, first_row: int, n: int, device="cpu"):
        rows = np.stack([self._row(first_row + j) for j in range(n)]).astype(np.int64)
        if self.bos is not None:  # a no-op for rows at a document's start; a BOS before a long document's rest
            rows[:, 0] = self.bos
        rows = torch.from_numpy(rows)
        if device != "cpu" and torch.device(device).type == "cuda":
            rows = rows.pin_memory().to(device, non_blocking=True)
        return rows[:, :-1], rows[:, 1:]
