"""Each scheme against its published definition."""

import math

import pytest
import torch
from conftest import ROOT, SCHEMES, scheme_spec

import positional
from positional.alibi import alibi_slopes
from positional.rope import RoPE
from positional.t5 import t5_bucket


def test_alibi_slopes_power_of_two():
    assert alibi_slopes(8) == pytest.approx([2.0**-k for k in range(1, 9)])


def test_alibi_slopes_twelve_heads():
    slopes = alibi_slopes(12)
    assert slopes[:8] == pytest.approx([2.0**-k for k in range(1, 9)])
    assert slopes[8:] == pytest.approx([0.7071, 0.3536, 0.1768, 0.0884], abs=1e-4)


def test_alibi_bias_is_minus_slope_times_distance():
    pe = positional.build({"name": "alibi"}, 4, 8, 32)
    q, k = torch.tensor([[7]]), torch.tensor([[2]])
    for h in range(4):
        assert pe.score_bias(torch.tensor(h), q, k).item() == pytest.approx(-alibi_slopes(4)[h] * 5)


def test_t5_buckets():
    n = torch.arange(0, 400)
    b = t5_bucket(n)
    assert torch.equal(b[:16], torch.arange(16))  # exact below 16
    for d in (16, 20, 32, 64, 100, 127):
        assert b[d].item() == min(31, 16 + math.floor(math.log(d / 16) / math.log(128 / 16) * 16))
    assert (b[128:] == 31).all()
    assert t5_bucket(torch.tensor([-5])).item() == 0  # future keys (masked anyway) share bucket 0


def test_sinusoidal_matches_formula():
    pe = positional.build({"name": "sinusoidal"}, 4, 8, 16)
    pos = torch.tensor([0, 1, 5, 1000])
    got = pe.embed(torch.zeros(1, 4, 16), pos)[0]
    for row, p in enumerate(pos.tolist()):
        for i in range(8):
            angle = p / 10000 ** (2 * i / 16)
            assert got[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-4)
            assert got[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-4)


def test_sinusoidal_scale_multiplies_the_sinusoids_and_defaults_as_configured():
    """The config's scale (0.1) is applied; a spec saved before the option existed builds the unscaled formula."""
    from omegaconf import OmegaConf

    pos = torch.arange(7)
    unit = positional.build({"name": "sinusoidal"}, 4, 8, 16).embed(torch.zeros(1, 7, 16), pos)
    spec = OmegaConf.to_container(OmegaConf.load(ROOT / "configs/positional/sinusoidal.yaml"))
    scaled = positional.build(spec, 4, 8, 16).embed(torch.zeros(1, 7, 16), pos)
    assert spec["scale"] == 0.1 and torch.allclose(scaled, 0.1 * unit)


def test_learned_table_starts_at_its_configured_std():
    pe = positional.build({"name": "learned", "max_positions": 4096, "init_std": 0.1}, 4, 8, 64)
    assert pe.table.weight.std().item() == pytest.approx(0.1, rel=0.02)


def test_rope_scores_depend_only_on_distance():
    rope = RoPE(1, 16, 16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i, j):
        return (rope.rotate(q, torch.tensor([i])) * rope.rotate(k, torch.tensor([j]))).sum().item()

    assert score(10, 3) == pytest.approx(score(107, 100), abs=1e-4)
    assert score(10, 3) != pytest.approx(score(10, 4), abs=1e-4)
    x = torch.randn(1, 1, 5, 16)
    assert rope.rotate(x, torch.arange(5)).norm() == pytest.approx(x.norm().item(), rel=1e-5)


def test_learned_table_refuses_positions_past_its_size():
    pe = positional.build({"name": "learned", "max_positions": 8}, 4, 8, 32)
    pe.embed(torch.zeros(1, 8, 32), torch.arange(8))
    with pytest.raises(positional.PositionLimitError, match="covers 8 positions"):
        pe.embed(torch.zeros(1, 9, 32), torch.arange(9))
    with pytest.raises(positional.PositionLimitError, match="covers 8 positions"):
        pe.check_length(9)


def test_unknown_scheme_lists_the_choices():
    with pytest.raises(ValueError, match="choose one of: learned, sinusoidal, alibi, rope, nope, sink"):
        positional.build({"name": "xpos"}, 4, 8, 32)


def test_sink_refuses_an_absolute_inner_scheme():
    with pytest.raises(ValueError, match="relative"):
        positional.build({"name": "sink", "inner": {"name": "learned", "max_positions": 8}}, 4, 8, 32)


@pytest.mark.parametrize("name", SCHEMES)
def test_every_scheme_builds_and_states_its_reach(name):
    pe = positional.build(scheme_spec(name, 64), 4, 8, 32)
    assert pe.max_positions == (64 if name == "learned" else None)
    assert pe.relative == (name not in ("learned", "sinusoidal"))
    assert pe.n_prefix == (1 if name == "sink" else 0)
