"""A Hugging Face `rope_scaling` dict, as a model's config.json holds it, and the Scaling transformers computes from it.

python eval.py checkpoint=out/rope 'eval.hf_rope_scaling={rope_type: yarn, factor: 4, beta_fast: 32, beta_slow: 1}'
python sample.py checkpoint=out/rope 'hf_rope_scaling={rope_type: llama3, factor: 8}'
A key the rope_type does not read (transformers warns and ignores it) is refused. scaling() computes what transformers
does (modeling_rope_utils.py, 5.x) with L = original_max_position_embeddings (omitted: the checkpoint's training
length; transformers: max_position_embeddings) and s = factor:
  default   none
  linear    linear at s (transformers divides the frequencies by s, PI the positions: the same angles)
  dynamic   dynamic_ntk with alpha = s
  yarn      yarn_released (the released code's ramp, not the paper's), cos, sin multiplied by attention_factor, else
            by (0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1) where both are non-zero, else by 0.1 ln s + 1
  longrope  longrope with short_factor up to L and long_factor past it; factor omitted: the length scored / L
  llama3    llama3 with low_freq_factor (1), high_freq_factor (4)
The length scored is eval.py's eval length, or sample.py's cache capacity: transformers switches longrope's factors
as the sequence grows, which a KV cache would mix; one set per row keeps every cached key at one frequency.
"""

from dataclasses import dataclass, fields
from typing import ClassVar

from omegaconf import DictConfig, OmegaConf

from settings import Rule, choices, setting

from .rope_scaling import NONE, RAMPS, Scaling, longrope_scale, scheme_factors, yarn_scale

RopeType = choices("RopeType", "default", "linear", "dynamic", "yarn", "longrope", "llama3")
KIND = {"default": "none", "dynamic": "dynamic_ntk", "yarn": "yarn_released"}  # the others: the rope type's own name
READ_BY = {  # key -> the rope types that read it
    "factor": ("linear", "dynamic", "yarn", "longrope", "llama3"),
    "original_max_position_embeddings": ("dynamic", "yarn", "longrope", "llama3"),
    **dict.fromkeys(("low_freq_factor", "high_freq_factor"), ("llama3",)),
    **dict.fromkeys(("beta_fast", "beta_slow"), ("yarn",)),
    **dict.fromkeys(("short_factor", "long_factor"), ("longrope",)),
    "attention_factor": ("yarn", "longrope"),
    **dict.fromkeys(("mscale", "mscale_all_dim", "truncate"), ("yarn",)),
}
NEED_FACTOR = ("linear", "dynamic", "yarn", "llama3")  # transformers requires it; longrope derives it from lengths


def named_type(rope_type, legacy) -> str:
    """rope_type, else its legacy name type, else transformers' default."""
    return str(rope_type or legacy or "default")


def read_rule(key: str) -> Rule:
    """The rule that refuses key under a rope type that does not read it."""
    types = READ_BY[key]
    return Rule(
        (key, "rope_type", "type"),
        lambda value, rope_type, legacy: value is None or named_type(rope_type, legacy) in types,
        f"{{0}} is read by rope_type {' or '.join(types)} only (transformers would ignore it here); drop it, or "
        f"name {'that rope_type' if len(types) == 1 else 'one of them'}",
    )


def ordered(high, low, kind: str) -> bool:
    """Whether a ramp's upper bound is above its lower one, each the kind's default (RAMPS) where not given."""
    default_high, default_low = RAMPS[kind]
    return (default_high if high is None else high) > (default_low if low is None else low)


