"""FIRE: a learned function of the query-key distance, normalised by the query's position (Li et al. 2024).

python train.py positional=fire
bias(h, i, j) = f_h(psi(i - j) / psi(max(i, L))), psi(x) = log(c x + 1): f_h a small MLP per head (1 -> hidden -> 1,
ReLU), c and the threshold L learned as exp of a parameter (positive). The normaliser maps every query's context into
[0, 1], which is how FIRE interpolates past the training length. L starts at the training length, c at 0.1, f at 0
(NoPE at init). FIRE is translation invariant only while all queries sit before L.
A sink cache re-indexes positions, so the normaliser reads the query's in-cache position: a streamed query is
normalised as at the cache's length, the context it attends over. A normaliser that grew with the stream would
squeeze a fixed window towards distance 0 (tests/test_stream.py holds the cache to a fresh forward).
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from settings import setting

from .base import Positional, PositionalOptions


@dataclass
class FIREOptions(PositionalOptions):
    hidden: int = setting(32, "pass how many hidden units each head's MLP has", ge=1, le=4096)
    # a spec built in code without it (a sink's inner scheme) starts at the constructor's 512
    threshold: float = setting("${train.seq_len}", "pass FIRE's starting threshold L in positions", gt=0)
    init_c: float = setting(0.1, "pass FIRE's starting c, a positive number", gt=0)  # in psi(x) = log(c x + 1)


class FIRE(Positional):
    about = "an MLP per head of a normalised log distance (Li et al. 2024)"
    Options = FIREOptions
    relative = True

    def __init__(self, n_head, head_dim, d_model, hidden: int = 32, threshold: float = 512.0, init_c: float = 0.1):
        super().__init__(n_head, head_dim, d_model)
        self.hidden = int(hidden)
        self.log_c = nn.Parameter(torch.tensor(math.log(init_c)))
        self.log_threshold = nn.Parameter(torch.tensor(math.log(threshold)))
        # f_h(x) = w2_h . relu(w1_h x + b1_h) + b2_h, its kinks spread over [0, 1], where x lies
        self.w1 = nn.Parameter(torch.randn(n_head, self.hidden))
        self.b1 = nn.Parameter(-torch.rand(n_head, self.hidden) * self.w1.detach().abs())
        self.w2 = nn.Parameter(torch.zeros(n_head, self.hidden))
        self.b2 = nn.Parameter(torch.zeros(n_head))

    def score_bias(self, h, q_pos, k_pos):
        d = (q_pos - k_pos).clamp(min=0).float()  # causal: a future key (masked anyway) sits at distance 0
        c = self.log_c.exp()
        x = torch.log1p(c * d) / torch.log1p(c * torch.maximum(q_pos.float(), self.log_threshold.exp()))
        out = self.b2[h]
        for m in range(self.hidden):  # one unit at a time: the dense bias never holds hidden x T x T values
            out = out + self.w2[h, m] * torch.relu(self.w1[h, m] * x + self.b1[h, m])
        return out
