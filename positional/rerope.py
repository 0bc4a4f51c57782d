"""ReRoPE and Leaky ReRoPE (Su 2023, kexue.fm/archives/9708): training-free context extension for rotary schemes.

python eval.py checkpoint=out/rope eval.rope_scaling=rerope                      (w = eval.rerope_window: L/2)
python eval.py checkpoint=out/rope eval.rope_scaling=leaky_rerope eval.rerope_leak=16
python sample.py checkpoint=out/rope rope_scaling=rerope                         (through the dense KV cache)
A query at i and a key at j, d = i - j, score as the scheme does at the distance
  d                 where d < w     (every distance the model saw keeps its exact score)
  w                 where d >= w    (rerope: every far key sits at the window's edge)
  w + (d - w) / k   where d >= w    (leaky_rerope, k >= 1: far distances compressed k-fold)
Far scores come from a second rotation of the same queries and keys, queries at w + (i - w) / k and keys at j / k
(rerope: w and 0): each depends on its own token alone, so keys are rotated once and a KV cache keeps them, and
scores stay translation invariant. Attention takes the near score where d < w and the far one elsewhere
(model/split_attention.py), so each key is in the softmax once.
Defaults: w = L/2 (L the training length; Su used 512 and 1024 with LLaMA-2's 4096). k = auto: the smallest k that
keeps every distance of the target length L' (eval: each eval length; sample: the cache's capacity) inside the trained
ones, w + (L' - 1 - w) / k <= L - 1 (Su's patch: k = 16, w = 512, L = 4096).
"""

import math
from dataclasses import dataclass

import torch

KINDS = ("rerope", "leaky_rerope")


def window(original_length: int, w: int | None = None) -> int:
    """The window w: the given one, or half the training length."""
    w = max(1, original_length // 2) if w is None else int(w)
    if w < 1:
        raise ValueError(f"rerope window w={w} must be >= 1 token")
    return w


def leak(kind: str, w: int, original_length: int, factor: float, k: float | None = None) -> float:
    """k of the far distances w + (d - w) / k: inf for rerope; for leaky_rerope the given k, or the smallest k >= 1
    that keeps the longest distance of a target length factor x L within the trained ones."""
    if kind == "rerope":
        return math.inf
    if k is not None:
        if k < 1:
            raise ValueError(f"leaky rerope compression k={k} must be >= 1 (1: no compression)")
        return float(k)
    longest, trained = round(factor * original_length) - 1, original_length - 1
    if longest <= w:  # no far distance at all
        return 1.0
    if trained <= w:  # the model saw no distance past w to map far ones onto: all at w, as rerope
        return math.inf
    return max(1.0, (longest - w) / (trained - w))


@dataclass(frozen=True)
class Far:
    """ReRoPE's scores as a split (model/split_attention.py): the scheme's own rotation for a key at distance d < w,
    the far rotation (part 1, queries at w + (i - w) / k, keys at j / k) for the others."""

    window: int
    leak: float
    parts = 1

    @property
    def scale(self) -> float:
        return 0.0 if math.isinf(self.leak) else 1.0 / self.leak

    def main(self, pos: torch.Tensor) -> torch.Tensor:
        return pos

    def queries(self, pos: torch.Tensor) -> list[torch.Tensor]:
        return [self.window + (pos.float() - self.window) * self.scale]

    def keys(self, pos: torch.Tensor) -> list[torch.Tensor]:
        return [pos.float() * self.scale]

    def select(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """The part a (query, key) score takes, elementwise (flex's mask_mod reads it too)."""
        return (q_pos - k_pos >= self.window).long()
