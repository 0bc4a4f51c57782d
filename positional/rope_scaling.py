"""Training-free context extension for rotary embeddings, chosen at eval time.

python eval.py checkpoint=out/rope eval.rope_scaling=yarn      (or linear, ntk, dynamic_ntk, all)
With s = factor (>1 to extend), d = head dim and theta_i = base^(-2i/d):
  linear       positional interpolation (Chen et al. 2023): positions / s
  ntk          NTK-aware: base' = base * s^(d/(d-2))
  dynamic_ntk  NTK with s = max(1, current length / original length), recomputed from the positions
  yarn         (Peng et al. 2023) per-frequency ramp on r_i = L_orig / wavelength_i between beta_slow=1
               and beta_fast=32: theta_i' = theta_i * ((1 - g)/s + g), g = clamp((r - 1)/(32 - 1), 0, 1),
               and cos, sin multiplied by 0.1 ln s + 1 (attention logits scaled by its square)
At s <= 1 every variant returns the plain RoPE frequencies unchanged. dynamic_ntk is meant for full forwards
(as eval.py runs them): a KV cache would hold keys rotated at the scale of the step that stored them.
"""

import math

import torch

KINDS = ("none", "linear", "ntk", "dynamic_ntk", "yarn")


def base_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def ntk_base(base: float, factor, head_dim: int):
    return base * factor ** (head_dim / (head_dim - 2))


def yarn_ramp(head_dim: int, base: float, original_length: int, beta_fast=32.0, beta_slow=1.0):
    """g_i in [0, 1]: 0 = interpolate this frequency fully, 1 = keep it (high frequencies)."""
    rotations = original_length * base_inv_freq(head_dim, base) / (2 * math.pi)  # r_i = L / wavelength_i
    return ((rotations - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)


def static_frequencies(kind: str, head_dim: int, base: float, factor: float, original_length: int):
    """(inv_freq float64 (head_dim/2,), position scale, cos/sin scale) for the length-independent variants."""
    if kind not in KINDS:
        raise ValueError(f"unknown rope scaling '{kind}'; choose one of: {', '.join(KINDS)}")
    inv_freq = base_inv_freq(head_dim, base)
    if kind in ("none", "dynamic_ntk") or factor <= 1.0:
        return inv_freq, 1.0, 1.0
    if kind == "linear":
        return inv_freq, 1.0 / factor, 1.0
    if kind == "ntk":
        return base_inv_freq(head_dim, ntk_base(base, factor, head_dim)), 1.0, 1.0
    g = yarn_ramp(head_dim, base, original_length)
    return inv_freq * ((1.0 - g) / factor + g), 1.0, 0.1 * math.log(factor) + 1.0


def dynamic_inv_freq(head_dim: int, base: float, original_length: int, length: torch.Tensor) -> torch.Tensor:
    """Dynamic NTK frequencies for the current length (a tensor: no host sync). Computed in float64 so that at
    s = 1 they equal the plain frequencies bit for bit; returned as float32."""
    s = (length.double() / original_length).clamp(min=1.0)
    exponent = torch.arange(0, head_dim, 2, device=length.device, dtype=torch.float64) / head_dim
    return ((base * s ** (head_dim / (head_dim - 2))) ** (-exponent)).float()
