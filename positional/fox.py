"""Forgetting Transformer (FoX, Lin et al. 2025): a data-dependent forget gate per head and token as the only
positional information.

python train.py positional=fox
f_t = sigmoid(w_h . x_t + b_h) per head and token, x_t the attention layer's input (every layer its own w, b);
bias(i, j) = sum of log f_l over l = j+1..i = F_i - F_j, F the cumulative sum in order of position: a learned,
data-dependent ALiBi. It starts as ALiBi: w = 0 and log f = -m_h. The log gates are the per-token state a KV cache
keeps beside the keys, summed over the cached keys at every step (O(cache) per layer).
A sink cache re-indexes positions and the gates follow: a kept key fades by the gates of the kept tokens only, as a
fresh forward over them computes (tests/test_stream.py). The true decay through evicted tokens would fade the sinks
by every gate of the stream until they took no attention, and the sink cache would be a plain window.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .alibi import alibi_slopes
from .base import Positional


class ForgetGate(nn.Module):
    """One layer's gates: input (B, T, D) -> log f (B, H, T), fp32 (summed over the whole context)."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_head, d_model))
        m = torch.tensor(alibi_slopes(n_head))
        self.bias = nn.Parameter(-torch.log(torch.expm1(m)))  # sigmoid(b) = exp(-m)

    def forward(self, x):
        return F.logsigmoid(F.linear(x, self.weight, self.bias).float()).transpose(1, 2)


class FoX(Positional):
    about = "Forgetting Transformer: data-dependent forget gates as the only bias (Lin et al. 2025)"
    relative = True

    def __init__(self, n_head, head_dim, d_model):
        super().__init__(n_head, head_dim, d_model)
        self.state_dim = n_head

    def layer_module(self):
        return ForgetGate(self.d_model, self.n_head)

    def content_bias(self, q, log_f, plan):
        if plan.key_order is None:  # a full forward: keys in order of position, and the queries are the keys
            f_k = log_f.cumsum(-1)
            f_q = f_k.clone()  # two tensors: flex's backward refuses one tensor indexed twice in a score_mod
        else:  # a cache: slots in any order (a sink cache's ring, a static step's empty slots last)
            order, inverse = plan.key_order
            cum = log_f[..., order].cumsum(-1)
            f_k = cum[..., inverse]
            f_q = cum[..., torch.searchsorted(plan.k_pos[order], plan.q_pos)]  # a query's own key

        def bias(b, h, i, j):
            return f_q[b, h, i] - f_k[b, h, j]

        return bias
