"""Learned absolute positions: a trainable vector per position added to the token embeddings (GPT-2).

python train.py positional=learned positional.max_positions=512
The table covers max_positions positions and refuses any position past it (no silent wrap or clamp).
Its init std (init_std, configs/positional/learned.yaml: 0.1 against token embeddings of std 1) sets how much
of the residual stream is position at the start: at 0.5 the tiny model lagged at the training length.
"""

import torch
from torch import nn

from .base import Positional, PositionLimitError


class Learned(Positional):
    name = "learned"

    def __init__(self, n_head, head_dim, d_model, max_positions: int, init_std: float = 0.1):
        super().__init__(n_head, head_dim, d_model)
        self.max_positions = int(max_positions)
        self.table = nn.Embedding(self.max_positions, d_model)
        nn.init.normal_(self.table.weight, std=init_std)

    def embed(self, x, pos):
        # entry points check lengths up front (no sync, no graph break); this guards direct calls
        if not torch.compiler.is_compiling() and pos.numel():
            if int(pos.min()) < 0:
                raise PositionLimitError(f"positional=learned got a negative position {int(pos.min())}")
            self.check_length(int(pos.max()) + 1)
        return x + self.table(pos).to(x.dtype)
