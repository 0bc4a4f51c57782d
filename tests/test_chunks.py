"""Chunked local attention (model.chunk, Llama 4): a query of an S layer sees the keys of its own chunk only, in every
backend, the fast dense path, the dense cache and far scores; the sink cache and static decoding refuse it.

python -m pytest -q tests/test_chunks.py
The masks are checked against floor(q / C) == floor(k / C) written out here, not against the code's own helper.
"""

import pytest
import torch
from conftest import assert_decoding_equals_full_forward, assert_same_logits_and_grads, random_model

from model.attention import Chunk, make_plan
from model.gpt import GPTConfig
from model.kv_cache import CacheError, DenseCache, SinkCache
from model.static_decode import StaticDecoder
from model.variant import Variant
from positional.rope_scaling import Scaling

C = 5


def tokens(length=24, batch=2, seed=1):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def chunk_mask(q_pos, k_pos, size):
    """(Tq, Tk) True where a key is visible: at or before the query, in its chunk (floor division, Python's own)."""
    return torch.tensor(
        [[k <= q and q // size == k // size for k in k_pos.tolist()] for q in q_pos.tolist()], dtype=torch.bool
    )


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_a_chunked_layer_sees_its_own_chunk_only(name):
    """One chunked layer: token 7 (chunk 5..9) changes logits 7..9 and none from 10 on, though 10 and 11 are within
    C of it (a sliding window of C would see it there)."""
    model, idx = random_model(name, n_layer=1, chunk=C), tokens()
    changed = idx.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 97
    a, b = model(idx), model(changed)
    assert torch.equal(a[:, :7], b[:, :7]) and torch.equal(a[:, 10:], b[:, 10:])
    assert all(not torch.allclose(a[:, t], b[:, t], atol=1e-4) for t in (7, 8, 9))
    windowed = random_model(name, n_layer=1, window=C)
    assert not torch.allclose(windowed(idx)[:, 10], windowed(changed)[:, 10], atol=1e-4)


def test_the_pattern_picks_the_chunked_layers():
    model = random_model("rope", n_layer=5, chunk=C, window_pattern="SSL")
    assert [b.attn.window for b in model.blocks] == [Chunk(C), Chunk(C), None, Chunk(C), Chunk(C)]
    assert Chunk(C) != C and len({Chunk(C), C}) == 2  # a chunk has a plan of its own beside a window of as many keys
    pos = torch.arange(12)
    assert list(model.plan(pos, pos, True).windows) == [Chunk(C)]


@pytest.mark.parametrize("offset", [0, 3, -7])
def test_dense_and_flex_masks_are_the_chunk_rule(offset):
    """Dense bias and flex block mask over queries 5..39 (shifted by offset: negative positions, the learned sink
    tokens', floor too) equal the rule written out; a decoding step over a ring's keys too."""
    from torch.nn.attention.flex_attention import create_mask

    model = random_model("rope")
    q_pos, k_pos = torch.arange(5, 40) + offset, torch.arange(0, 40) + offset
    want = chunk_mask(q_pos, k_pos, 7)
    dense = make_plan(model.pe, q_pos, k_pos, True, 4, backend="sdpa", window=Chunk(7)).mask.bias
    flex = make_plan(model.pe, q_pos, k_pos, True, 4, backend="flex", window=Chunk(7))
    visible = create_mask(flex.mask.block_mask.mask_mod, 1, 1, len(q_pos), len(k_pos), device="cpu")[0, 0]
    assert torch.equal(dense[0].isfinite(), want) and torch.equal(visible, want)
    ring = torch.tensor([21, 1 << 40, 19, 20])  # a ring of keys (one slot empty), then the step's own
    keys, query = torch.cat((ring, torch.tensor([22]))), torch.tensor([22])
    step = make_plan(model.pe, query, keys, True, 4, backend="sdpa", window=Chunk(7)).mask.bias
    assert step[0, 0].isfinite().tolist() == [True, False, False, False, True]  # 21 and 22: chunk 21..27


@pytest.mark.parametrize("name", ["rope", "alibi"])
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_chunk_backends_agree_with_the_fp32_reference(name, backend):
    ref = random_model(name, attn_backend="reference", chunk=C, window_pattern="SL")
    other = random_model(name, attn_backend=backend, chunk=C, window_pattern="SL")
    idx = tokens()
    with torch.no_grad():  # flex: its forward, run eagerly (the CPU has no flex backward)
        assert torch.allclose(ref(idx), other(idx), atol=2e-4)
    if backend == "sdpa":
        assert_same_logits_and_grads(other, ref, idx)


def test_diagonal_blocks_of_a_chunked_layer():
    """A long chunked forward goes by query blocks, whose first key is C - 1 before the block (the chunk's start is
    no earlier): same logits and gradients as the reference."""
    blocked = random_model("alibi", attn_backend="sdpa", chunk=20)
    reference = random_model("alibi", attn_backend="reference", chunk=20)
    pos = torch.arange(150)
    assert len(blocked.plan(pos, pos, True).windows[Chunk(20)].mask.blocks) > 2
    assert_same_logits_and_grads(blocked, reference, tokens(150))


@pytest.mark.parametrize("name", ["rope", "alibi", "sink"])
def test_causality(name):
    model, idx = random_model(name, n_layer=3, chunk=C, window_pattern="SL"), tokens()
    changed = idx.clone()
    changed[:, 15] = (changed[:, 15] + 1) % 97
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :15], b[:, :15], atol=1e-5) and not torch.allclose(a[:, 15:], b[:, 15:], atol=1e-3)


