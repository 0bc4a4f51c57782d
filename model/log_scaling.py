"""Attention logits scaled by the log of the context length: training-free past the training length, or learned.

python eval.py checkpoint=out/rope eval.log_scaling=true     (a `log` row beside `none` in the length table)
python train.py model.ssmax=true                              (Scalable-Softmax, trained in)
Both multiply a query at position p (0-based; it sees the n = p + 1 positions 0..p) by a factor that depends on n
alone, so they act on every scheme and every backend the same way: the factor is applied to the (rotated) queries,
keys and values are untouched, and SDPA keeps its flash path (no dense score matrix is built for it).
  log    factor(n) = max(1, ln n / ln L), L the training length: 1 for every query within it, ln n / ln L past it
         (training-free; Chiang & Cholak 2022, "Overcoming a theoretical limitation of self-attention", scale by
         log n so that attention does not flatten as n grows; Su 2021, "entropy-invariant" attention, the scale
         log_L n relative to the trained length L, clamped at 1 here so the model is unchanged within L)
  ssmax  factor_h(n) = s_h ln n, s_h a learned scalar per head and layer (Nakanishi 2025, Scalable-Softmax, arXiv
         2501.19399: softmax(s z log n)). s starts at 0.43, the default of the public reference implementation
         (gdevos010/Scalable-Softmax), which attributes it to the paper. At n = 1 the factor is 0: one key, weight 1.
n counts positions, not keys: learned prefix tokens (positional=sink, negative positions, factor as at n = 1) and
the nothing slot of model.sink_logit (whose logit is left unscaled) are not counted, nor does a sliding window
(model.window) cap it. A sink cache gives its queries in-cache positions, as it does every relative scheme, so a
stream's factor stays at its capacity's. Only the q.k part of a logit is scaled (and Shaw's q.a, which reads the
query): an additive position bias (ALiBi, T5, KERPLE, FIRE, FoX) is not. Both are the plan's per-forward query
state (model/attention.py q_scale, log_n), made once from the explicit query positions, so a full forward, every
backend and both caches apply the same factor.
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
