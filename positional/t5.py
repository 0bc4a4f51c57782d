"""T5 relative bias: a learned scalar per (distance bucket, head) added to the scores (Raffel et al. 2020).

python train.py positional=t5
Decoder (unidirectional) buckets: n = max(q - k, 0); exact for n < num_buckets/2, then logarithmic up to
max_distance, capped at the last bucket.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from settings import setting

from .base import Positional, PositionalOptions


def t5_bucket(distance: torch.Tensor, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    n = distance.clamp(min=0)
    exact = num_buckets // 2
    log_ratio = torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(n < exact, n, far)


@dataclass
class T5Options(PositionalOptions):
    num_buckets: int = setting(32, "pass at least 2 buckets", ge=2, le=2**16)
    max_distance: int = setting(128, "pass a positive distance", ge=1)


class T5(Positional):
    about = "a learned bias per log-bucketed distance and head (Raffel et al. 2020)"
    Options = T5Options
    relative = True

    def __init__(self, n_head, head_dim, d_model, num_buckets: int = 32, max_distance: int = 128):
        super().__init__(n_head, head_dim, d_model)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Parameter(torch.zeros(num_buckets, n_head))

    def score_bias(self, h, q_pos, k_pos):
        bucket = t5_bucket(q_pos - k_pos, self.num_buckets, self.max_distance)
        return self.table[bucket, h].float()