@dataclass
class HFRopeScaling:
    """A rope_scaling dict of Hugging Face transformers (every key null: none given)."""

    rope_type: RopeType | None = None  # rope_type and type both null: default
    type: RopeType | None = None  # the legacy name of rope_type (older config.json files)
    factor: float | None = setting(None, "pass the extension factor s >= 1, e.g. factor: 4", ge=1)
    original_max_position_embeddings: int | None = setting(
        None,
        "pass the length the unscaled frequencies were trained at, or omit it for the checkpoint's",
        ge=2,
        le=2**24,  # the longest length taken (utils/schema.py MAX_TOKENS)
    )
    low_freq_factor: float | None = setting(None, "pass llama3's low_freq_factor, e.g. 1", gt=0)  # null: 1
    high_freq_factor: float | None = setting(None, "pass llama3's high_freq_factor, e.g. 4", gt=0)  # null: 4
    beta_fast: float | None = setting(None, "pass yarn's beta_fast in rotations, e.g. 32", gt=0)  # null: 32
    beta_slow: float | None = setting(None, "pass yarn's beta_slow in rotations, e.g. 1", gt=0)  # null: 1
    short_factor: list[float] | None = setting(  # longrope, up to the original length
        None, "pass one positive factor per rotary pair, e.g. short_factor: [1.0, 1.0, ...]", gt=0, nonempty=True
    )
    long_factor: list[float] | None = setting(  # longrope, past the original length
        None, "pass one positive factor per rotary pair, e.g. long_factor: [1.0, 1.5, ...]", gt=0, nonempty=True
    )
    attention_factor: float | None = setting(None, "pass a positive multiplier of cos and sin, e.g. 1.1", gt=0)
    mscale: float | None = setting(None, "pass yarn's mscale, e.g. 1 (with mscale_all_dim)", ge=0)
    mscale_all_dim: float | None = setting(None, "pass yarn's mscale_all_dim, e.g. 1 (with mscale)", ge=0)
    truncate: bool | None = None  # yarn: the ramp's ends rounded to whole pairs; null: true

    RULES: ClassVar = (
        Rule(
            ("rope_type", "type"),
            lambda rope_type, legacy: rope_type is None or legacy is None or rope_type == legacy,
            "{0} and {1} name two rope types; pass one (type is rope_type's legacy name)",
        ),
        *(read_rule(key) for key in READ_BY),
        Rule(
            ("factor", "rope_type", "type"),
            lambda factor, rope_type, legacy: factor is not None or named_type(rope_type, legacy) not in NEED_FACTOR,
            "{0}: this rope_type needs it (transformers requires it for linear, dynamic, yarn and llama3); pass "
            "factor: s, e.g. 4",
        ),
        Rule(
            ("short_factor", "long_factor", "rope_type", "type"),
            lambda short, long, name, legacy: named_type(name, legacy) != "longrope" or None not in (short, long),
            "{0} and {1}: rope_type longrope needs both, one factor per rotary pair",
        ),
        Rule(
            ("high_freq_factor", "low_freq_factor"),
            lambda high, low: ordered(high, low, "llama3"),
            "{0} must be above {1} (null: 4 and 1): the band between them is where frequencies are blended",
        ),
        Rule(
            ("beta_fast", "beta_slow"),
            lambda fast, slow: ordered(fast, slow, "yarn_released"),
            "{0} must be above {1} (null: 32 and 1): the ramp runs from the pairs turning beta_slow times over the "
            "original length to those turning beta_fast times",
        ),
        Rule(
            ("mscale", "mscale_all_dim"),
            lambda mscale, all_dim: (mscale is None) == (all_dim is None),
            "{0} and {1}: transformers reads them only as a pair, the cos/sin scale being (0.1 mscale ln s + 1) / "
            "(0.1 mscale_all_dim ln s + 1); pass both, or attention_factor",
        ),
    )


def given(hf) -> bool:
    """Whether any key is set."""
    return hf is not None and any(getattr(hf, f.name) is not None for f in fields(HFRopeScaling))


def rope_type(hf) -> str:
    return named_type(hf.rope_type, hf.type)


def kind(hf) -> str:
    return KIND.get(rope_type(hf), rope_type(hf))


def row_name(hf) -> str:
    return f"hf_{rope_type(hf)}"


def as_dict(hf) -> dict:
    """The keys given, as plain values (for a result file)."""
    plain = OmegaConf.to_container(hf, enum_to_str=True) if isinstance(hf, DictConfig) else vars(hf)
    return {k: v for k, v in plain.items() if v is not None}


def yarn_attention(hf, factor: float) -> float:
    if hf.attention_factor is not None:
        return float(hf.attention_factor)
    if hf.mscale and hf.mscale_all_dim:
        return yarn_scale(factor, hf.mscale) / yarn_scale(factor, hf.mscale_all_dim)
    return yarn_scale(factor)


def scaling(hf, train_length: int, length: int, pe, key: str) -> Scaling:
    """The Scaling transformers computes for this dict, scoring `length` tokens of a model trained at train_length;
    key: the setting that holds the dict, for its errors."""
    which, original = rope_type(hf), hf.original_max_position_embeddings or train_length
    factor = hf.factor if hf.factor is not None else length / original  # only longrope may omit it
    if which == "default":
        return NONE
    if which == "linear":
        return Scaling("linear", factor, original)
    if which == "dynamic":
        return Scaling("dynamic_ntk", factor, original, alpha=factor)
    if which == "llama3":
        return Scaling("llama3", factor, original, beta_fast=hf.high_freq_factor, beta_slow=hf.low_freq_factor)
    if which == "yarn":
        ramp = {"beta_fast": hf.beta_fast, "beta_slow": hf.beta_slow, "truncate": hf.truncate is not False}
        return Scaling("yarn_released", factor, original, attn_scale=yarn_attention(hf, factor), **ramp)
    name = "short_factor" if length <= original else "long_factor"
    factors, pairs = list(getattr(hf, name)), len(scheme_factors(pe, "none", 1.0, 2))  # one per rotary pair
    if len(factors) != pairs:
        raise ValueError(
            f"{key}.{name} holds {len(factors)} factors and this model rotates {pairs} pairs per head; pass "
            f"{pairs}, one per pair"
        )
    scale = longrope_scale(factor, original) if hf.attention_factor is None else hf.attention_factor
    return Scaling("longrope", factor, original, rescale=factors, attn_scale=scale)
