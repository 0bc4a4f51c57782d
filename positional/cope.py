"""Contextual Position Encoding (CoPE, Golovneva et al. 2024): a position counts the keys a query chooses to count.

python train.py positional=cope
gate g_ij = sigmoid(z_ij), z_ij = q_i . k_j / sqrt(d); position p_ij = the sum of the gates of the visible keys from
key j up to the query, clamped to positional.max_count ("how many keys like this one since j", not tokens);
weight = softmax_j(z_ij + q_i . e[p_ij] / sqrt(d)), e[p] interpolated between the learned vectors at floor(p) and
ceil(p). As in the paper, q . e is a (B, H, Tq, max_count + 1) table per layer: no T x T x Dh tensor. Each layer has
its own vectors, zero at init (CoPE starts as NoPE). No position is read, so a sink cache's re-indexing changes
nothing. The gates read every score of a row, so the weights are computed whole (dense on every device).
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from settings import setting

from .base import Positional, PositionalOptions, scores


class CountVectors(nn.Module):
    """One layer's position vectors e[0..max_count]; no per-token state."""

    def __init__(self, max_count: int, head_dim: int):
        super().__init__()
        self.e = nn.Parameter(torch.zeros(max_count + 1, head_dim))

    def forward(self, x):
        return None


@dataclass
class CoPEOptions(PositionalOptions):
    # counts past it share e[max_count] (the paper's npos_max)
    max_count: int = setting(64, "pass the largest count with a vector of its own", ge=1, le=2**16)


class CoPE(Positional):
    about = "CoPE: positions counted by gates on the scores (Golovneva et al. 2024)"
    Options = CoPEOptions
    relative = True  # reads no position: a shift of all of them changes nothing

    def __init__(self, n_head, head_dim, d_model, max_count: int = 64):
        super().__init__(n_head, head_dim, d_model)
        self.max_count = int(max_count)

    def layer_module(self):
        return CountVectors(self.max_count, self.head_dim)

    def counts(self, scores, hidden, plan):
        """p_ij (B, H, Tq, Tk): the gates from key j to the query, summed in order of position."""
        gates = torch.sigmoid(scores).masked_fill(hidden, 0.0)
        order = plan.key_order
        if order is None:
            return gates.flip(-1).cumsum(-1).flip(-1)
        ahead = gates[..., order[0]].flip(-1).cumsum(-1).flip(-1)  # keys sorted by position
        return ahead[..., order[1]]

    def content_weights(self, q, k, bias, state, layer, plan):
        hidden = torch.isneginf(bias)
        z = scores(q, k) + bias.masked_fill(hidden, 0.0)
        p = self.counts(z, hidden, plan).clamp(max=self.max_count)
        table = (q.float() @ layer.e.float().t()) / math.sqrt(q.size(-1))  # (B, H, Tq, max_count + 1)
        low = p.floor()
        frac = p - low
        low = low.long()
        high = (low + 1).clamp(max=self.max_count)
        z = z + table.gather(-1, low) * (1 - frac) + table.gather(-1, high) * frac
        return z.masked_fill(hidden, float("-inf")).softmax(-1)
