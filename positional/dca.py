"""Dual Chunk Attention (An et al. 2024, arXiv 2402.17463; ChunkLlama): training-free context extension for rotary
schemes that keeps every relative position within the trained ones.

python eval.py checkpoint=out/rope eval.rope_scaling=dca                     (S = eval.dca_chunk, w = eval.dca_local)
python sample.py checkpoint=out/rope rope_scaling=dca                        (through either KV cache)
The text is cut into chunks of c = S - w tokens. A key at j sits at j mod c; a query at i takes, by how many chunks
lie between them (i // c - j // c):
  0   intra        i mod c                   (its own chunk: RoPE's distances, 0..c-1)
  1   successive   min(i mod c + c, S)       (the previous chunk: the first w queries of a chunk see exact distances)
  2+  inter        min(2c - 1, S)            (every earlier chunk: one position, distances w + 1..S)
so no score uses a distance past S. S and w as the released code's chunk_size and local_window (its defaults: S =
3L/4, w = L/8 of the training length L; the paper's Fig. 2, S = 9, w = 3, gives successive queries [6, 7, 8, 9, 9,
9]). Each part is a rotation of the same queries and keys: model/split_attention.py scores each key through the
one its chunks select, in every backend and cache. No attention temperature (the paper's results use none).
"""

from dataclasses import dataclass

import torch


def sizes(original_length: int, chunk: int | None = None, local: int | None = None) -> tuple[int, int]:
    """(S, w): the given ones, or the released code's defaults 3L/4 and L/8; ValueError unless 1 <= w < S."""
    chunk = max(2, original_length * 3 // 4) if chunk is None else int(chunk)
    local = max(1, original_length // 8) if local is None else int(local)
    if not 1 <= local < chunk:
        raise ValueError(
            f"dual chunk attention: local window w={local} and chunk size S={chunk} must satisfy 1 <= w < S (chunks "
            f"of S - w tokens)"
        )
    return chunk, local


def fits(chunk: int | None, local: int | None, original_length: int) -> bool:
    """Whether sizes() takes these (a rule of eval.py's and sample.py's settings)."""
    try:
        return bool(sizes(original_length, chunk, local))
    except ValueError:
        return False


@dataclass(frozen=True)
class Chunks:
    """DCA as a split (model/split_attention.py): the intra-chunk positions are the plan's own rotation (main), the
    successive and inter-chunk queries parts 1 and 2, every key at j mod c."""

    chunk: int  # S: the largest position a score uses
    local: int  # w
    parts = 2

    @property
    def length(self) -> int:
        """c = S - w, the tokens of a chunk."""
        return self.chunk - self.local

    def main(self, pos: torch.Tensor) -> torch.Tensor:
        return pos % self.length

    def queries(self, pos: torch.Tensor) -> list[torch.Tensor]:
        c = self.length
        inter = torch.full_like(pos, min(2 * c - 1, self.chunk))
        return [(pos % c + c).clamp(max=self.chunk), inter]

    def keys(self, pos: torch.Tensor) -> list[torch.Tensor]:
        return [pos % self.length] * 2

    def select(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """0 within a chunk, 1 in the previous one, 2 further back, elementwise (flex's mask_mod reads it too)."""
        return (q_pos // self.length - k_pos // self.length).clamp(0, 2)
