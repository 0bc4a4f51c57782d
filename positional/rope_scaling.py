"""Context extension for rotary embeddings: a Scaling value, passed to a scheme's rotation or built into a model.

python eval.py checkpoint=out/rope eval.rope_scaling=yarn      (or linear, ntk, dynamic_ntk, all)
python eval.py checkpoint=out/rope eval.rope_scaling=longrope  (after python -m evaluation.longrope_search ...)
python train.py init_from=out/rope train.seq_len=1024 positional.scaling=yarn positional.scaling_factor=4   (built in)
A Scaling is a frozen value: eval.py passes one per cell into the forward (model/variant.py), a fine-tune's
positional.scaling is built into its scheme once, and nothing rewrites a scheme's frequencies in place.
With s = factor (>1 to extend), d = head dim and theta_i = base^(-2i/d):
  linear       positional interpolation (Chen et al. 2023): positions / s
  ntk          NTK-aware: base' = base * s^(d/(d-2))
  dynamic_ntk  NTK with s = max(1, current length / original length), recomputed from the positions
  yarn         (Peng et al. 2023) per-frequency ramp on r_i = L_orig / wavelength_i between beta_slow=1
               and beta_fast=32: theta_i' = theta_i * ((1 - g)/s + g), g = clamp((r - 1)/(32 - 1), 0, 1),
               and cos, sin multiplied by 0.1 ln s + 1 (attention logits scaled by its square)
  longrope     (Ding et al. 2024) searched factors lambda_i, one per rotary pair, theta_i' = theta_i / lambda_i, and
               the first `start_tokens` positions at the unscaled theta_i; cos, sin multiplied by
               sqrt(1 + ln s / ln L_orig), so the logits are scaled by 1 + ln s / ln L_orig (the released code's "su"
               scale, microsoft/LongRoPE rope/longrope.py, as HF's Phi-3 applies it). Not closed-form: the factors
               come from evaluation/longrope_search.py, so it is a SEARCHED kind, never part of eval's `all`
At s <= 1 every variant returns the plain RoPE frequencies unchanged. dynamic_ntk is meant for full forwards
(as eval.py runs them): a KV cache would hold keys rotated at the scale of the step that stored them.
"""

import math
from dataclasses import dataclass
from functools import partial

import torch

from . import rerope

KINDS = ("none", "linear", "ntk", "dynamic_ntk", "yarn")  # closed-form: a factor is all they need
SEARCHED = ("longrope",)  # their per-pair factors are searched for one model and length, then read from a file
ALL_KINDS = KINDS + SEARCHED + rerope.KINDS  # rerope's keep the frequencies and add a far rotation (rerope.py)


@dataclass(frozen=True)
class Scaling:
    """A rope scaling kind at factor s from original_length, and its options: rescale, start_tokens, attn_scale, a
    SEARCHED kind's parameters (longrope: a factor per rotated pair, how many first positions keep the unscaled
    frequencies, its cos/sin scale, None for the default); window, leak: rerope / leaky_rerope's w and k (rerope.py),
    resolved here when not given (w = L/2, k for a target of s x L)."""

    kind: str = "none"
    factor: float = 1.0
    original_length: int = 1
    rescale: tuple[float, ...] | None = None
    start_tokens: int = 0
    attn_scale: float | None = None
    window: int | None = None
    leak: float | None = None

    def __post_init__(self):
        if self.kind not in ALL_KINDS:
            raise ValueError(f"unknown rope scaling '{self.kind}'; choose one of: {', '.join(ALL_KINDS)}")
        if self.start_tokens and self.kind not in SEARCHED:
            raise ValueError(f"start_tokens belong to a searched rope scaling ({', '.join(SEARCHED)})")
        if int(self.start_tokens) < 0:
            raise ValueError(f"start_tokens={self.start_tokens} must be >= 0")
        fix = partial(object.__setattr__, self)
        fix("factor", float(self.factor))
        fix("original_length", int(self.original_length))
        fix("start_tokens", int(self.start_tokens) if self.factor > 1.0 else 0)
        if self.rescale is not None:
            fix("rescale", tuple(float(x) for x in torch.as_tensor(self.rescale, dtype=torch.float64).flatten()))
        if self.kind in rerope.KINDS:
            fix("window", rerope.window(self.original_length, self.window))
            fix("leak", rerope.leak(self.kind, self.window, self.original_length, self.factor, self.leak))

    @property
    def far(self) -> tuple[int, float] | None:
        """ReRoPE's (w, k): keys at distance >= w score through a far rotation (rerope.py); None for the others."""
        return (self.window, self.leak) if self.kind in rerope.KINDS else None

    def frequencies(self, head_dim: int, base: float) -> tuple[torch.Tensor, float, float]:
        """(inv_freq float64 (head_dim/2,), position scale, cos/sin scale) of this scaling's static frequencies
        (dynamic_ntk: the unscaled ones, rescaled from the length at each rotation; rerope: the unscaled ones)."""
        kind = "none" if self.far else self.kind
        return static_frequencies(
            kind, head_dim, base, self.factor, self.original_length, self.rescale, self.attn_scale
        )


