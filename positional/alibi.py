"""ALiBi: a per-head linear penalty on query-key distance, added to the attention scores (Press et al. 2022).

python train.py positional=alibi
bias(h, i, j) = -m_h * (i - j), not scaled by 1/sqrt(d); m_k = 2^(-8k/n) for n heads, n a power of two (else the
paper's interleaving of the nearest powers' slopes).
"""

import math

import torch

from .base import Positional


def alibi_slopes(n_head: int) -> list[float]:
    def power_of_two(n):
        return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

    if n_head & (n_head - 1) == 0:
        return power_of_two(n_head)
    c = 2 ** math.floor(math.log2(n_head))
    return power_of_two(c) + power_of_two(2 * c)[0::2][: n_head - c]


class ALiBi(Positional):
    about = "a per-head linear distance penalty on the scores (Press et al. 2022)"
    relative = True

    def __init__(self, n_head, head_dim, d_model):
        super().__init__(n_head, head_dim, d_model)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_head)), persistent=False)

    def score_bias(self, h, q_pos, k_pos):
        return -self.slopes[h] * (q_pos - k_pos).float()
