"""RoPE: rotate each (query, key) pair of dimensions by an angle proportional to position (Su et al. 2021).

python train.py positional=rope positional.base=10000
Scores then depend only on q_pos - k_pos. Context-extension variants (rope_scaling.py) are set at eval time
with set_scaling(kind, factor, original_length).
"""

import torch

from . import rope_scaling
from .base import Positional


def apply_rotary(x: torch.Tensor, angles: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Rotate x (..., T, Dh) by angles (T, Dh/2): the two halves of Dh form the (real, imaginary) pairs."""
    return rotate_by(x, angles.cos() * scale, angles.sin() * scale)


def rotate_by(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class RoPE(Positional):
    name = "rope"
    relative = True
    rotary = True

    def __init__(self, n_head, head_dim, d_model, base: float = 10000.0):
        super().__init__(n_head, head_dim, d_model)
        if head_dim % 2:
            raise ValueError(f"rope needs an even head dim, got {head_dim}")
        self.base = float(base)
        self.register_buffer("inv_freq", torch.empty(head_dim // 2), persistent=False)
        self.set_scaling("none")

    def set_scaling(self, kind: str, factor: float = 1.0, original_length: int = 1):
        inv_freq, self.pos_scale, self.cos_scale = rope_scaling.static_frequencies(
            kind, self.head_dim, self.base, float(factor), int(original_length)
        )
        self.inv_freq.copy_(inv_freq.float())
        self.scaling, self.factor, self.original_length = kind, float(factor), int(original_length)
        self._memo = []

    def rotate(self, x, pos):
        cos, sin = self._cos_sin(pos)
        return rotate_by(x, cos, sin)

    def _cos_sin(self, pos):
        """cos and sin at these positions. Every layer rotates by the same position tensors, so eagerly the
        last two are remembered by identity and version (a tensor written in place is new positions; a
        compiled graph dedupes them itself)."""
        compiling = torch.compiler.is_compiling()
        for memo_pos, version, cos, sin in [] if compiling else self._memo:
            if memo_pos is pos and version == pos._version:
                return cos, sin
        inv_freq = self.inv_freq
        if self.scaling == "dynamic_ntk":
            inv_freq = rope_scaling.dynamic_inv_freq(self.head_dim, self.base, self.original_length, pos.max() + 1)
        angles = (pos.float() * self.pos_scale)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos() * self.cos_scale, angles.sin() * self.cos_scale
        if not compiling:
            self._memo = [(pos, pos._version, cos, sin)] + self._memo[:1]
        return cos, sin

    def extra_repr(self):
        return f"base={self.base}, scaling={self.scaling}, factor={self.factor}, " + super().extra_repr()
