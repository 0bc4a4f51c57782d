"""Learned absolute positions: a trainable vector per position added to the token embeddings (GPT-2).

python train.py positional=learned positional.max_positions=512
python train.py init_from=out/learned train.seq_len=1024     (fit_state resizes the table by interpolate_rows)
The table refuses any position past max_positions (no silent wrap or clamp). Its init std sets how much of the
residual stream is position at the start: at 0.5 the tiny model lagged at the training length.
"""

from dataclasses import dataclass

import torch
from torch import nn

from settings import setting

from .base import Positional, PositionalOptions, PositionLimitError


@dataclass
class LearnedOptions(PositionalOptions):
    max_positions: int = setting("${train.seq_len}", "pass the table size in positions", ge=1, le=2**24)
    # against token embeddings of std 1 (val loss at 150 steps: 0.5 5.39, 0.1 5.27; bench/RESULTS.md)
    init_std: float = setting(0.1, "pass a positive init std for the table", gt=0)


class Learned(Positional):
    about = "GPT-2's table of learned vectors added to the embeddings; refuses positions past it"
    Options = LearnedOptions

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

    def fit_state(self, state, prefix):
        key = f"{prefix}table.weight"  # a table of another length (init_from at a new train.seq_len): resized
        if key in state and state[key].size(0) != self.max_positions:
            state[key] = interpolate_rows(state[key], self.max_positions)


def interpolate_rows(table: torch.Tensor, n: int) -> torch.Tensor:
    """A table of N rows resized to n, as position interpolation resizes RoPE. Growing: row j is the old table at
    p = j N / n, linear between rows (exact where p is whole; the last rows repeat row N - 1). Shrinking: the first
    n rows."""
    N = table.size(0)
    if n <= N:
        return table[:n].clone()
    p = torch.arange(n, dtype=torch.float64) * N / n  # exact where whole: j N and n are integers
    lo = p.floor().long().clamp(max=N - 1)
    hi = (lo + 1).clamp(max=N - 1)
    old = table.double()
    return torch.lerp(old[lo], old[hi], (p - lo)[:, None]).to(table.dtype)  # lerp(a, b, 0) and lerp(a, a, w) are a
