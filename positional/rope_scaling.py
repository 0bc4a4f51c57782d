"""Context extension for rotary embeddings: a Scaling value, passed to a scheme's rotation or built into a model.

python eval.py checkpoint=out/rope eval.rope_scaling=yarn      (or linear, ntk, dynamic_ntk, yarn_released, llama3, all)
python eval.py checkpoint=out/rope eval.rope_scaling=longrope  (after python -m evaluation.longrope_search ...)
python eval.py checkpoint=out/rope 'eval.hf_rope_scaling={rope_type: llama3, factor: 4}'   (hf_rope_scaling.py)
python train.py init_from=out/rope train.seq_len=1024 positional.scaling=yarn positional.scaling_factor=4   (built in)
A Scaling is a frozen value: nothing rewrites a scheme's frequencies in place. With s = factor, d = head dim,
theta_i = base^(-2i/d) and r_i = L_orig theta_i / (2 pi), the rotations pair i makes over the original length:
  linear         positional interpolation (Chen et al. 2023): positions / s
  ntk            NTK-aware: base' = base * s^(d/(d-2))
  dynamic_ntk    NTK with s = alpha x max(1, current length / L_orig) - (alpha - 1), recomputed from the positions
                 (HF transformers' `dynamic` reads its `factor` as alpha)
  yarn           (Peng et al. 2023, arXiv 2309.00071 Def. 2) theta_i' = theta_i ((1 - g)/s + g), g linear in r_i from 0
                 at beta_slow=1 to 1 at beta_fast=32; cos, sin multiplied by 0.1 ln s + 1 (the logits by its square)
  yarn_released  YaRN as its released code (jquesnelle/yarn) and HF's `rope_type: yarn` compute it: the ramp linear in
                 the pair index, not in r_i, between the pairs that turn beta_fast and beta_slow times over L_orig,
                 rounded to whole pairs (truncate=False: unrounded). Both ramps meet at their ends, differ between them
  llama3         Llama 3.1's wavelength bands (low_freq_factor 1, high_freq_factor 4): yarn's ramp in r_i with
                 beta_fast = high and beta_slow = low; no cos/sin scale
  longrope       (Ding et al. 2024) searched factors lambda_i, one per rotary pair, theta_i' = theta_i / lambda_i, the
                 first `start_tokens` positions unscaled; cos, sin multiplied by sqrt(1 + ln s / ln L_orig) (the
                 released code's "su" scale, microsoft/LongRoPE, as HF's Phi-3 applies it). Its factors come from
                 evaluation/longrope_search.py or a HF dict: a SEARCHED kind, never part of eval's `all`
At s <= 1 every kind gives the plain frequencies (longrope: unless its factors are given); an explicit attn_scale (HF's
attention_factor) applies at any s. dynamic_ntk is for full forwards: a KV cache would hold keys rotated at the scale
of the step that stored them. Every other kind rotates at fixed frequencies, so a KV cache decodes it exactly.
"""

import math
from dataclasses import dataclass
from functools import partial

import torch

from . import rerope

# closed-form: a factor is all they need
KINDS = ("none", "linear", "ntk", "dynamic_ntk", "yarn", "yarn_released", "llama3")
SEARCHED = ("longrope",)  # per-pair factors searched for one model and length
DCA_KINDS = ("dca",)  # positional/dca.py, imported when one is asked for: a training run never loads it
SPLITS = rerope.KINDS + DCA_KINDS  # keep the frequencies, add rotations: model/split_attention.py
ALL_KINDS = KINDS + SEARCHED + SPLITS
# the ramp kinds' default (beta_fast, beta_slow), in rotations over the original length (llama3: high, low freq factor)
RAMPS = {"yarn": (32.0, 1.0), "yarn_released": (32.0, 1.0), "llama3": (4.0, 1.0)}
SCALED = ("yarn", "yarn_released")  # cos, sin multiplied by 0.1 ln s + 1 unless attn_scale says otherwise


