"""Reading prepared token shards: training rows in a seeded shuffled order, and whole held-out documents.

Used by train.py (RowSampler) and eval.py (TokenSplit.documents). A row is seq_len + 1 consecutive tokens
(inputs and shifted targets); rows tile each shard without overlap except that one token. Row k of a run is a
pure function of (seed, k), so the data position saved in a checkpoint is just the count of rows consumed,
and DDP ranks read disjoint rows of the same order.
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


class RowSampler:
    def __init__(self, split: TokenSplit, seq_len: int, seed: int):
        self.split, self.seq_len, self.seed = split, seq_len, seed
        per_shard = [max(0, (len(s) - 1) // seq_len) for s in split.shards]
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
        lo = (r - int(self.row_starts[s])) * self.seq_len
        return self.split.shards[s][lo : lo + self.seq_len + 1]

    def batch(self, first_row: int, n: int, device="cpu"):
        rows = torch.from_numpy(np.stack([self._row(first_row + j) for j in range(n)]).astype(np.int64))
        if device != "cpu" and torch.device(device).type == "cuda":
            rows = rows.pin_memory().to(device, non_blocking=True)
        return rows[:, :-1], rows[:, 1:]
