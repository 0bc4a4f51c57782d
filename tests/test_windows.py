"""Sliding-window attention (model.window, model.window_pattern): what a windowed layer may see, in every backend,
the fast dense path and both caches."""

import pytest
import torch
from conftest import assert_same_logits_and_grads, random_model

from evaluation.sink_mass import attention_probs
from model.attention import make_plan
from model.kv_cache import DenseCache, SinkCache

W = 5


def tokens(length=24, batch=2, seed=1):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["rope", "alibi", "pope"])
def test_a_window_layer_never_sees_a_key_w_or_more_back(name):
    """One windowed layer: logits at i change with token i - W + 1 and never with token i - W or earlier."""
    model, idx = random_model(name, n_layer=1, window=W), tokens()
    changed = idx.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 97
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, 10 + W :], b[:, 10 + W :], atol=1e-6)  # token 10 is W or more back from 15 on
    assert not torch.allclose(a[:, 10 + W - 1], b[:, 10 + W - 1], atol=1e-4)  # and W - 1 back it is seen
    assert not torch.allclose(model(idx), random_model(name, n_layer=1)(idx), atol=1e-3)


def test_the_pattern_picks_the_layers():
    model = random_model("rope", n_layer=5, window=W, window_pattern="SSL")
    assert [b.attn.window for b in model.blocks] == [W, W, None, W, W]
    probs = attention_probs(model, tokens())  # the diagnostic reads each layer's own mask
    far = torch.ones(24, 24).tril(-W).bool()
    assert [bool(p[..., far].abs().max() == 0) for p in probs] == [True, True, False, True, True]


@pytest.mark.parametrize("name", ["rope", "t5", "xpos"])
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_window_backends_agree_with_the_fp32_reference(name, backend):
    ref = random_model(name, attn_backend="reference", window=W, window_pattern="SL")
    other = random_model(name, attn_backend=backend, window=W, window_pattern="SL")
    idx = tokens()
    with torch.no_grad():  # flex: its forward, run eagerly (the CPU has no flex backward)
        assert torch.allclose(ref(idx), other(idx), atol=2e-4)
    if backend == "sdpa":
        assert_same_logits_and_grads(other, ref, idx)


def test_diagonal_blocks_drop_keys_past_the_window():
    """A long windowed forward splits into query blocks that leave far keys out: same logits and gradients."""
    blocked = random_model("alibi", attn_backend="sdpa", window=20)
    reference = random_model("alibi", attn_backend="reference", window=20)
    pos = torch.arange(150)
    plan = blocked.plan(pos, pos, True).windows[20]
    assert plan.window == 20 and len(plan.mask.blocks) > 2
    assert_same_logits_and_grads(blocked, reference, tokens(150))


def test_flex_block_mask_equals_the_dense_window_mask():
    from torch.nn.attention.flex_attention import create_mask

    model = random_model("rope")
    q_pos, k_pos = torch.arange(5, 40), torch.arange(0, 40)
    dense = make_plan(model.pe, q_pos, k_pos, True, 4, backend="sdpa", window=7).mask.bias
    flex = make_plan(model.pe, q_pos, k_pos, True, 4, backend="flex", window=7)
    visible = create_mask(flex.mask.block_mask.mask_mod, 1, 1, len(q_pos), len(k_pos), device="cpu")[0, 0]
    assert torch.equal(visible, dense[0].isfinite())
    assert visible.sum(-1).max() == 7


@pytest.mark.parametrize("name", ["rope", "sink", "pope", "learned"])
def test_dense_cache_keeps_a_ring_of_w_keys_per_window_layer_and_decodes_exactly(name):
    model, idx = random_model(name, n_layer=3, window=W, window_pattern="SL"), tokens()
    full = model(idx)
    step = DenseCache(model, 2, 64)
    one_by_one = torch.cat([model.decode(idx[:, t : t + 1], step) for t in range(24)], dim=1)
    chunked = DenseCache(model, 2, 64)
    pieces = [model.decode(idx[:, a:b], chunked) for a, b in ((0, 9), (9, 11), (11, 24))]
    assert torch.allclose(full, one_by_one, atol=1e-4) and torch.allclose(full, torch.cat(pieces, 1), atol=1e-4)
    assert step.k.size(0) == 1 and step.wk.shape[0] == 2 and step.wk.size(3) == step.wv.size(3) == W
    assert sorted(step.ring_pos.tolist()) == list(range(24 - W, 24))  # the last W tokens, nothing older


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_sink_cache_streams_a_windowed_model(name):
    """Far past its capacity, a sink cache holds a one-layer windowed model at a fresh forward over the last W tokens
    (its window lies within the cache's), at constant memory."""
    model, idx = random_model(name, n_layer=1, window=W), tokens(40, batch=1)
    cache = SinkCache(model, 1, 2, 8)
    size = cache.nbytes()
    logits = torch.cat([model.decode(idx[:, t : t + 1], cache) for t in range(40)], dim=1)
    assert torch.allclose(logits[:, -1], model(idx[:, -W:])[:, -1], atol=1e-5) and cache.nbytes() == size
