"""Per-layer schemes (positional.layers, iRoPE): each layer gets its own scheme, NoPE's query temperature has Llama 4's
values, and the invariants hold in every backend and both caches."""

import math

import pytest
import torch
from conftest import (
    assert_decoding_equals_full_forward,
    assert_same_logits_and_grads,
    layer_outputs_from_probs,
    random_model,
)
from hydra import compose, initialize_config_dir

from model.gpt import GPTConfig
from model.kv_cache import DenseCache, SinkCache
from positional import build_layers
from positional.nope import NoPE
from utils import checks, schema
from utils.errors import UserError

W = 5
T = 24


def tokens(length=T, batch=2, seed=1):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def layered(name="rope", layers="PN", attn_scale=0.1, floor_scale=4, **kw):
    """A random model of `name` with positional.layers; floor_scale 4 makes the temperature change within T tokens."""
    spec = {"name": name, "layers": layers, "attn_scale": attn_scale, "floor_scale": floor_scale}
    if name == "sink":
        spec["inner"] = {"name": "rope"}
    return random_model(name, positional={**spec, **kw.pop("spec", {})}, **kw)


def test_temperature_is_llama4s():
    """1 + 0.1 ln(1 + floor((i + 1) / 256)): 1 through position 254, then log-growing; 1 before position 0."""
    pe = NoPE(4, 8, 32, attn_scale=0.1, floor_scale=256)
    pos = torch.tensor([-2, -1, 0, 254, 255, 510, 511, 4095])
    want = [1, 1, 1, 1, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3), 1 + 0.1 * math.log(17)]
    assert torch.allclose(pe.rotation(pos)[:, 0], torch.tensor(want), atol=1e-7)
    x = torch.randn(1, 4, len(pos), 8)
    assert torch.equal(pe.rotate_key(x, pos), x)  # keys never scaled
    off = NoPE(4, 8, 32)  # attn_scale 0 (the default): no state, queries untouched
    assert off.rotation(pos) is None and torch.equal(off.rotate(x, pos), x)


def test_the_pattern_gives_each_layer_its_scheme():
    """PN tiled over 3 layers is P, N, P; all-N is plain NoPE, all-P plain RoPE (the same weights); the probabilities
    the sink diagnostic reads are each layer's own (they recompose every layer's output)."""
    model = layered(n_layer=3)
    assert [b.attn.nope for b in model.blocks] == [False, True, False]
    idx = tokens()
    for _, recomposed, out in layer_outputs_from_probs(model, idx):
        assert torch.allclose(recomposed, out, atol=1e-5)
    with torch.no_grad():
        all_n, nope = layered(layers="N", attn_scale=0.0)(idx), random_model("nope")(idx)
        all_p, rope = layered(layers="P")(idx), random_model("rope")(idx)
        mixed = layered(attn_scale=0.0)(idx)
    assert torch.equal(all_n, nope) and torch.equal(all_p, rope)
    assert not torch.allclose(mixed, nope, atol=1e-3) and not torch.allclose(mixed, rope, atol=1e-3)


def test_the_temperature_scales_queries_only():
    """At positions where it is constant (i + 1 in [16, 24): s = 1 + 0.1 ln 3), an N layer with the temperature
    equals one without it whose learned query gain is s times larger: queries times s, keys as they were."""
    pos, idx = torch.arange(15, 23), tokens(8)
    hot = layered(layers="N", floor_scale=8, n_layer=1, qk_norm="learned")
    cold = layered(layers="N", attn_scale=0.0, n_layer=1, qk_norm="learned")
    with torch.no_grad():
        assert not torch.allclose(hot(idx, pos=pos), cold(idx, pos=pos), atol=1e-3)
        cold.blocks[0].attn.q_gain.mul_(1 + 0.1 * math.log(3))
        assert torch.allclose(hot(idx, pos=pos), cold(idx, pos=pos), atol=1e-5)


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_causality(name):
    model, idx = layered(name), tokens()
    changed = idx.clone()
    changed[:, 15] = (changed[:, 15] + 1) % 97
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :15], b[:, :15], atol=1e-5) and not torch.allclose(a[:, 15:], b[:, 15:], atol=1e-3)


def test_translation_invariance_where_it_holds():
    """Without the temperature, or while every position stays below floor_scale - 1, shifting positions changes
    nothing; with a temperature that grows over them, the N layers read the queries' own positions."""
    idx, pos = tokens(), torch.arange(T)
    for model in (layered(attn_scale=0.0), layered(floor_scale=2000)):
        assert torch.allclose(model(idx, pos=pos), model(idx, pos=pos + 1000), atol=1e-4)
    model = layered()
    assert not torch.allclose(model(idx, pos=pos), model(idx, pos=pos + 1000), atol=1e-3)


