"""Context extension for rotary embeddings: a frozen Scaling value, passed to a scheme's rotation or built into a model.

python eval.py checkpoint=out/rope eval.rope_scaling=yarn      (or linear, ntk, dynamic_ntk, yarn_released, llama3, all)
python eval.py checkpoint=out/rope eval.rope_scaling=longrope  (after python -m evaluation.longrope_search ...)
python train.py init_from=out/rope train.seq_len=1024 positional.scaling=yarn positional.scaling_factor=4   (built in)
With s = factor, d = head dim, theta_i = base^(-2i/d) and r_i = L_orig theta_i / (2 pi), pair i's turns over L_orig:
  linear         positional interpolation (Chen et al. 2023): positions / s
  ntk            NTK-aware: base' = base * s^(d/(d-2))
  dynamic_ntk    NTK at s = alpha max(1, length / L_orig) - (alpha - 1) for the current length (HF's `dynamic`)
  yarn           (Peng et al. 2023, arXiv 2309.00071 Def. 2) theta_i' = theta_i ((1 - g)/s + g), g linear in r_i from 0
                 at beta_slow=1 to 1 at beta_fast=32; cos, sin multiplied by 0.1 ln s + 1 (the logits by its square)
  yarn_released  YaRN as jquesnelle/yarn and HF's `rope_type: yarn` compute it: g linear in the pair index, not in
                 r_i, between the pairs turning beta_fast and beta_slow times, rounded to whole pairs (truncate=False:
                 unrounded); the two ramps meet at their ends and differ between them
  llama3         Llama 3.1's bands: yarn's ramp at beta_fast = high_freq_factor (4), beta_slow = low_freq_factor (1),
                 with no cos/sin scale
  longrope       (Ding et al. 2024) lambda_i per pair, searched by evaluation/longrope_search.py or given by a HF dict,
                 theta_i' = theta_i / lambda_i, the first start_tokens positions unscaled; cos, sin multiplied by
                 sqrt(1 + ln s / ln L_orig) (microsoft/LongRoPE's "su" scale, as HF's Phi-3); never in eval's `all`
At s <= 1 every kind gives the plain frequencies (longrope: unless its factors are given); an explicit attn_scale (HF's
attention_factor) applies at any s. A KV cache decodes every kind exactly but dynamic_ntk, whose scale follows the
length: its cached keys would keep the scale of the step that stored them.
"""

import math
from dataclasses import dataclass
from functools import partial

import torch

from . import rerope

KINDS = ("none", "linear", "ntk", "dynamic_ntk", "yarn", "yarn_released", "llama3")  # closed form: a factor suffices
SEARCHED = ("longrope",)  # per-pair factors searched for one model and length
DCA_KINDS = ("dca",)  # positional/dca.py, imported when one is asked for: a training run never loads it
SPLITS = rerope.KINDS + DCA_KINDS  # keep the frequencies, add rotations: model/split_attention.py
ALL_KINDS = KINDS + SEARCHED + SPLITS
# the ramp kinds' default (beta_fast, beta_slow), in rotations over the original length (llama3: high, low freq factor)
RAMPS = {"yarn": (32.0, 1.0), "yarn_released": (32.0, 1.0), "llama3": (4.0, 1.0)}
SCALED = ("yarn", "yarn_released")  # cos, sin multiplied by 0.1 ln s + 1 unless attn_scale says otherwise


