"""Each scheme against its published definition."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import ABSOLUTE, SCHEMES, scheme_spec

import positional
from positional.alibi import alibi_slopes
from positional.rope import RoPE
from positional.rope_scaling import Scaling
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
    spec = positional.spec_of(OmegaConf.structured(positional.sinusoidal.SinusoidalOptions(name="sinusoidal")))
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
    """Every scheme file is a choice, in order (a new file joins the list without an edit here)."""
    listed = ", ".join(positional.names())
    with pytest.raises(ValueError, match=f"xpoz is not one of {listed}; pick one"):
        positional.build({"name": "xpoz"}, 4, 8, 32)


def test_sink_refuses_an_absolute_inner_scheme():
    with pytest.raises(ValueError, match="relative"):
        positional.build({"name": "sink", "inner": {"name": "learned", "max_positions": 8}}, 4, 8, 32)


@pytest.mark.parametrize("name", SCHEMES)
def test_every_scheme_builds_and_states_its_reach(name):
    pe = positional.build(scheme_spec(name, 64), 4, 8, 32)
    assert pe.max_positions == (64 if name == "learned" else None)
    assert pe.relative == (name not in ABSOLUTE)
    assert pe.n_prefix == (1 if name == "sink" else 0)


# ---- the learned-bias family: each bias against its paper's formula ----


def test_kerple_bias_matches_both_formulas():
    d = torch.tensor([0, 1, 5, 40])
    for variant in ("log", "power"):
        pe = positional.build({"name": "kerple", "variant": variant}, 4, 8, 32)
        with torch.no_grad():
            pe.r1_raw.copy_(torch.tensor([-1.0, 0.0, 0.5, 2.0]))
            pe.r2_raw.copy_(torch.tensor([0.3, -2.0, 1.0, 0.0]))
        r1 = torch.log1p(torch.exp(pe.r1_raw.detach()))  # softplus, written out
        r2 = (
            torch.log1p(torch.exp(pe.r2_raw.detach())) if variant == "log" else 2 / (1 + torch.exp(-pe.r2_raw.detach()))
        )
        for h in range(4):
            got = pe.score_bias(torch.tensor(h), 50 + d, torch.tensor(50))
            want = -r1[h] * (torch.log(1 + r2[h] * d) if variant == "log" else d.float() ** r2[h])
            assert torch.allclose(got, want, atol=1e-5), (variant, h)
    power = positional.build({"name": "kerple", "variant": "power"}, 4, 8, 32)  # it starts as ALiBi
    alibi = positional.build({"name": "alibi"}, 4, 8, 32)
    h, q, k = torch.arange(4)[:, None], torch.tensor([30]), torch.arange(31)
    assert torch.allclose(power.score_bias(h, q, k), alibi.score_bias(h, q, k), atol=1e-5)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_r1_r2_stay_positive_by_construction(variant):
    """Whatever the raw parameters, and after a huge step on a loss that wants them negative, r1 and r2 are > 0
    (and the power exponent <= r2_max <= 2)."""
    pe = positional.build({"name": "kerple", "variant": variant, "r2_max": 1.5}, 4, 8, 32)
    with torch.no_grad():
        pe.r1_raw.copy_(torch.tensor([-20.0, -1.0, 1.0, 20.0]))
        pe.r2_raw.copy_(torch.tensor([20.0, 1.0, -1.0, -20.0]))
    opt = torch.optim.SGD(pe.parameters(), lr=100.0)
    for _ in range(2):
        r1, r2 = pe.r1(), pe.r2()
        assert (r1 > 0).all() and (r2 > 0).all() and (variant == "log" or (r2 <= 1.5).all())
        (r1.sum() + r2.sum()).backward()
        opt.step()
        opt.zero_grad()


def test_kerple_refuses_a_bad_variant_or_exponent_bound():
    with pytest.raises(ValueError, match="variant=foo"):
        positional.build({"name": "kerple", "variant": "foo"}, 4, 8, 32)
    with pytest.raises(ValueError, match="r2_max=3"):
        positional.build({"name": "kerple", "variant": "power", "r2_max": 3}, 4, 8, 32)


def fire_mlp(pe, h, x):
    """f_h(x) = w2_h . relu(w1_h x + b1_h) + b2_h, for a 1-D x."""
    return torch.relu(x[:, None] * pe.w1[h] + pe.b1[h]) @ pe.w2[h] + pe.b2[h]


def test_fire_normalises_by_the_threshold_before_it_and_by_the_query_past_it():
    pe = positional.build({"name": "fire", "threshold": 100.0, "init_c": 0.5}, 4, 8, 32)
    with torch.no_grad():
        pe.w2.normal_()
        pe.b2.normal_()
    c = 0.5
    k = torch.arange(0, 10)
    with torch.no_grad():
        for q in (10, 99, 100, 400):
            d = (q - k).float()
            x = torch.log1p(c * d) / math.log1p(c * max(q, 100))
            for h in range(4):
                got = pe.score_bias(torch.tensor(h), torch.tensor(q), k)
                assert torch.allclose(got, fire_mlp(pe, h, x), atol=1e-5), (q, h)
        # before L the bias depends on i - j alone; past L the same distance reads another normaliser
        h = torch.tensor(1)
        assert torch.allclose(pe.score_bias(h, torch.tensor(20), k), pe.score_bias(h, torch.tensor(90), k + 70))
        assert not torch.allclose(pe.score_bias(h, torch.tensor(20), k), pe.score_bias(h, torch.tensor(390), k + 370))


def test_fire_threshold_and_c_stay_positive():
    pe = positional.build({"name": "fire", "threshold": 32, "init_c": 0.1}, 4, 8, 32)
    assert pe.log_threshold.exp().item() == pytest.approx(32) and pe.log_c.exp().item() == pytest.approx(0.1)
    with torch.no_grad():
        pe.log_threshold.fill_(-30.0), pe.log_c.fill_(-30.0)  # both tiny yet positive: no 0/0, no log of <= 0
    assert pe.score_bias(torch.tensor(0), torch.arange(5)[:, None], torch.arange(5)).isfinite().all()


def test_fox_bias_is_the_sum_of_log_gates_between_key_and_query_in_any_slot_order():
    """The bias at (i, j) sums log f over the tokens at positions in (pos j, pos i], whatever order the cache's
    slots hold them in (a sink cache's ring), and a query reads its own key's cumulative sum."""
    from types import SimpleNamespace

    from model.attention import content_grid
    from positional.base import key_order

    pe = positional.build({"name": "fox"}, 2, 8, 16)
    log_f = -torch.rand(1, 2, 9)  # 9 keys in slot order
    k_pos = torch.tensor([0, 1, 2, 7, 8, 3, 4, 5, 6])  # 3 sinks, then a ring that wrapped
    q_pos = torch.tensor([7, 8])
    plan = SimpleNamespace(q_pos=q_pos, k_pos=k_pos, key_order=key_order(q_pos, k_pos))
    got = content_grid(pe.content_bias(None, log_f, plan), 1, 2, 2, 9, "cpu")
    for i, qp in enumerate(q_pos.tolist()):
        for j, kp in enumerate(k_pos.tolist()):
            if kp <= qp:
                between = [log_f[0, :, s] for s in range(9) if kp < k_pos[s] <= qp]
                want = torch.stack(between).sum(0) if between else torch.zeros(2)
                assert torch.allclose(got[0, :, i, j], want, atol=1e-6), (qp, kp)


def test_fox_gates_are_per_layer_start_as_alibi_and_take_no_weight_decay():
    from model.gpt import GPT, GPTConfig
    from model.kv_cache import DenseCache
    from utils.optim import param_groups

    model = GPT(GPTConfig(vocab_size=10, n_layer=2, n_head=4, n_kv_head=2, d_model=32, positional={"name": "fox"}))
    gates = [b.attn.pe_layer for b in model.blocks]
    assert gates[0] is not gates[1] and all(g.weight.shape == (4, 32) for g in gates)
    log_f = gates[0](torch.randn(1, 6, 32))
    assert torch.allclose(log_f, -torch.tensor(alibi_slopes(4))[None, :, None].expand(1, 4, 6), atol=1e-6)
    matrices, head, rest = param_groups(model)
    assert {id(p) for g in gates for p in g.parameters()} <= {id(p) for p in rest}
    assert DenseCache(model, 1, 8).state.shape == (2, 1, 4, 8)  # the log gates, cached beside the keys


def test_partial_rope_rotates_only_its_fraction_at_a_narrower_heads_frequencies():
    """rotary_fraction=1 is RoPE bit for bit; 0.25 of a 16-dim head turns pairs (0, 8) and (1, 9) exactly as a 4-dim
    RoPE would (GPT-NeoX partial rotary, half-split pairs) and passes every other dim through untouched."""
    x, pos = torch.randn(2, 3, 9, 16), torch.arange(9) * 37
    assert torch.equal(RoPE(3, 16, 48, rotary_fraction=1.0).rotate(x, pos), RoPE(3, 16, 48).rotate(x, pos))
    got = RoPE(3, 16, 48, rotary_fraction=0.25).rotate(x, pos)
    turned = [0, 1, 8, 9]
    want = RoPE(3, 4, 12).rotate(x[..., turned], pos)
    assert torch.allclose(got[..., turned], want, atol=1e-6)
    still = [d for d in range(16) if d not in turned]
    assert torch.equal(got[..., still], x[..., still])
    with pytest.raises(ValueError, match="positional.rotary_fraction=1.5 must be <= 1"):
        positional.build({"name": "rope", "rotary_fraction": 1.5}, 3, 16, 48)


def test_prope_keeps_ropes_highest_frequencies_and_stops_the_lowest():
    rope, prope = RoPE(3, 16, 48), positional.build({"name": "prope", "rotary_fraction": 0.5}, 3, 16, 48)
    assert torch.equal(prope.inv_freq[:4], rope.inv_freq[:4]) and (prope.inv_freq[4:] == 0).all()
    x, pos = torch.randn(1, 3, 7, 16), torch.arange(7) * 1000
    got = prope.rotate(x, pos)
    low = [4, 5, 6, 7, 12, 13, 14, 15]  # the pairs of the four lowest frequencies
    assert torch.equal(got[..., low], x[..., low])
    high = [0, 1, 2, 3, 8, 9, 10, 11]
    assert torch.allclose(got[..., high], rope.rotate(x, pos)[..., high], atol=1e-5)
    full = positional.build({"name": "prope", "rotary_fraction": 1.0}, 3, 16, 48)
    assert torch.equal(full.rotate(x, pos), rope.rotate(x, pos))


@pytest.mark.parametrize("head_dim,base,length", [(32, 10000.0, 256), (64, 10000.0, 1024), (16, 500.0, 64)])
def test_hope_rotates_the_pairs_that_turn_a_full_period_within_the_training_length(head_dim, base, length):
    """HoPE's cut (as DaRoPE states it): pair j rotates at RoPE's theta_j = base^(-2j/d) where 2 pi / theta_j <= L, and
    is the identity (cos 1, sin 0) elsewhere; the kept pairs' scores are RoPE's, at any distance."""
    hope = positional.build({"name": "hope", "base": base, "train_length": length}, 2, head_dim, 2 * head_dim)
    rope = RoPE(2, head_dim, 2 * head_dim, base=base)
    theta = [base ** (-2 * j / head_dim) for j in range(head_dim // 2)]
    kept = [j for j, t in enumerate(theta) if 2 * math.pi / t <= length]
    assert kept == list(range(len(kept))) and 0 < len(kept) < head_dim // 2  # the fastest ones, a prefix
    assert hope.n_rotated == len(kept)
    pos = torch.tensor([0, 1, 7, length - 1, 16 * length, 10**5])
    cos, sin = hope.rotation(pos)
    rope_cos, rope_sin = rope.rotation(pos)
    still = [j for j in range(head_dim // 2) if j not in kept]
    assert (cos[:, still] == 1).all() and (sin[:, still] == 0).all()
    assert torch.allclose(cos[:, kept], rope_cos[:, kept], atol=1e-6)
    assert torch.allclose(sin[:, kept], rope_sin[:, kept], atol=1e-6)
    with pytest.raises(ValueError, match="positional.train_length=6: no pair turns a full period"):
        positional.build({"name": "hope", "train_length": 6}, 2, head_dim, 2 * head_dim)


@pytest.mark.parametrize("head_dim,length,kept,d_out", [(32, 256, 7, 7), (64, 512, 16, 16), (64, 1024, 18, 16)])
def test_fope_keeps_the_release_shapes_and_is_rope_at_sigma_zero(head_dim, length, kept, d_out):
    """The release's rules: D frequencies at or above 2 pi / L, d_out = min(D, Dh/4) series, an eye at every
    ceil(D / d_out)-th frequency (at L = 1024, Dh = 64: 9 of the 16 series, as the release gives its 60M model). At
    sigma 0 the series are RoPE's cos and sin on the first d_out pairs, and the other pairs C = S = 1."""
    fope = positional.build({"name": "fope", "train_length": length, "sigma": 0.0}, 8, head_dim, 8 * head_dim)
    assert (len(fope.theta), fope.d_out) == (kept, d_out)
    step = -(-kept // d_out)
    eye = torch.zeros(kept, d_out)
    for i in range(d_out):
        if i * step < kept:
            eye[i * step, i] = 1
    assert torch.equal(fope.cos_coef, eye) and torch.equal(fope.sin_coef, eye)
    assert int(eye.sum()) == {7: 7, 16: 16, 18: 9}[kept]
    pos = torch.tensor([0, 3, length - 1, 16 * length])
    cos, sin = fope.rotation(pos)
    theta = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angle = pos.double()[:, None] * theta[None, :]
    rounding = 4 * float(angle.max()) * torch.finfo(torch.float32).eps  # an fp32 angle's own rounding, as RoPE's
    if step == 1:
        assert torch.allclose(cos[:, :d_out].double(), angle.cos()[:, :d_out], atol=rounding)
        assert torch.allclose(sin[:, :d_out].double(), angle.sin()[:, :d_out], atol=rounding)
    assert (cos[:, d_out:] == 1).all() and (sin[:, d_out:] == 1).all()


def test_fope_noise_is_the_releases_xavier_spread():
    """sigma sqrt(2 / ((D + H) d_out)), the std xavier_normal_ gives a (H, D, d_out) tensor: 0.0151 for the release's
    180M model (H 8, D 36, d_out 32, sigma 0.4), measured on 1,152 draws of each tensor, within 10%."""
    torch.manual_seed(0)
    fope = positional.build({"name": "fope", "train_length": 1024, "sigma": 0.4}, 8, 128, 1024)
    assert (len(fope.theta), fope.d_out) == (36, 32)
    eye = positional.build({"name": "fope", "train_length": 1024, "sigma": 0.0}, 8, 128, 1024).cos_coef
    for coef in (fope.cos_coef, fope.sin_coef):
        assert (coef - eye).std().item() == pytest.approx(0.4 * math.sqrt(2 / (44 * 32)), rel=0.1)
    assert not torch.equal(fope.cos_coef, fope.sin_coef)  # drawn apart, as the release draws them


def test_xpos_score_is_rope_times_a_per_pair_decay_of_the_distance():
    """q at n, k at m: pair i's RoPE score times zeta_i^((n - m)/512), zeta_i = (2i/16 + 0.4)/1.4; so it depends on
    n - m alone, also at positions 30000 apart (inside the fp32 range the docstring states)."""
    xpos, rope = positional.build({"name": "xpos"}, 1, 16, 16), RoPE(1, 16, 16)
    q, k = torch.randn(2, 1, 1, 1, 16, generator=torch.Generator().manual_seed(0))

    def score(pe, n, m, pair=slice(None)):
        qr, kr = pe.rotate(q, torch.tensor([n])), pe.rotate_key(k, torch.tensor([m]))
        return (qr * kr).view(2, 8)[:, pair].sum().item()

    zeta = (torch.arange(0, 16, 2) / 16 + 0.4) / 1.4
    for n, m in ((300, 40), (40, 300)):
        for i in range(8):
            want = score(rope, n, m, i) * zeta[i].item() ** ((n - m) / 512)
            assert score(xpos, n, m, i) == pytest.approx(want, rel=1e-4, abs=1e-6)
            assert score(xpos, n + 30000, m + 30000, i) == pytest.approx(want, rel=1e-3, abs=1e-5)


def test_pope_score_is_the_polar_formula_and_content_never_moves_a_phase():
    """q'.k' / sqrt(2 Dh) (what every backend computes) = sum_c softplus(q_c) softplus(k_c) cos((n-m) theta_c +
    delta_hc) / sqrt(Dh), theta_c = 10000^(-c/Dh); and each component's phase is its position's (plus delta) for any
    content, where RoPE's depends on the content too."""
    pope = positional.build({"name": "pope"}, 2, 8, 16)
    with torch.no_grad():
        pope.delta.uniform_(-3, 3)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    theta = 10000.0 ** (-torch.arange(8) / 8)
    for n, m in ((5, 2), (2, 5), (900, 0)):
        got = (pope.rotate(q, torch.tensor([n])) * pope.rotate_key(k, torch.tensor([m]))).sum(-1) / math.sqrt(16)
        angle = (n - m) * theta + pope.delta.detach()[:, None, :]
        want = (F.softplus(q) * F.softplus(k) * angle.cos()).sum(-1) / math.sqrt(8)
        assert torch.allclose(got, want, atol=1e-5)
    pos = torch.tensor([7])
    for x in (torch.randn(1, 2, 1, 8), -torch.randn(1, 2, 1, 8).abs()):
        out = pope.rotate_key(x, pos)
        phase = torch.atan2(out[..., 8:], out[..., :8])
        assert torch.allclose(phase.cos(), (7 * theta).cos(), atol=1e-5)
        assert torch.allclose(phase.sin(), (7 * theta).sin(), atol=1e-5)
    rope_out = [RoPE(2, 8, 16).rotate(x, pos) for x in (q, -q)]  # RoPE: content flips the pair's angle by pi
    assert not torch.allclose(rope_out[0], rope_out[1])


@pytest.mark.parametrize("name", ["xpos", "prope", "pope"])
def test_rope_scaling_applies_to_the_rotary_family(name):
    """eval.rope_scaling: linear interpolation by 2 at positions 2n rotates as the unscaled scheme at n; xPos's decay
    stays at the raw positions."""
    pe = positional.build({"name": name}, 2, 8, 16)
    x, pos, linear = torch.randn(1, 2, 3, 8), torch.tensor([3, 5, 9]), Scaling("linear", 2.0, 16)
    plain = pe.rotate_key(x, pos)
    if name == "xpos":
        cos, sin = RoPE(2, 8, 16).rotation(pos)
        decay = ((torch.arange(0, 8, 2) / 8 + 0.4) / 1.4) ** (2 * pos[:, None] / 512)
        got = pe.rotation(2 * pos, linear)
        assert torch.allclose(got[0], cos * decay, atol=1e-6) and torch.allclose(got[1], sin * decay, atol=1e-6)
    else:
        assert torch.allclose(plain, pe.rotate_key(x, 2 * pos, pe.rotation(2 * pos, linear)), atol=1e-5)
