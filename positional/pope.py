"""PoPE (Gopalakrishnan et al. 2025, "Decoupling the What and Where with Polar Coordinate Positional Embeddings").

python train.py positional=pope
Each of a head's Dh query/key components c becomes a complex number whose magnitude is softplus(x_c) (content
alone) and whose phase is n theta_c (position alone), theta_c = base^(-c/Dh), c = 0..Dh-1: Dh frequencies over
RoPE's range where RoPE has Dh/2. The score is Re sum_c q_c conj(k_c) = sum_c |q_c||k_c| cos((n-m) theta_c + delta_hc)
with the paper's learnable phase offset delta, kept: one per query head and component, zero at init, shared by the
layers as the scheme is, and unclamped (cos is 2 pi periodic, so a clamp only picks a representative).
It is computed as a real dot product of 2Dh-dim vectors [|x| cos(phase), |x| sin(phase)]. The sum still has Dh
terms, as RoPE's has, so the logit scale stays 1/sqrt(Dh): both vectors carry 2^(1/4), cancelling the 1/sqrt(2Dh)
every backend takes from their width.
Cost against RoPE: q.k over 2Dh dims makes attention 18 L H Dh T FLOPs per token instead of 12 (1.5x; counted by
GPT.flops_per_token); q and k are twice as wide in activation memory; a dense KV cache is 1.5x (keys stored at 2Dh;
the sink cache stores them at Dh and expands them at read). Values and the output stay Dh wide.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from settings import setting

from .base import PositionalOptions
from .rope import RoPE

WIDTH_SCALE = 2**0.25  # q' . k' / sqrt(2 Dh) = sum_c |q_c||k_c| cos(...) / sqrt(Dh)


@dataclass
class PoPEOptions(PositionalOptions):
    base: float = setting(10000.0, "pass a positive rotary base", gt=0)


class PoPE(RoPE):
    about = "PoPE: magnitude from content, phase from position (Gopalakrishnan et al. 2025)"
    Options = PoPEOptions

    def __init__(self, n_head, head_dim, d_model, base=10000.0, scaling=None):
        super().__init__(n_head, head_dim, d_model, base, scaling=scaling)
        self.delta = nn.Parameter(torch.zeros(n_head, head_dim))

    def n_frequencies(self) -> int:
        return self.head_dim  # one per component, not per pair

    def freq_dim(self) -> int:
        return 2 * self.head_dim  # RoPE's frequencies of a 2Dh head are base^(-c/Dh), c = 0..Dh-1

    def rotated_dim(self) -> int:
        return 2 * self.head_dim

    def rotate(self, x, pos, rotation=None):
        """Queries (B, n_head, T, Dh): phases n theta_c + delta_hc."""
        cos, sin = self.rotation(pos) if rotation is None else rotation
        d_cos, d_sin = self.delta.cos()[:, None], self.delta.sin()[:, None]
        return polar(x, cos * d_cos - sin * d_sin, sin * d_cos + cos * d_sin)

    def rotate_key(self, x, pos, rotation=None):
        cos, sin = self.rotation(pos) if rotation is None else rotation
        return polar(x, cos, sin)


def polar(x, cos, sin):
    magnitude = F.softplus(x) * WIDTH_SCALE
    return torch.cat((magnitude * cos.to(x.dtype), magnitude * sin.to(x.dtype)), dim=-1)