@pytest.mark.parametrize("name", ["rope", "alibi", "learned"])
def test_dense_cache_keeps_a_ring_of_c_keys_and_decodes_exactly(name):
    """Token by token and in uneven pieces (9, 2, 13: steps that cross chunk boundaries), the dense cache's ring of
    C keys per chunked layer gives the full forward's logits."""
    model, idx = random_model(name, n_layer=3, chunk=C, window_pattern="SL"), tokens()
    assert_decoding_equals_full_forward(model, idx, static=False)
    cache = DenseCache(model, 2, 64)
    model.decode(idx, cache)
    assert cache.k.size(0) == 1 and cache.wk.shape[0] == 2 and cache.wk.size(3) == C


def test_far_scores_keep_to_the_chunk():
    """ReRoPE's far keys (distance >= w) inside a chunk of 40: sdpa, reference and flex agree, and decoding equals
    the full forward."""
    variant = Variant(Scaling("rerope", 4.0, 20, window=12))
    idx = tokens(128)
    with torch.no_grad():
        out = {
            b: random_model("rope", attn_backend=b, chunk=40, window_pattern="SL")(idx, variant=variant)
            for b in ("sdpa", "reference", "flex")
        }
    assert torch.allclose(out["sdpa"], out["reference"], atol=1e-4)
    assert torch.allclose(out["flex"], out["reference"], atol=1e-4)
    model = random_model("rope", chunk=C, window_pattern="SL")
    assert_decoding_equals_full_forward(model, tokens(40), static=False, variant=variant)


def test_caches_that_cannot_keep_chunks_say_so():
    model = random_model("rope", chunk=C, window_pattern="SL")
    with pytest.raises(CacheError, match="model.chunk=5") as e:
        SinkCache(model, 1, 2, 8)
    assert "\n" not in str(e.value)
    cache = DenseCache(model, 1, 64)
    model.decode(tokens(batch=1)[:, :1], cache)
    with pytest.raises(CacheError, match="static=false"):
        StaticDecoder(model, cache, compile=False)
    full = random_model("rope", chunk=C, window_pattern="L")  # no S layer: nothing chunked, the sink cache serves
    SinkCache(full, 1, 2, 8)


@pytest.mark.parametrize(
    "options, key",
    [({"chunk": 0}, "model.chunk=0"), ({"chunk": 64, "window": 64}, "model.window=64 and model.chunk=64")],
)
def test_bad_chunk_settings_are_one_line_errors(options, key):
    with pytest.raises(ValueError) as e:
        GPTConfig(vocab_size=97, **options)
    assert key in str(e.value) and "\n" not in str(e.value)