@pytest.mark.parametrize("name", ["rope", "alibi"])
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_backends_agree_with_the_fp32_reference(name, backend):
    """Four layers, PN with SSSL windows: both schemes with and without a window, a plan for each."""
    kw = dict(n_layer=4, window=W, window_pattern="SSSL")
    ref, other = layered(name, attn_backend="reference", **kw), layered(name, attn_backend=backend, **kw)
    idx = tokens()
    with torch.no_grad():  # flex: its forward, run eagerly (the CPU has no flex backward)
        assert torch.allclose(ref(idx), other(idx), atol=2e-4)
    if backend == "sdpa":
        assert_same_logits_and_grads(other, ref, idx)


@pytest.mark.parametrize("name, window", [("rope", None), ("rope", W), ("alibi", W), ("fox", None)])
def test_kv_cache_decoding_equals_full_forward(name, window):
    """Token by token and in chunks (and, without a window ring, the static step), with the temperature changing
    along the sequence: every step scales its queries at their own positions. With a window, PN x SL windows the
    scheme's layers and leaves the N layers global (Command A's layout)."""
    model = layered(name, n_layer=4, window=window, window_pattern="SL")
    assert_decoding_equals_full_forward(model, tokens(), static=window is None)


def test_sink_cache_equals_dense_while_it_fits_and_reindexes_the_temperature_past_it():
    """While it holds every token it is the dense cache; past its capacity a one-layer N model's logits equal a fresh
    forward over the kept tokens at positions 0..S+W-1: the temperature reads the query's in-cache position (10, not
    39). A two-layer iRoPE model streams at constant memory."""
    S, window, idx = 3, 8, tokens(40, batch=1)
    model = layered()
    fits, sink = DenseCache(model, 1, 64), SinkCache(model, 1, S, window)
    a = torch.cat([model.decode(idx[:, t : t + 1], fits) for t in range(S + window)], dim=1)
    b = torch.cat([model.decode(idx[:, t : t + 1], sink) for t in range(S + window)], dim=1)
    assert torch.equal(a, b)
    size = sink.nbytes()
    rest = torch.cat([model.decode(idx[:, t : t + 1], sink) for t in range(S + window, 40)], dim=1)
    assert sink.nbytes() == size and torch.isfinite(rest).all()
    one = layered(layers="N", n_layer=1)
    cache = SinkCache(one, 1, S, window)
    last = torch.cat([one.decode(idx[:, t : t + 1], cache) for t in range(40)], dim=1)[:, -1]
    kept = torch.cat((idx[:, :S], idx[:, -window:]), dim=1)
    assert torch.allclose(last, one(kept)[:, -1], atol=1e-5)
    assert not torch.allclose(last, one(kept, pos=torch.arange(29, 40))[:, -1], atol=1e-3)  # the query at 39


def test_learned_sink_tokens_before_position_zero():
    """positional=sink with two learned tokens (positions -2, -1) and N layers: the temperature is 1 there (ln 0
    would be -inf), and decoding equals the full forward."""
    model, idx = layered("sink", spec={"n_sink": 2}), tokens()
    full = model(idx)
    cache = DenseCache(model, 2, 64)
    decoded = torch.cat([model.decode(idx[:, t : t + 1], cache) for t in range(T)], dim=1)
    assert torch.isfinite(full).all() and torch.allclose(full, decoded, atol=1e-4)


def composed(*overrides):
    from conftest import ROOT

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=[*overrides, "out_dir=x"])


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["positional=irope", "positional.layers=PPXN"], "positional.layers=PPXN"),
        (["positional=irope", "positional.layers=4"], "positional.layers=4"),
        (["positional=irope", "positional.attn_scale=-1"], "positional.attn_scale"),
        (["positional=irope", "positional.floor_scale=0"], "positional.floor_scale"),
        (["positional=learned", "+positional.layers=PPPN"], "positional.layers"),
        (["positional=nope", "+positional.layers=PPPN"], "positional.layers"),
        (["positional=pope", "+positional.layers=PPPN"], "positional.layers"),
    ],
)
def test_bad_layer_options_are_one_line_errors(overrides, key):
    with pytest.raises(UserError) as e:
        cfg = composed(*overrides)
        checks.check(cfg)
        checks.check_model(cfg)
    assert key in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("size", ["tiny", "small", "d12"])
def test_irope_is_one_word(size):
    """positional=irope: RoPE with NoPE in every 4th layer (Llama 4's 3, 7, 11), the temperature's floor at the
    training length."""
    cfg = composed("positional=irope", f"model={size}")
    checks.check(cfg)
    checks.check_model(cfg)
    resolved = schema.plain(cfg)
    spec, n_layer = resolved["positional"], resolved["model"]["n_layer"]
    model_cfg = GPTConfig(**schema.model_config(resolved, vocab_size=97))
    assert [i for i in range(n_layer) if model_cfg.layer_nope(i)] == list(range(3, n_layer, 4))
    pe, nope = build_layers(spec, 4, 32, 128)
    assert pe.name == "rope" and (nope.attn_scale, nope.floor_scale) == (0.1, cfg.train.seq_len)
    with pytest.raises(ValueError, match="positional.layers"):
        GPTConfig(vocab_size=97, positional={**spec, "layers": "RRRN"})
