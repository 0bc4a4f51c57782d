"""Stick-breaking attention (Tan et al. 2024, "Scaling Stick-Breaking Attention"): no positional encoding and no
softmax; a query breaks a stick from its nearest key back.

python train.py positional=stickbreaking
beta_ij = sigmoid(q_i . k_j / sqrt(d)) over the keys before the query (not its own); weight_ij = beta_ij x prod of
(1 - beta_it) over the keys t between j and the query, so the nearest key takes its share first: order comes from the
product, not from positions. Rows sum to less than one; the rest goes to a learned vector per head (zero at init), as
the authors' released model does. Computed in log space as a cumulative sum over keys in order of position. A hidden
key takes nothing and breaks nothing. Dense, one T x T tensor per layer (the authors' Triton kernel is not used).
"""

import torch
import torch.nn.functional as F
from torch import nn

from .base import Positional, scores


class Rest(nn.Module):
    """One layer's vector per head for what a query's stick leaves; no per-token state."""

    def __init__(self, n_head: int, head_dim: int):
        super().__init__()
        self.rest = nn.Parameter(torch.zeros(n_head, head_dim))

    def forward(self, x):
        return None


class StickBreaking(Positional):
    about = "stick-breaking attention: the nearest key takes its share first, no softmax (Tan et al. 2024)"
    relative = True  # reads no position but their order

    def layer_module(self):
        return Rest(self.n_head, self.head_dim)

    def content_weights(self, q, k, bias, state, layer, plan):
        own = plan.k_pos[None, :] == plan.q_pos[:, None]  # a query's own key is not before it
        hidden = torch.isneginf(bias) | own
        z = scores(q, k) + bias.masked_fill(hidden, 0.0)
        log_beta = F.logsigmoid(z).masked_fill(hidden, float("-inf"))
        log_keep = F.logsigmoid(-z).masked_fill(hidden, 0.0)
        order = plan.key_order
        if order is not None:
            log_keep = log_keep[..., order[0]]
        after = F.pad(log_keep[..., 1:].flip(-1).cumsum(-1).flip(-1), (0, 1))  # the keys nearer the query than j
        if order is not None:
            after = after[..., order[1]]
        return (log_beta + after).exp()
