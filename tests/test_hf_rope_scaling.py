"""Llama 3.1's bands, YaRN as released beside the paper's, dynamic NTK's factor, and Hugging Face rope_scaling dicts.

python -m pytest -q tests/test_hf_rope_scaling.py
Every expected value is written out here from its source (Llama 3.1's release and transformers'
modeling_rope_utils.py _compute_*_parameters; the YaRN paper, arXiv 2309.00071; jquesnelle/yarn) in plain Python
floats, never by calling the code under test. With transformers importable (it is not a requirement), its
ROPE_INIT_FUNCTIONS are compared too.
"""

import json
import math

import pytest
import torch
from conftest import ROOT, assert_decoding_equals_full_forward, random_model, run
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from evaluation import compare, length, variants
from positional import hf_rope_scaling
from positional.hf_rope_scaling import HFRopeScaling
from positional.rope import RoPE
from positional.rope_scaling import Scaling, dynamic_inv_freq, static_frequencies
from utils import checks, runtime
from utils.errors import UserError, compose_message

# ---- the formulas, from their sources ----


def plain(d: int, base: float) -> list[float]:
    return [base ** (-2 * i / d) for i in range(d // 2)]


def llama3_reference(d, base, s, low, high, original) -> list[float]:
    """Llama 3.1 (and transformers' llama3): by wavelength 2 pi / theta, keep those below original / high, divide by
    s those above original / low, and between them blend with smooth = (original / wavelength - low) / (high - low)."""
    out = []
    for theta in plain(d, base):
        wavelength = 2 * math.pi / theta
        if wavelength < original / high:
            out.append(theta)
        elif wavelength > original / low:
            out.append(theta / s)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append((1 - smooth) * theta / s + smooth * theta)
    return out


def paper_yarn_reference(d, base, s, original, beta_fast=32.0, beta_slow=1.0) -> list[float]:
    """The paper's Definition 2: r = original / wavelength; gamma 0 below beta_slow (interpolate), 1 above beta_fast
    (keep), linear in r between; theta' = (1 - gamma) theta / s + gamma theta."""
    out = []
    for theta in plain(d, base):
        r = original * theta / (2 * math.pi)
        gamma = 0.0 if r < beta_slow else 1.0 if r > beta_fast else (r - beta_slow) / (beta_fast - beta_slow)
        out.append((1 - gamma) * theta / s + gamma * theta)
    return out


def released_yarn_reference(d, base, s, original, beta_fast=32.0, beta_slow=1.0, truncate=True) -> list[float]:
    """The released code (and transformers' yarn): the dimension that turns beta times over the original length,
    d ln(original / (beta 2 pi)) / (2 ln base), from beta_fast (low) to beta_slow (high), floored and ceiled unless
    truncate is off, clamped to [0, d - 1]; a ramp linear in the pair index between them (high nudged by 0.001 when
    equal); extrapolation = 1 - ramp; theta' = theta / s (1 - extrapolation) + theta extrapolation."""

    def correction_dim(beta):
        return d * math.log(original / (beta * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    out = []
    for i, theta in enumerate(plain(d, base)):
        extrapolation = 1 - min(1.0, max(0.0, (i - low) / (high - low)))
        out.append(theta / s * (1 - extrapolation) + theta * extrapolation)
    return out


def hf_dynamic_reference(d, base, factor, n, original) -> list[float]:
    """transformers' dynamic: n = max(n, original); base' = base ((factor n / original) - (factor - 1))^(d/(d-2))."""
    n = max(n, original)
    new_base = base * ((factor * n / original) - (factor - 1)) ** (d / (d - 2))
    return plain(d, new_base)


def mscale(s, m=1.0) -> float:
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def close(got: torch.Tensor, want: list[float], rel=1e-12):
    assert got.tolist() == pytest.approx(want, rel=rel)


# ---- llama3 ----

LLAMA = dict(d=128, base=500000.0, s=8.0, low=1.0, high=4.0, original=8192)


def test_llama3_frequencies_of_a_llama_config():
    """Llama 3.1 8B's rope: dim 128, base 500000, factor 8, bands 1 and 4 over 8192. Wavelengths below 2048 are the
    pairs up to 28 (2 pi 500000^(28/64) = 1948; pair 29: 2278), above 8192 those from 35 on (pair 34: 7983, 35:
    9336): 29 kept, 6 blended, 29 divided by 8."""
    got = static_frequencies("llama3", 128, 500000.0, 8.0, 8192)
    want = llama3_reference(**LLAMA)
    close(got[0], want)
    theta = plain(128, 500000.0)
    assert got[0][:29].tolist() == pytest.approx(theta[:29], rel=1e-12)  # kept exactly
    assert got[0][35:].tolist() == pytest.approx([t / 8 for t in theta[35:]], rel=1e-12)
    blended = (got[0][29:35] / torch.tensor(theta[29:35], dtype=torch.float64)).tolist()
    assert all(1 / 8 < r < 1 for r in blended) and blended == sorted(blended, reverse=True)  # from kept to divided
    assert (got[1], got[2]) == (1.0, 1.0)  # no position scale, no attention scale
    # the reference numbers, by hand: pair 0 turns at 1 rad/token; pair 63 at 500000^(-126/128) / 8
    assert got[0][0].item() == 1.0 and got[0][63].item() == pytest.approx(500000.0 ** (-126 / 128) / 8, rel=1e-12)
    smooth = (8192 / (2 * math.pi / 500000.0 ** (-60 / 128)) - 1) / 3  # pair 30, in the band
    assert got[0][30].item() == pytest.approx(500000.0 ** (-60 / 128) * ((1 - smooth) / 8 + smooth), rel=1e-12)


def test_llama3_is_the_paper_ramp_with_its_bands_as_betas():
    """Llama's smooth factor is the YaRN paper's gamma in r = original / wavelength, with beta_fast = high_freq_factor
    and beta_slow = low_freq_factor: the same frequencies (llama3 has no attention scale, yarn 0.1 ln s + 1)."""
    for d, base, s, original in [(128, 500000.0, 8.0, 8192), (64, 10000.0, 4.0, 256), (16, 10000.0, 2.0, 32)]:
        llama = static_frequencies("llama3", d, base, s, original)
        yarn = static_frequencies("yarn", d, base, s, original, beta_fast=4.0, beta_slow=1.0)
        assert torch.equal(llama[0], yarn[0])
        close(llama[0], paper_yarn_reference(d, base, s, original, 4.0, 1.0))
        assert llama[2] == 1.0 and yarn[2] == pytest.approx(mscale(s))


# ---- yarn (the paper) and yarn_released ----


@pytest.mark.parametrize("s", [2.0, 4.0, 8.0, 16.0])
def test_released_yarn_differs_from_the_paper_in_the_middle_band_only(s):
    """A Llama-2-like head (dim 128, base 10000, 4096 tokens): the paper's ramp is linear in rotations, the released
    one in the pair index, so between the bands the released frequencies are up to 1.3x (at s = 2) to 3x (at 16)
    the paper's; at the pairs that turn at least beta_fast = 32 times (kept) or at most beta_slow = 1 time
    (divided by s) both are the same."""
    d, base, original = 128, 10000.0, 4096
    paper = static_frequencies("yarn", d, base, s, original)
    released = static_frequencies("yarn_released", d, base, s, original)
    close(paper[0], paper_yarn_reference(d, base, s, original))
    close(released[0], released_yarn_reference(d, base, s, original))
    assert paper[2] == released[2] == pytest.approx(mscale(s))  # the same cos/sin scale
    theta = plain(d, base)
    ratio = (released[0] / paper[0]).tolist()
    rotations = [original * t / (2 * math.pi) for t in theta]
    ends = [i for i, r in enumerate(rotations) if r >= 32 or r <= 1]
    middle = [i for i, r in enumerate(rotations) if 1 < r < 32]
    assert ends and middle and all(ratio[i] == pytest.approx(1.0, rel=1e-12) for i in ends)
    assert 1.2 * (s / 2) ** 0.3 < max(ratio[i] for i in middle) < 3.3  # a clear difference, growing with s
    assert released[0][0].item() == theta[0] and released[0][-1].item() == pytest.approx(theta[-1] / s, rel=1e-12)


@pytest.mark.parametrize("d, base, original", [(64, 10000.0, 256), (16, 10000.0, 32), (128, 1e6, 32768)])
@pytest.mark.parametrize("truncate", [True, False])
def test_released_yarn_against_its_formula(d, base, original, truncate):
    """Whole pairs or the unrounded correction range (transformers' truncate=False); a small head where both ends
    clamp; other betas; a base of a million."""
    for s, fast, slow in [(4.0, 32.0, 1.0), (8.0, 16.0, 2.0), (3.0, 64.0, 0.5)]:
        got = static_frequencies(
            "yarn_released", d, base, s, original, beta_fast=fast, beta_slow=slow, truncate=truncate
        )
        close(got[0], released_yarn_reference(d, base, s, original, fast, slow, truncate))


def test_every_closed_form_kind_is_plain_rope_at_factor_one():
    for kind in ("yarn_released", "llama3"):
        inv, pos_scale, cos_scale = static_frequencies(kind, 16, 10000.0, 1.0, 32)
        assert inv.tolist() == plain(16, 10000.0) and (pos_scale, cos_scale) == (1.0, 1.0)


def test_options_of_another_kind_are_refused():
    with pytest.raises(ValueError, match="beta_fast, beta_slow bound the ramp"):
        Scaling("ntk", 4.0, 32, beta_fast=8.0)
    with pytest.raises(ValueError, match="beta_slow=8 and beta_fast=4"):
        Scaling("yarn_released", 4.0, 32, beta_fast=4.0, beta_slow=8.0)
    with pytest.raises(ValueError, match="alpha is dynamic_ntk's factor"):
        Scaling("yarn", 4.0, 32, alpha=2.0)
    with pytest.raises(ValueError, match="truncate=False"):
        Scaling("yarn", 4.0, 32, truncate=False)


# ---- dynamic NTK's factor ----


def test_dynamic_ntk_at_alpha_one_is_the_former_formula_bit_for_bit():
    """alpha = 1 (the default) gives, bit for bit, what dynamic_ntk gave before it had a factor: base' = base s^(d /
    (d - 2)) with s = max(1, n / L), in float64, then float32; so every table scored before scores the same."""
    d, base, original = 16, 10000.0, 32
    for n in [1, 16, 31, 32, 33, 48, 64, 100, 128, 1000, 4096]:
        length = torch.tensor(n)
        s = (length.double() / original).clamp(min=1.0)
        exponent = torch.arange(0, d, 2, dtype=torch.float64) / d
        former = ((base * s ** (d / (d - 2))) ** (-exponent)).float()
        assert torch.equal(dynamic_inv_freq(d, base, original, length), former)
        assert torch.equal(dynamic_inv_freq(d, base, original, length, 1.0), former)
    rope = RoPE(1, d, d)
    pos = torch.arange(100)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            rope.rotation(pos, Scaling("dynamic_ntk", 4.0, original)),
            rope.rotation(pos, Scaling("dynamic_ntk", 4.0, original, alpha=1.0)),
            strict=True,
        )
    )


@pytest.mark.parametrize("alpha", [1.0, 2.0, 8.0])
def test_dynamic_ntk_alpha_is_transformers_dynamic_factor(alpha):
    d, base, original = 16, 10000.0, 32
    for n in [16, 32, 33, 64, 96, 1000]:
        got = dynamic_inv_freq(d, base, original, torch.tensor(n), alpha)
        close(got, hf_dynamic_reference(d, base, alpha, n, original), rel=1e-6)  # float32
    assert not torch.equal(
        dynamic_inv_freq(d, base, original, torch.tensor(64), 2.0), dynamic_inv_freq(d, base, 32, torch.tensor(64))
    )


# ---- the Hugging Face dict ----

D, BASE, L = 16, 10000.0, 32


def angles(scaling: Scaling, n: int) -> torch.Tensor:
    """(cos, sin) of a 16-dim RoPE at positions 0..n-1 under scaling."""
    return RoPE(1, D, D).rotation(torch.arange(n), scaling)


def assert_rotates_at(scaling: Scaling, n: int, inv_freq: list[float], scale: float = 1.0):
    """The rotation at positions 0..n-1 is cos, sin of position x inv_freq, times scale (as transformers applies it)."""
    cos, sin = angles(scaling, n)
    want = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor(inv_freq, dtype=torch.float64)[None, :]
    assert torch.allclose(cos.double(), want.cos() * scale, atol=5e-5)  # float32 angles up to 128 radians
    assert torch.allclose(sin.double(), want.sin() * scale, atol=5e-5)


def hf(**keys) -> HFRopeScaling:
    return HFRopeScaling(**keys)


def mapped(dict_: HFRopeScaling, n: int = 4 * L) -> Scaling:
    return hf_rope_scaling.scaling(dict_, L, n, RoPE(1, D, D), "eval.hf_rope_scaling")


def test_default_and_linear():
    assert mapped(hf(rope_type="default")) == Scaling() == mapped(hf(type="default"))
    assert_rotates_at(mapped(hf(rope_type="linear", factor=4.0)), 4 * L, [t / 4 for t in plain(D, BASE)])
    assert mapped(hf(type="linear", factor=4.0)) == mapped(hf(rope_type="linear", factor=4.0))  # the legacy key


@pytest.mark.parametrize("n", [L // 2, L, 3 * L])
def test_dynamic_is_dynamic_ntk_with_its_factor_as_alpha(n):
    scaling = mapped(hf(rope_type="dynamic", factor=2.0), n)
    assert (scaling.kind, scaling.alpha) == ("dynamic_ntk", 2.0)
    assert_rotates_at(scaling, n, hf_dynamic_reference(D, BASE, 2.0, n, L))
    other = mapped(hf(rope_type="dynamic", factor=2.0, original_max_position_embeddings=16), n)
    assert_rotates_at(other, n, hf_dynamic_reference(D, BASE, 2.0, n, 16))


def test_yarn_is_the_released_ramp_with_transformers_attention_factor():
    keys = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=16.0, beta_slow=2.0)
    released = released_yarn_reference(D, BASE, 4.0, 64, 16.0, 2.0)
    assert mapped(hf(**keys)).kind == "yarn_released"
    assert_rotates_at(mapped(hf(**keys)), 100, released, mscale(4.0))
    assert_rotates_at(
        mapped(hf(**keys, truncate=False)),
        100,
        released_yarn_reference(D, BASE, 4.0, 64, 16.0, 2.0, False),
        mscale(4.0),
    )
    # mscale with mscale_all_dim: their ratio (DeepSeek's configs); one of them 0: transformers' default
    assert mapped(hf(**keys, mscale=0.707, mscale_all_dim=1.0)).attn_scale == pytest.approx(
        mscale(4, 0.707) / mscale(4, 1)
    )
    assert mapped(hf(**keys, mscale=1.0, mscale_all_dim=1.0)).attn_scale == 1.0
    assert mapped(hf(**keys, mscale=1.0, mscale_all_dim=0.0)).attn_scale == pytest.approx(mscale(4.0))
    assert_rotates_at(mapped(hf(**keys, attention_factor=1.5, mscale=1.0, mscale_all_dim=2.0)), 100, released, 1.5)
    defaults = mapped(hf(rope_type="yarn", factor=4.0))  # betas 32 and 1, the training length as the original
    assert_rotates_at(defaults, 100, released_yarn_reference(D, BASE, 4.0, L), mscale(4.0))


def test_longrope_takes_short_factors_up_to_the_original_length_and_long_ones_past_it():
    short, long = [1.0 + i / 10 for i in range(D // 2)], [1.0 + i for i in range(D // 2)]
    keys = dict(rope_type="longrope", factor=4.0, short_factor=short, long_factor=long)
    scale = math.sqrt(1 + math.log(4.0) / math.log(L))  # transformers' default attention factor
    for n, factors in [(L // 2, short), (L, short), (L + 1, long), (4 * L, long)]:
        assert_rotates_at(
            mapped(hf(**keys), n), n, [t / f for t, f in zip(plain(D, BASE), factors, strict=True)], scale
        )
    assert mapped(hf(**keys, attention_factor=1.25)).attn_scale == 1.25
    no_factor = {k: v for k, v in keys.items() if k != "factor"}  # transformers': max_position_embeddings / original
    assert mapped(hf(**no_factor), 8 * L).attn_scale == pytest.approx(math.sqrt(1 + math.log(8) / math.log(L)))
    assert mapped(hf(**keys, original_max_position_embeddings=64), 64).rescale == tuple(short)  # 64 <= its own L


def test_llama3_takes_its_bands():
    keys = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    assert_rotates_at(mapped(hf(**keys)), 100, llama3_reference(D, BASE, 8.0, 1.0, 4.0, L))
    assert mapped(hf(**keys)) == mapped(hf(rope_type="llama3", factor=8.0))  # 1 and 4 are its defaults
    other = mapped(
        hf(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=2.0,
            high_freq_factor=8.0,
            original_max_position_embeddings=128,
        )
    )
    assert_rotates_at(other, 100, llama3_reference(D, BASE, 8.0, 2.0, 8.0, 128))


# ---- as eval.py and sample.py read it ----


def composed(name: str, *overrides):
    """The config an entry point composes, checked as it checks it before any work (one line on failure)."""
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose(name, overrides=list(overrides))
    except ConfigCompositionException as e:
        raise UserError(compose_message(e, name)) from None
    checks.check(cfg)
    return cfg


YARN = "{rope_type: yarn, factor: 4, original_max_position_embeddings: 32, beta_fast: 32, beta_slow: 1}"
LONGROPE = "{rope_type: longrope, factor: 4, short_factor: [1,1,1,1], long_factor: [1,2,3,4]}"


@pytest.mark.parametrize(
    "given, kind, row",
    [
        ("{rope_type: default}", "none", "hf_default"),
        ("{rope_type: linear, factor: 4}", "linear", "hf_linear"),
        ("{type: dynamic, factor: 2}", "dynamic_ntk", "hf_dynamic"),
        (YARN, "yarn_released", "hf_yarn"),
        (LONGROPE, "longrope", "hf_longrope"),
        ("{rope_type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4}", "llama3", "hf_llama3"),
    ],
)
def test_every_rope_type_composes_and_maps_to_its_kind(given, kind, row):
    cfg = composed("eval", f"eval.hf_rope_scaling={given}")
    pe = random_model("rope").pe  # 8 dims per head: 4 pairs
    scalings = variants.hf_scalings(cfg.eval.hf_rope_scaling, pe, [16, 64], 16)
    assert {s.kind for s in scalings.values()} == {kind}
    assert hf_rope_scaling.row_name(cfg.eval.hf_rope_scaling) == row


@pytest.mark.parametrize(
    "name, override, needle",
    [
        (
            "eval",
            "eval.hf_rope_scaling={rope_type: yarn, factor: 4, bata_fast: 3}",
            "eval.hf_rope_scaling.bata_fast is not an option",
        ),
        ("eval", "eval.hf_rope_scaling={rope_type: yarm}", "eval.hf_rope_scaling.rope_type=yarm is not one of"),
        ("eval", "eval.hf_rope_scaling={type: yarm}", "eval.hf_rope_scaling.type=yarm is not one of"),
        (
            "eval",
            "eval.hf_rope_scaling={rope_type: linear, factor: 0.5}",
            "eval.hf_rope_scaling.factor=0.5 must be >= 1",
        ),
        ("eval", "eval.hf_rope_scaling={rope_type: yarn}", "eval.hf_rope_scaling.factor=null: this rope_type needs it"),
        (
            "eval",
            "eval.hf_rope_scaling={rope_type: linear, factor: 2, beta_fast: 8}",
            "eval.hf_rope_scaling.beta_fast=8.0 is read by rope_type yarn only",
        ),
        ("eval", "eval.hf_rope_scaling={factor: 2}", "eval.hf_rope_scaling.factor=2.0 is read by rope_type"),
        ("eval", "eval.hf_rope_scaling={rope_type: yarn, type: linear, factor: 2}", "name two rope types"),
        (
            "eval",
            "eval.hf_rope_scaling={rope_type: longrope, long_factor: [1,2]}",
            "eval.hf_rope_scaling.short_factor=null",
        ),
        (
            "eval",
            "eval.hf_rope_scaling={rope_type: longrope, short_factor: [1,0], long_factor: [1,2]}",
            "short_factor=[1.0, 0.0] must hold numbers > 0",
        ),
        (
            "eval",
            "eval.hf_rope_scaling={rope_type: llama3, factor: 8, low_freq_factor: 4, high_freq_factor: 2}",
            "high_freq_factor=2.0 must be above",
        ),
        (
            "eval",
            "eval.hf_rope_scaling={rope_type: yarn, factor: 8, beta_fast: 1, beta_slow: 2}",
            "beta_fast=1.0 must be above",
        ),
        (
            "eval",
            "eval.hf_rope_scaling={rope_type: yarn, factor: 8, mscale: 0.7}",
            "eval.hf_rope_scaling.mscale=0.7 and",
        ),
        (
            "eval",
            "eval.hf_rope_scaling={rope_type: yarn, factor: 8, original_max_position_embeddings: 1}",
            "original_max_position_embeddings=1 must be >= 2",
        ),
        (
            "eval",
            "eval.hf_rope_scaling={rope_type: yarn, factor: 8, truncate: maybe}",
            "eval.hf_rope_scaling.truncate=maybe",
        ),
        (
            "sample",
            "hf_rope_scaling={rope_type: dynamic, factor: 2}",
            "hf_rope_scaling.rope_type=dynamic rescales the frequencies",
        ),
        (
            "sample",
            "hf_rope_scaling={type: dynamic, factor: 2}",
            "hf_rope_scaling.type=dynamic rescales the frequencies",
        ),
        ("sample", "rope_scaling=dynamic_ntk", "rope_scaling=dynamic_ntk rescales the frequencies"),
    ],
)
def test_a_bad_dict_is_one_line_naming_the_key(name, override, needle):
    with pytest.raises(UserError) as e:
        composed(name, override)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_factor_list_that_does_not_fit_the_model_names_its_key():
    cfg = composed("eval", "eval.hf_rope_scaling={rope_type: longrope, short_factor: [1,1,1], long_factor: [1,2,3]}")
    pe = random_model("rope").pe  # 8 dims per head: 4 pairs
    with pytest.raises(UserError, match=r"^eval.hf_rope_scaling.short_factor holds 3 factors and this model rotates 4"):
        variants.hf_scalings(cfg.eval.hf_rope_scaling, pe, [16], 16)
    with pytest.raises(UserError, match=r"^eval.hf_rope_scaling.long_factor holds 3 factors"):
        variants.hf_scalings(cfg.eval.hf_rope_scaling, pe, [64], 16)
    with pytest.raises(UserError, match="eval.hf_rope_scaling.rope_type=yarn applies to rotary schemes"):
        variants.with_hf(
            ["none"],
            composed("eval", "eval.hf_rope_scaling={rope_type: yarn, factor: 2}").eval.hf_rope_scaling,
            random_model("alibi").pe,
            None,
        )


def test_sample_decodes_every_static_kind_and_a_dict_through_its_cache(tiny_checkpoint):
    """sample.py: each kind at factor capacity / L, a dict at its own factor; a KV cache decodes each as one full
    forward would (keys rotated once, at fixed frequencies); two scalings at once are refused."""
    import sample

    model = random_model("rope")
    ckpt = {"seq_len": 16, "model_config": {"positional": {"name": "rope"}}}
    idx = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(0))
    for kind in ("linear", "ntk", "yarn", "yarn_released", "llama3"):
        cfg = composed("sample", f"rope_scaling={kind}")
        variant = sample.rope_variant(model, ckpt, cfg, 64)
        assert variant.scaling == Scaling(kind, 4.0, 16)
        assert_decoding_equals_full_forward(model, idx, static=False, variant=variant)
    cfg = composed("sample", "hf_rope_scaling={rope_type: yarn, factor: 2, beta_fast: 8}")
    variant = sample.rope_variant(model, ckpt, cfg, 64)
    assert (variant.scaling.kind, variant.scaling.factor, variant.scaling.beta_fast) == ("yarn_released", 2.0, 8.0)
    assert_decoding_equals_full_forward(model, idx, static=False, variant=variant)
    with pytest.raises(UserError, match="rope_scaling=yarn and a hf_rope_scaling dict are two scalings"):
        composed("sample", "rope_scaling=yarn", "hf_rope_scaling={rope_type: linear, factor: 2}")
    run("sample.py", f"checkpoint={tiny_checkpoint}", "hf_rope_scaling={rope_type: llama3, factor: 4}",
        "max_new_tokens=4", "cache.max_len=128", "device=cpu", check=True)  # fmt: skip


def test_eval_scores_yarn_beside_yarn_released_and_a_dict_with_paired_intervals(tiny_checkpoint, tmp_path):
    """eval.rope_scaling=all scores llama3 and yarn_released beside the paper's yarn, and a dict adds its row last:
    hf_yarn at factor 2 is yarn_released at 64 tokens (2 x 32) exactly. Every pair of rows of one column is paired
    (the same pieces, the same bootstrap draws: evaluation/compare.py), the new ones included."""
    cfg = composed(
        "eval", f"checkpoint={tiny_checkpoint}", "eval.rope_scaling=all", "eval.lengths=[32,64]", "eval.tokens=256",
        "device=cpu", "logger.wandb=false", "eval.hf_rope_scaling={rope_type: yarn, factor: 2}",
    )  # fmt: skip
    result = length.evaluate_lengths(tiny_checkpoint, cfg, runtime.setup("cpu", "fp32", 0))
    rows = {(r["variant"], r["length"], r["mode"]): r for r in result["results"]}
    names = list(dict.fromkeys(r["variant"] for r in result["results"]))
    assert names == ["none", "linear", "ntk", "dynamic_ntk", "yarn", "yarn_released", "llama3", "hf_yarn"]
    assert result["hf_rope_scaling"] == {"rope_type": "yarn", "factor": 2.0}
    for mode in ("nonoverlap", "sliding"):
        assert rows["hf_yarn", 64, mode]["ppl"] == rows["yarn_released", 64, mode]["ppl"]
        assert rows["yarn_released", 32, mode]["ppl"] == rows["none", 32, mode]["ppl"]  # factor 1: plain
        assert rows["hf_yarn", 32, mode]["ppl"] != rows["none", 32, mode]["ppl"]  # its own factor, 2
        assert rows["yarn", 64, mode]["ppl"] != rows["yarn_released", 64, mode]["ppl"]
    compare.compare([result], tmp_path)
    pairs = json_pairs(tmp_path)
    for a, b in [("yarn", "yarn_released"), ("yarn_released", "hf_yarn"), ("yarn", "llama3")]:
        for n in (32, 64):
            found = [p for p in pairs if {p["a"], p["b"]} == {f"rope+{a}", f"rope+{b}"} and p["length"] == n]
            assert len(found) == 2 and all(p["paired"] for p in found), (a, b, n)
    assert any(p["lo"] < p["hi"] for p in pairs if "rope+hf_yarn" in (p["a"], p["b"]))


def json_pairs(folder) -> list[dict]:
    return json.loads((folder / "compare.json").read_text())["pairs"]


def test_eval_takes_the_dict_on_the_command_line(tiny_checkpoint):
    proc = run(
        "eval.py", f"checkpoint={tiny_checkpoint}", "eval.lengths=[64]", "eval.tokens=256", "device=cpu",
        "logger.wandb=false",
        f"eval.hf_rope_scaling={YARN}", check=True,
    )  # fmt: skip
    assert "rope+hf_yarn" in proc.stdout


# ---- against transformers itself, where it is installed ----


def hf_config(rope_scaling: dict, max_position_embeddings: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=4 * D, num_attention_heads=4, rope_theta=BASE, max_position_embeddings=max_position_embeddings,
        rope_scaling=dict(rope_scaling),
    )  # fmt: skip


@pytest.mark.parametrize(
    "rope_scaling, n",
    [
        ({"rope_type": "linear", "factor": 4.0}, 4 * L),
        ({"rope_type": "dynamic", "factor": 2.0}, 3 * L),
        ({"rope_type": "dynamic", "factor": 2.0}, L // 2),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L}, 4 * L),
        (
            {
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 16.0,
                "beta_slow": 2.0,
                "truncate": False,
            },
            100,
        ),
        (
            {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": L,
                "mscale": 0.707,
                "mscale_all_dim": 1.0,
            },
            4 * L,
        ),
        ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": L, "attention_factor": 1.3}, 4 * L),
        (
            {
                "rope_type": "longrope",
                "factor": 4.0,
                "original_max_position_embeddings": L,
                "short_factor": [1.0 + i / 10 for i in range(8)],
                "long_factor": [1.0 + i for i in range(8)],
            },
            4 * L,
        ),
        (
            {
                "rope_type": "longrope",
                "factor": 4.0,
                "original_max_position_embeddings": L,
                "short_factor": [1.0 + i / 10 for i in range(8)],
                "long_factor": [1.0 + i for i in range(8)],
            },
            L,
        ),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": L,
            },
            4 * L,
        ),
    ],
)
def test_against_transformers(rope_scaling, n):
    """transformers' ROPE_INIT_FUNCTIONS give the frequencies and cos/sin scale that the dict's Scaling rotates by
    (dynamic and longrope at the current length n, which transformers passes as seq_len)."""
    utils = pytest.importorskip("transformers.modeling_rope_utils")
    config = hf_config(rope_scaling, L)
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type"))
    inv_freq, attention = utils.ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=n)
    assert_rotates_at(mapped(HFRopeScaling(**rope_scaling), n), n, inv_freq.double().tolist(), attention)
