"""PoPE (Gopalakrishnan et al. 2025, "Decoupling the What and Where with Polar Coordinate Positional Embeddings").

python train.py positional=pope
Each of a head's Dh query/key components c becomes a complex number of magnitude softplus(x_c) (content alone) and
phase n theta_c (position alone), theta_c = base^(-c/Dh): Dh frequencies where RoPE has Dh/2. The score is
sum_c |q_c||k_c| cos((n-m) theta_c + delta_hc), delta the paper's learnable phase offset (per head and component,
zero at init, unclamped), computed as a real dot product of 2Dh-wide vectors [|x| cos, |x| sin]. The sum has Dh
terms, so both vectors carry 2^(1/4) to keep the logit scale 1/sqrt(Dh).
Cost against RoPE: attention 18 L H Dh T FLOPs per token instead of 12 (GPT.flops_per_token); q and k twice as wide;
a dense KV cache 1.5x (the sink cache stores keys at Dh and expands them at read).
"""

import torch
import torch.nn.functional as F
from torch import nn

from .rope import BaseOptions, RoPE

WIDTH_SCALE = 2**0.25  # q' . k' / sqrt(2 Dh) = sum_c |q_c||k_c| cos(...) / sqrt(Dh)


class PoPE(RoPE):
    about = "PoPE: magnitude from content, phase from position (Gopalakrishnan et al. 2025)"
    Options = BaseOptions

    def __init__(self, n_head, head_dim, d_model, base=10000.0, scaling=None):
        super().__init__(n_head, head_dim, d_model, base, scaling=scaling)
        self.delta = nn.Parameter(torch.zeros(n_head, head_dim))

    def freq_dim(self) -> int:
        return 2 * self.head_dim  # RoPE's frequencies of a 2Dh head are base^(-c/Dh), c = 0..Dh-1

    def rotated_dim(self) -> int:
        return 2 * self.head_dim

    def rotate(self, x, pos, rotation=None):
        """Queries: phases n theta_c + delta_hc."""
        cos, sin = self.rotation(pos) if rotation is None else rotation
        d_cos, d_sin = self.delta.cos()[:, None], self.delta.sin()[:, None]
        return polar(x, cos * d_cos - sin * d_sin, sin * d_cos + cos * d_sin)

    def rotate_key(self, x, pos, rotation=None):
        cos, sin = self.rotation(pos) if rotation is None else rotation
        return polar(x, cos, sin)


def polar(x, cos, sin):
    magnitude = F.softplus(x) * WIDTH_SCALE
    return torch.cat((magnitude * cos.to(x.dtype), magnitude * sin.to(x.dtype)), dim=-1)