@dataclass(frozen=True)
class Scaling:
    """A rope scaling kind and its options: each kind's own, refused by the others; None: resolved here."""

    kind: str = "none"
    factor: float = 1.0  # s
    original_length: int = 1  # L_orig
    rescale: tuple[float, ...] | None = None  # longrope's lambda_i, one per rotary pair
    start_tokens: int = 0  # longrope's first positions, unscaled
    attn_scale: float | None = None  # the cos/sin scale in place of the kind's own
    beta_fast: float | None = None  # the ramp kinds' (None: RAMPS)
    beta_slow: float | None = None
    truncate: bool = True  # yarn_released: the ramp's ends rounded to whole pairs
    alpha: float = 1.0  # dynamic_ntk
    window: int | None = None  # rerope's w, dca's w
    leak: float | None = None  # rerope's k
    chunk: int | None = None  # dca's S

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
            fix("rescale", tuple(torch.as_tensor(self.rescale, dtype=torch.float64).flatten().tolist()))
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
        inv_freq, s = base_inv_freq(head_dim, base), self.factor
        if self.kind == "longrope" and (s > 1.0 or self.rescale is not None):
            inv_freq = inv_freq / check_rescale(self.rescale, len(inv_freq))
        elif self.kind == "ntk" and s > 1.0:
            inv_freq = base_inv_freq(head_dim, ntk_base(base, s, head_dim))
        elif self.kind in RAMPS and s > 1.0:
            g = self.kept(head_dim, base)
            inv_freq = inv_freq * ((1.0 - g) / s + g)
        pos_scale = 1.0 / s if self.kind == "linear" and s > 1.0 else 1.0
        if self.attn_scale is not None:
            return inv_freq, pos_scale, float(self.attn_scale)
        if self.kind == "longrope":
            return inv_freq, pos_scale, longrope_scale(s, self.original_length)
        return inv_freq, pos_scale, yarn_scale(s) if self.kind in SCALED else 1.0

    def kept(self, head_dim: int, base: float) -> torch.Tensor:
        """g_i of a ramp kind: 1 keeps pair i's frequency, 0 divides it by s."""
        if self.kind != "yarn_released":  # the paper's ramp, linear in r_i
            rotations = self.original_length * base_inv_freq(head_dim, base) / (2 * math.pi)
            return ((rotations - self.beta_slow) / (self.beta_fast - self.beta_slow)).clamp(0.0, 1.0)
        low = turning_pair(self.beta_fast, head_dim, base, self.original_length)
        high = turning_pair(self.beta_slow, head_dim, base, self.original_length)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        # clamped to [0, head_dim - 1] as the released code does (a bound in dims, although the ramp runs over pairs)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:  # never an empty ramp
            high += 0.001
        pairs = torch.arange(head_dim // 2, dtype=torch.float64)
        return 1.0 - ((pairs - low) / (high - low)).clamp(0.0, 1.0)


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


def base_inv_freq(head_dim: int, base, device=None) -> torch.Tensor:
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)


def full_turns(head_dim: int, base: float, length: int) -> int:
    """How many of RoPE's pairs turn a full period within length, theta_j = base^(-2j/d) >= 2 pi / L (counted in
    Python, so that a model built on the meta device has it too)."""
    return sum(base ** (-2 * j / head_dim) >= 2 * math.pi / length for j in range(head_dim // 2))


def ntk_base(base: float, factor, head_dim: int):
    return base * factor ** (head_dim / (head_dim - 2))


def turning_pair(beta: float, head_dim: int, base: float, original_length: int) -> float:
    """The (fractional) pair i that turns beta times over original_length: L base^(-2i/d) = 2 pi beta."""
    return head_dim * math.log(original_length / (2 * math.pi * beta)) / (2 * math.log(base))


def yarn_scale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's cos/sin multiplier 0.1 mscale ln s + 1 (1 at s <= 1); the logits get its square."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


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


def static_frequencies(kind: str, head_dim: int, base: float, factor: float, original_length: int, **options):
    """Scaling(kind, ...).frequencies for a kind other than the splits; options: Scaling's."""
    if kind not in KINDS + SEARCHED:
        raise ValueError(f"unknown rope scaling '{kind}'; choose one of: {', '.join(KINDS + SEARCHED)}")
    return Scaling(kind, factor, original_length, **options).frequencies(head_dim, base)


def dynamic_inv_freq(head_dim: int, base: float, original_length: int, length: torch.Tensor, alpha: float = 1.0):
    """Dynamic NTK frequencies (float32) for the current length, a tensor: no host sync. In float64 so that at s = 1
    (and alpha = 1) they equal the plain frequencies bit for bit."""
    s = alpha * (length.double() / original_length).clamp(min=1.0) - (alpha - 1.0)
    return base_inv_freq(head_dim, ntk_base(base, s, head_dim), length.device).float()


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
    """Why the extension `kind`, set by config key `key`, cannot be applied to this model, or None (eval.py's and
    sample.py's wording). trained: the model's built-in positional.scaling; off: how to ask for none instead."""
    if kind != "none" and trained:
        return (
            f"{key}={kind}: this model was trained with positional.scaling={trained}, built into it; another scaling "
            f"would replace it, not compose with it: {off or f'pass {key}=none'}"
        )
    if kind != "none" and not pe.rotary:
        return f"{key}={kind} applies to rotary schemes (rope, prope, xpos, pope, sink over rope), not {pe.name}"
    return None
