"""Shaw et al. 2018: learned vectors for clipped relative distances, added to the keys in the score.

python train.py positional=shaw
score(i, j) = q_i . (k_j + a_clip(i - j)) / sqrt(d), clip(n) = min(max(n, 0), k), k = positional.max_distance.
The a term is a bias that reads the query: each layer computes the table q @ a^T / sqrt(d), (B, H, Tq, k + 1), once
and the score reads it at the clipped distance, so no T x T x Dh tensor is formed. One set of vectors serves every
head (as in the paper) and every layer. The paper also adds vectors to the values; its ablation found the key term
enough. a starts at 0: the model starts as NoPE.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from settings import setting

from .base import Positional, PositionalOptions


@dataclass
class ShawOptions(PositionalOptions):
    # farther distances share a_k (the paper saw little change for k >= 2)
    max_distance: int = setting(16, "pass a positive distance", ge=1, le=2**16)


class Shaw(Positional):
    about = "learned vectors for distances clipped to 16, added to the keys (Shaw et al. 2018)"
    Options = ShawOptions
    relative = True

    def __init__(self, n_head, head_dim, d_model, max_distance: int = 16):
        super().__init__(n_head, head_dim, d_model)
        self.max_distance = int(max_distance)
        self.a = nn.Parameter(torch.zeros(self.max_distance + 1, head_dim))

    def content_bias(self, q, state, plan):
        table = (q @ self.a.to(q.dtype).t()).float() / math.sqrt(self.head_dim)  # (B, H, Tq, k + 1)
        q_pos, k_pos, k = plan.q_pos, plan.k_pos, self.max_distance

        def bias(b, h, i, j):
            return table[b, h, i, (q_pos[i] - k_pos[j]).clamp(0, k)]

        return bias