@dataclass(frozen=True)
class Scaling:
    """A rope scaling kind at factor s from original_length, and its options: rescale and start_tokens (longrope's
    per-pair factors and unscaled first positions); attn_scale, the cos/sin scale in place of the kind's own (None:
    the kind's); beta_fast, beta_slow (None: RAMPS); truncate (yarn_released); alpha (dynamic_ntk); window, leak
    (rerope's w and k), chunk, window (dca's S and w), resolved here when not given."""

    kind: str = "none"
    factor: float = 1.0
    original_length: int = 1
    rescale: tuple[float, ...] | None = None
    start_tokens: int = 0
    attn_scale: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    truncate: bool = True
    alpha: float = 1.0
    window: int | None = None
    leak: float | None = None
    chunk: int | None = None

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
        if self.kind in RAMPS:
            fast, slow = RAMPS[self.kind]
            fix("beta_fast", float(fast if self.beta_fast is None else self.beta_fast))
            fix("beta_slow", float(slow if self.beta_slow is None else self.beta_slow))
        check_options(self)
        if self.kind in rerope.KINDS:
            fix("window", rerope.window(self.original_length, self.window))
            fix("leak", rerope.leak(self.kind, self.window, self.original_length, self.factor, self.leak))
        if self.kind in DCA_KINDS:
            from . import dca

            chunk, local = dca.sizes(self.original_length, self.chunk, self.window)
            fix("chunk", chunk)
            fix("window", local)

    @property
    def split(self):
        """How a split kind scores through several rotations (rerope.Far, dca.Chunks), or None."""
        if self.kind in rerope.KINDS:
            return rerope.Far(self.window, self.leak)
        if self.kind in DCA_KINDS:
            from . import dca

            return dca.Chunks(self.chunk, self.window)
        return None

    def frequencies(self, head_dim: int, base: float) -> tuple[torch.Tensor, float, float]:
        """(inv_freq float64 (head_dim/2,), position scale, cos/sin scale) of the static frequencies (dynamic_ntk,
        rerope, dca: the unscaled ones); the cos/sin scale is attn_scale where given, else the kind's own."""
        inv_freq, pos_scale, scale = self.own_frequencies(head_dim, base)
        return inv_freq, pos_scale, scale if self.attn_scale is None else float(self.attn_scale)

    def own_frequencies(self, head_dim: int, base: float) -> tuple[torch.Tensor, float, float]:
        """frequencies() with the kind's own cos/sin scale."""
        inv_freq = base_inv_freq(head_dim, base)
        if self.kind == "longrope" and (self.factor > 1.0 or self.rescale is not None):
            return (
                inv_freq / check_rescale(self.rescale, len(inv_freq)),
                1.0,
                longrope_scale(self.factor, self.original_length),
            )
        if self.kind in ("none", "dynamic_ntk", "longrope", *SPLITS) or self.factor <= 1.0:
            return inv_freq, 1.0, 1.0
        if self.kind == "linear":
            return inv_freq, 1.0 / self.factor, 1.0
        if self.kind == "ntk":
            return base_inv_freq(head_dim, ntk_base(base, self.factor, head_dim)), 1.0, 1.0
        g = self.kept(head_dim, base)
        return inv_freq * ((1.0 - g) / self.factor + g), 1.0, yarn_scale(self.factor) if self.kind in SCALED else 1.0

    def kept(self, head_dim: int, base: float) -> torch.Tensor:
        """g_i of a ramp kind: 1 keeps pair i's frequency, 0 divides it by s, between them theta_i ((1 - g)/s + g)."""
        if self.kind == "yarn_released":
            dims = released_dims(head_dim, base, self.original_length, self.beta_fast, self.beta_slow, self.truncate)
            return 1.0 - released_ramp(head_dim // 2, *dims)
        return yarn_ramp(head_dim, base, self.original_length, self.beta_fast, self.beta_slow)


def check_options(scaling: Scaling):
    """ValueError where an option is given to a kind that does not read it, or is out of its range."""
    kind = scaling.kind
    if kind in RAMPS and not 0 < scaling.beta_slow < scaling.beta_fast:
        raise ValueError(
            f"rope scaling '{kind}': beta_slow={scaling.beta_slow:g} and beta_fast={scaling.beta_fast:g} must "
            f"satisfy 0 < beta_slow < beta_fast (rotations over the original length)"
        )
    if kind not in RAMPS and (scaling.beta_fast, scaling.beta_slow) != (None, None):
        raise ValueError(f"beta_fast, beta_slow bound the ramp of {', '.join(RAMPS)}, not of '{kind}'")
    if not scaling.truncate and kind != "yarn_released":
        raise ValueError(f"truncate=False is an option of yarn_released's ramp, not of '{kind}'")
    if scaling.alpha != 1.0 and kind != "dynamic_ntk":
        raise ValueError(f"alpha is dynamic_ntk's factor, not an option of '{kind}'")
    if not scaling.alpha > 0:
        raise ValueError(f"dynamic_ntk's alpha={scaling.alpha} must be > 0")
    if scaling.leak is not None and kind not in rerope.KINDS or scaling.chunk is not None and kind not in DCA_KINDS:
        raise ValueError(f"leak is leaky_rerope's and chunk dca's, not options of '{kind}'")
    if scaling.window is not None and kind not in SPLITS:
        raise ValueError(f"window is an option of {', '.join(SPLITS)}, not of '{kind}'")
    if scaling.attn_scale is not None and not scaling.attn_scale > 0:
        raise ValueError(f"attn_scale={scaling.attn_scale} must be > 0 (it multiplies cos and sin)")


NONE = Scaling()


def base_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def ntk_base(base: float, factor, head_dim: int):
    return base * factor ** (head_dim / (head_dim - 2))


def yarn_scale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's cos/sin multiplier 0.1 mscale ln s + 1 (1 at s <= 1); the logits get its square."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_ramp(head_dim: int, base: float, original_length: int, beta_fast=32.0, beta_slow=1.0):
    """g_i in [0, 1], linear in r_i = L / wavelength_i: 0 interpolates the frequency fully, 1 keeps it."""
    rotations = original_length * base_inv_freq(head_dim, base) / (2 * math.pi)
    return ((rotations - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)


def turning_pair(beta: float, head_dim: int, base: float, original_length: int) -> float:
    """The (fractional) pair index i whose frequency turns beta times over original_length: L theta_i = 2 pi beta,
    theta_i = base^(-2i/d), so i = d ln(L / (2 pi beta)) / (2 ln base)."""
    return head_dim * math.log(original_length / (2 * math.pi * beta)) / (2 * math.log(base))


def released_dims(head_dim, base, original_length, beta_fast, beta_slow, truncate=True) -> tuple[float, float]:
    """The released code's ramp ends in pairs, widened to whole pairs unless truncate is off, clamped to
    [0, head_dim - 1] (the released code's bound, in dims although the ramp runs over pairs), never empty."""
    low = turning_pair(beta_fast, head_dim, base, original_length)
    high = turning_pair(beta_slow, head_dim, base, original_length)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    return low, high + 0.001 if low == high else high


def released_ramp(pairs: int, low: float, high: float) -> torch.Tensor:
    """(pairs,) 0 at pair index i <= low (kept), rising linearly in i to 1 at i >= high (interpolated)."""
    return ((torch.arange(pairs, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)


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
    kind: str, head_dim: int, base: float, factor: float, original_length: int, **options
) -> tuple[torch.Tensor, float, float]:
    """Scaling(kind, ...).frequencies for a kind other than rerope's; options: Scaling's."""
    if kind not in KINDS + SEARCHED:
        raise ValueError(f"unknown rope scaling '{kind}'; choose one of: {', '.join(KINDS + SEARCHED)}")
    return Scaling(kind, factor, original_length, **options).frequencies(head_dim, base)


def dynamic_inv_freq(
    head_dim: int, base: float, original_length: int, length: torch.Tensor, alpha: float = 1.0
) -> torch.Tensor:
    """Dynamic NTK frequencies (float32) for the current length, a tensor: no host sync. base' = base (alpha n / L -
    (alpha - 1))^(d/(d-2)), n at least L, as HF's dynamic factor; in float64 so that at s = 1 (and alpha = 1) they
    equal the plain frequencies bit for bit."""
    s = (length.double() / original_length).clamp(min=1.0)
    s = alpha * s - (alpha - 1.0)
    exponent = torch.arange(0, head_dim, 2, device=length.device, dtype=torch.float64) / head_dim
    return ((base * s ** (head_dim / (head_dim - 2))) ** (-exponent)).float()


def equivalent_factors(kind: str, head_dim: int, base: float, factor: float, original_length: int) -> torch.Tensor:
    """A closed-form kind's frequencies as LongRoPE factors, lambda_i = theta_i / (theta_i' x position scale), where
    the search starts. yarn's cos/sin scale is not carried over: every LongRoPE candidate takes LongRoPE's."""
    inv_freq, pos_scale, _ = static_frequencies(kind, head_dim, base, factor, original_length)
    return base_inv_freq(head_dim, base) / (inv_freq * pos_scale)


def scheme_factors(pe, kind: str, factor: float, original_length: int) -> torch.Tensor:
    """equivalent_factors for a rotary scheme (or a sink over one): one per pair it rotates (LongRoPE's search)."""
    rope = getattr(pe, "inner", pe)
    return equivalent_factors(kind, rope.freq_dim(), rope.base, float(factor), int(original_length))


def refusal(key: str, kind: str, pe, trained: str | None, off: str | None = None) -> str | None:
    """Why the extension `kind`, set by config key `key`, cannot be applied to this model, or None; eval.py's and
    sample.py's wording. trained: the model's built-in positional.scaling; off: how to ask for none instead."""
    if kind == "none":
        return None
    if trained:
        return (
            f"{key}={kind}: this model was trained with positional.scaling={trained}, built into it; another scaling "
            f"would replace it, not compose with it: {off or f'pass {key}=none'}"
        )
    if not pe.rotary:
        return f"{key}={kind} applies to rotary schemes (rope, prope, xpos, pope, sink over rope), not {pe.name}"
    return None
