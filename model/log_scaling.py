"""Attention logits scaled by the log of the context length: training-free past the training length, or learned.

python eval.py checkpoint=out/rope eval.log_scaling=true     (a `log` row beside `none` in the length table)
python train.py model.ssmax=true                              (Scalable-Softmax, trained in)
A query at position p (it sees n = p + 1 positions) is multiplied by a factor of n alone, so SDPA keeps its flash
path and every scheme, backend and cache applies the same factor (the plan's q_scale and log_n, model/attention.py):
  log    max(1, ln n / ln L), L the training length (Chiang & Cholak 2022, "Overcoming a theoretical limitation of
         self-attention"; Su 2021's entropy-invariant log_L n, clamped at 1 so the model is unchanged within L)
  ssmax  s_h ln n, s_h learned per head and layer (Nakanishi 2025, Scalable-Softmax, arXiv 2501.19399); 0 at n = 1
         (one key, weight 1). s starts at 0.43, gdevos010/Scalable-Softmax's default, which it attributes to the paper.
n counts positions, not keys: learned prefix tokens (factor as at n = 1) and the nothing slot (its logit unscaled)
are not counted, and a sliding window does not cap it; a sink cache's in-cache positions hold a stream's factor at
its capacity's. Only q.k (and Shaw's q.a) is scaled, not an additive bias (ALiBi, T5, KERPLE, FIRE, FoX).
"""

import math

import torch

SSMAX_INIT = 0.43


def log_positions(pos: torch.Tensor) -> torch.Tensor:
    """ln n, n = pos + 1 positions seen (at least 1: prefix tokens count as the first), (T, 1) fp32."""
    return torch.log((pos.float() + 1).clamp(min=1))[:, None]


def log_length_factor(pos: torch.Tensor, train_length: int) -> torch.Tensor:
    """max(1, ln(pos + 1) / ln L) at each query position, (T, 1) fp32."""
    if train_length < 2:
        raise ValueError(f"log scaling needs a training length of at least 2 tokens, got {train_length}")
    return (log_positions(pos) / math.log(train_length)).clamp(min=1.0)
