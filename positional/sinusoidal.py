"""Fixed sinusoidal absolute positions added to the token embeddings (Vaswani et al. 2017).

python train.py positional=sinusoidal
PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)), added times `scale` (0.1). Unscaled, the
sinusoids hold a third of the residual stream's variance at the input (rms 0.71 against token embeddings of rms 1),
all of it fixed, and the tiny model lagged every other scheme at the training length (bench/RESULTS.md).
x-transformers' scaled sinusoidal embedding starts its learned scale at d^-0.5 for the same reason.
"""

from dataclasses import dataclass

import torch

from settings import setting

from .base import Positional, PositionalOptions


def frequencies(dim: int, base: float) -> torch.Tensor:
    """1 / base^(2i/dim), computed in float64, kept as float32."""
    return (base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)).float()


def sinusoids(pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """(T, 2 x len(inv_freq)): sin and cos of each position times each frequency, interleaved."""
    angles = pos.float()[:, None] * inv_freq[None, :]
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


@dataclass
class SinusoidalOptions(PositionalOptions):
    base: float = setting(10000.0, "pass a positive sinusoid base", gt=0)
    # val loss at 150 steps: 1.0 6.17, 0.3 5.31, 0.1 5.27, 0.03 5.27 (bench/RESULTS.md)
    scale: float = setting(0.1, "pass a positive scale for the sinusoids", gt=0)


class Sinusoidal(Positional):
    about = "fixed sinusoids added to the embeddings (Vaswani et al. 2017)"
    Options = SinusoidalOptions

    def __init__(self, n_head, head_dim, d_model, base: float = 10000.0, scale: float = 1.0):
        super().__init__(n_head, head_dim, d_model)
        self.scale = float(scale)  # 1.0 here, the formula's, so a checkpoint saved before the option loads as trained
        self.register_buffer("inv_freq", frequencies(d_model, base), persistent=False)

    def embed(self, x, pos):
        pe = sinusoids(self.check_axes(pos), self.inv_freq)  # (T, d)
        return x + self.scale * pe[..., : x.size(-1)].to(x.dtype)