NONE = Scaling()


def base_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def ntk_base(base: float, factor, head_dim: int):
    return base * factor ** (head_dim / (head_dim - 2))


def yarn_ramp(head_dim: int, base: float, original_length: int, beta_fast=32.0, beta_slow=1.0):
    """g_i in [0, 1]: 0 = interpolate this frequency fully, 1 = keep it (high frequencies)."""
    rotations = original_length * base_inv_freq(head_dim, base) / (2 * math.pi)  # r_i = L / wavelength_i
    return ((rotations - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)


def longrope_scale(factor: float, original_length: int) -> float:
    """LongRoPE's cos/sin multiplier sqrt(1 + ln s / ln L_orig) (1 at s <= 1); the logits get its square."""
    if factor <= 1.0 or original_length < 2:
        return 1.0
    return math.sqrt(1.0 + math.log(factor) / math.log(original_length))


def check_rescale(rescale, pairs: int) -> torch.Tensor:
    """LongRoPE's factors as float64, or ValueError: one finite positive number per rotary pair."""
    if rescale is None:
        raise ValueError("rope scaling 'longrope' needs its searched factors (rescale=), one per rotary pair")
    lam = torch.as_tensor(rescale, dtype=torch.float64).flatten()
    if len(lam) != pairs:
        raise ValueError(f"longrope factors: {len(lam)} given for {pairs} rotary pairs; search them for this model")
    if not torch.isfinite(lam).all() or (lam <= 0).any():
        raise ValueError("longrope factors must be finite and positive (lambda_i = theta_i / theta_i')")
    return lam


def static_frequencies(
    kind: str, head_dim: int, base: float, factor: float, original_length: int, rescale=None, attn_scale=None
) -> tuple[torch.Tensor, float, float]:
    """(inv_freq float64 (head_dim/2,), position scale, cos/sin scale) for the length-independent variants;
    rescale: longrope's factors (head_dim/2 of them); attn_scale: its cos/sin scale, None for longrope_scale's."""
    if kind not in KINDS + SEARCHED:
        raise ValueError(f"unknown rope scaling '{kind}'; choose one of: {', '.join(KINDS + SEARCHED)}")
    inv_freq = base_inv_freq(head_dim, base)
    if kind == "longrope" and factor > 1.0:  # (at s <= 1 it is plain RoPE: no factors are searched for it)
        lam = check_rescale(rescale, len(inv_freq))
        scale = longrope_scale(factor, original_length) if attn_scale is None else float(attn_scale)
        return inv_freq / lam, 1.0, scale
    if kind in ("none", "dynamic_ntk", "longrope") or factor <= 1.0:
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


def equivalent_factors(kind: str, head_dim: int, base: float, factor: float, original_length: int) -> torch.Tensor:
    """A closed-form kind's frequencies as LongRoPE factors, lambda_i = theta_i / (theta_i' x position scale):
    s everywhere for linear, s^(2i/(d-2)) for ntk, 1 / ((1 - g_i)/s + g_i) for yarn. The search starts from these.
    (yarn's own cos/sin scale is not carried over: every LongRoPE candidate takes LongRoPE's.)"""
    inv_freq, pos_scale, _ = static_frequencies(kind, head_dim, base, factor, original_length)
    return base_inv_freq(head_dim, base) / (inv_freq * pos_scale)


def refusal(key: str, kind: str, pe, trained: str | None) -> str | None:
    """Why the extension `kind`, set by config key `key`, cannot be applied to this model, or None if it can. One
    wording for eval.py and sample.py: it needs a rotary scheme, and a model fine-tuned with positional.scaling
    (`trained`) has that scaling built into its frequencies, which another one would replace, not compose with."""
    if kind == "none":
        return None
    if trained:
        return (
            f"{key}={kind}: this model was trained with positional.scaling={trained}, built into it; another scaling "
            f"would replace it, not compose with it: pass {key}=none"
        )
    if not pe.rotary:
        return f"{key}={kind} applies to rotary schemes (rope, prope, xpos, pope, sink over rope), not {pe.name}"
    return None
