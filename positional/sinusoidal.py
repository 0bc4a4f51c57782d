"""Fixed sinusoidal absolute positions added to the token embeddings (Vaswani et al. 2017).

python train.py positional=sinusoidal
PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)); defined at every position.
"""

import torch

from .base import Positional


class Sinusoidal(Positional):
    name = "sinusoidal"

    def __init__(self, n_head, head_dim, d_model, base: float = 10000.0):
        super().__init__(n_head, head_dim, d_model)
        inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def embed(self, x, pos):
        angles = pos.float()[:, None] * self.inv_freq[None, :]  # (T, d/2)
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # interleave sin, cos
        return x + pe[..., : x.size(-1)].to(x.dtype)
