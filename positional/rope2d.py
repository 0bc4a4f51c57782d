"""Axial 2D RoPE: half of each head's rotary pairs turn with the row index, half with the column index.

python train.py data=grids positional=rope2d          (positions (2, T): row, column; data/grids.py)
The first Dh/4 pairs turn with the row, the last Dh/4 with the column, each half at the frequencies of a head half
as wide, so both axes span RoPE's whole range (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer").
A score depends only on the (dy, dx) offset: a grid larger than any trained on brings new offsets, never new
positions. A (T,) position (a text token) sits on the diagonal (p, p). Rotation, caches and scaling are RoPE's.
"""

import torch

from .rope import BaseOptions, RoPE


class RoPE2D(RoPE):
    about = "axial 2D RoPE over (row, column) positions (Heo et al. 2024)"
    Options = BaseOptions
    axes = 2

    def __init__(self, n_head, head_dim, d_model, base: float = 10000.0, scaling=None):
        if head_dim % 4:
            raise ValueError(
                f"positional=rope2d gives half of each head's rotary pairs to rows and half to columns: it needs a "
                f"head dim divisible by 4, got {head_dim}; change model.d_model or model.n_head"
            )
        super().__init__(n_head, head_dim, d_model, base, scaling=scaling)
        half = head_dim // 4
        self.register_buffer("pair_axis", torch.arange(2).repeat_interleave(half), persistent=False)

    def freq_dim(self) -> int:
        return self.head_dim // 2

    def arrange(self, inv_freq):
        """The row's pairs, then the column's, at the same frequencies."""
        return torch.cat((inv_freq, inv_freq))
