"""A RoPE base per layer (positional.global_base, Gemma 3): the full-attention layers rotate at their own base, made
once per forward in plan.long, in every backend and both caches.

python -m pytest -q tests/test_global_base.py
"""

import pytest
import torch
from conftest import assert_decoding_equals_full_forward, assert_same_logits_and_grads, random_model

import positional
from model.gpt import GPTConfig
from model.kv_cache import DenseCache, SinkCache
from model.variant import Variant
from positional.rope import RoPE
from positional.rope_scaling import Scaling

W, LOCAL, GLOBAL = 5, 10000.0, 1e6


def tokens(length=24, batch=2, seed=1):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def two_bases(name="rope", **kw):
    """A random model of `name` at base 10,000 whose full-attention layers rotate at 1,000,000."""
    spec = {"name": name, "base": LOCAL, "global_base": GLOBAL, **kw.pop("spec", {})}
    return random_model(name, positional=spec, **{"window": W, **kw})


def test_the_full_attention_layers_take_the_global_base():
    """SSL over 6 layers: layers 2 and 5 attend to every key at base 1M, the rest in windows at 10,000; their
    rotation state is RoPE's at that base, made once in plan.long."""
    model = two_bases(n_layer=6, window_pattern="SSL")
    assert [b.attn.long for b in model.blocks] == [False, False, True] * 2
    assert [b.attn.window for b in model.blocks] == [W, W, None] * 2
    assert (model.pe.base, model.pe_long.base) == (LOCAL, GLOBAL)
    pos = torch.arange(12)
    plan = model.plan(pos, pos, True)
    cos, sin = RoPE(4, 8, 32, base=GLOBAL).rotation(pos)
    assert torch.equal(plan.long.q_rot[0], cos) and torch.equal(plan.long.q_rot[1], sin)
    assert plan.long.windows is None and list(plan.windows) == [W]
    assert model.blocks[2].attn.own_plan(plan) is plan.long and model.blocks[0].attn.own_plan(plan) is plan.windows[W]


def test_it_is_the_base_of_those_layers_and_no_other():
    """Every layer full: the model is RoPE at the global base (the same weights); the global base at base's value:
    RoPE at base. No full-attention layer for the global base: refused, not ignored. The N layers keep NoPE."""
    idx = tokens()
    with torch.no_grad():
        all_full = two_bases(window=None)(idx)
        assert torch.equal(all_full, random_model("rope", positional={"name": "rope", "base": GLOBAL})(idx))
        same = random_model("rope", window=W, window_pattern="SL", positional={"name": "rope", "global_base": 1e4})
        plain = random_model("rope", window=W, window_pattern="SL")
        assert torch.equal(same(idx), plain(idx))
    with pytest.raises(ValueError, match=r"positional.global_base=1000000.0 .*window_pattern=S .*leaves none"):
        two_bases()  # the default pattern S: every layer windowed, none for the global base
    layered = two_bases(n_layer=4, window_pattern="SL", spec={"layers": "PPPN"})
    assert [b.attn.long for b in layered.blocks] == [False, True, False, False]
    assert [b.attn.nope for b in layered.blocks] == [False, False, False, True]
    assert not torch.allclose(two_bases(window_pattern="SL")(idx), plain(idx), atol=1e-3)


@pytest.mark.parametrize("name", ["rope", "xpos", "prope"])
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_backends_agree_with_the_fp32_reference(name, backend):
    ref = two_bases(name, attn_backend="reference", window_pattern="SL")
    other = two_bases(name, attn_backend=backend, window_pattern="SL")
    idx = tokens()
    with torch.no_grad():  # flex: its forward, run eagerly (the CPU has no flex backward)
        assert torch.allclose(ref(idx), other(idx), atol=2e-4)
    if backend == "sdpa":
        assert_same_logits_and_grads(other, ref, idx)


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_causality(name):
    model, idx = two_bases(name, n_layer=3, window_pattern="SL"), tokens()
    changed = idx.clone()
    changed[:, 15] = (changed[:, 15] + 1) % 97
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :15], b[:, :15], atol=1e-5) and not torch.allclose(a[:, 15:], b[:, 15:], atol=1e-3)


@pytest.mark.parametrize("name, window", [("rope", None), ("rope", W), ("xpos", W)])
def test_kv_cache_decoding_equals_full_forward(name, window):
    """Without a window every layer is at the global base (the static step too); with one, the window layers' rings
    hold keys at 10,000 and the full layers' rows at 1M."""
    model = two_bases(name, n_layer=4, window=window, window_pattern="SL")
    assert_decoding_equals_full_forward(model, tokens(), static=window is None)


def test_far_scores_rotate_each_layer_at_its_base():
    """ReRoPE at eval scales both bases' rotations: decoding equals the full forward, and the full layers' far
    rotation is the global base's."""
    model, variant = two_bases(n_layer=4, window_pattern="SL"), Variant(Scaling("rerope", 4.0, 20, window=12))
    assert_decoding_equals_full_forward(model, tokens(40), static=False, variant=variant)
    pos = torch.arange(40)
    plan = model.plan(pos, pos, True, variant=variant)
    far_pos = plan.long.parts.q_pos[0]
    assert torch.equal(plan.long.parts.q_rot[0][0], RoPE(4, 8, 32, base=GLOBAL).rotation(far_pos, variant.scaling)[0])


def test_sink_cache_equals_dense_while_it_fits():
    model, idx = two_bases(n_layer=2, window_pattern="SL"), tokens(11, batch=1)
    dense, sink = DenseCache(model, 1, 64), SinkCache(model, 1, 3, 8)
    a = torch.cat([model.decode(idx[:, t : t + 1], dense) for t in range(11)], dim=1)
    b = torch.cat([model.decode(idx[:, t : t + 1], sink) for t in range(11)], dim=1)
    assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize(
    "spec, key",
    [
        ({"name": "rope", "global_base": 0}, "positional.global_base=0"),
        ({"name": "alibi", "global_base": 1e6}, "positional.global_base is not an option of positional=alibi"),
        ({"name": "sink", "inner": {"name": "rope", "global_base": 1e6}}, "positional.inner.global_base"),
    ],
)
def test_bad_global_bases_are_one_line_errors(spec, key):
    with pytest.raises(ValueError) as e:
        GPTConfig(vocab_size=97, window=4, window_pattern="SL", positional=spec)
        positional.build(spec, 4, 8, 32)
    assert key in str(e.value) and "\n" not in str(e.value)
