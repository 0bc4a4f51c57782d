"""The invariants every scheme must keep (DESIGN.md): causality, translation invariance, backend agreement,
KV-cache equality, save/load."""

import pytest
import torch
from conftest import ABSOLUTE, SCHEMES, SHIFT_INVARIANT, checkpoint_state, random_model

import positional
from model.attention import make_plan
from model.gpt import GPT, GPTConfig
from model.kv_cache import DenseCache
from utils import checkpoint

T = 24


def tokens(seed=1, batch=2, length=T):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", SCHEMES)
def test_causality(name):
    model, idx = random_model(name), tokens()
    changed = idx.clone()
    changed[:, 15] = (changed[:, 15] + 1) % 97
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :15], b[:, :15], atol=1e-5)
    assert not torch.allclose(a[:, 15:], b[:, 15:], atol=1e-3)  # and the change is seen from t on


@pytest.mark.parametrize("name", SHIFT_INVARIANT)
def test_relative_schemes_are_translation_invariant(name):
    model, idx = random_model(name), tokens()
    pos = torch.arange(T)
    assert torch.allclose(model(idx, pos=pos), model(idx, pos=pos + 1000), atol=1e-4)


@pytest.mark.parametrize("name", ABSOLUTE)
def test_absolute_schemes_are_not(name):
    model, idx = random_model(name), tokens()
    pos = torch.arange(T)
    assert not torch.allclose(model(idx, pos=pos), model(idx, pos=pos + 100), atol=1e-3)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_backends_agree_with_the_fp32_reference(name, backend):
    if backend == "flex" and positional.SCHEMES[name].content_weights is not None:
        pytest.skip("weights that read every score refuse flex (tests/test_content_weights.py)")
    ref = random_model(name, attn_backend="reference")
    other = random_model(name, attn_backend=backend)
    idx = tokens()
    with torch.no_grad():
        assert torch.allclose(ref(idx), other(idx), atol=2e-4)
    if backend == "sdpa":  # flex has no backward on CPU
        y = torch.randint(0, 97, idx.shape)
        g_ref = torch.autograd.grad(ref(idx, y), list(ref.parameters()))
        g_sdpa = torch.autograd.grad(other(idx, y), list(other.parameters()))
        for a, b in zip(g_ref, g_sdpa, strict=True):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire"])
def test_flex_score_mod_and_mask_equal_the_dense_bias(name):
    """The closures flex runs (score_mod, mask_mod over position tensors) give exactly the dense SDPA bias,
    for queries and keys at different positions (a chunked prefill)."""
    from torch.nn.attention.flex_attention import create_mask

    model = random_model(name)
    q_pos, k_pos = torch.arange(5, 12), torch.arange(0, 12)
    dense = make_plan(model.pe, q_pos, k_pos, True, 4, backend="sdpa").mask.bias
    flex = make_plan(model.pe, q_pos, k_pos, True, 4, backend="flex")
    visible = create_mask(flex.mask.block_mask.mask_mod, 1, 1, len(q_pos), len(k_pos), device="cpu")[0, 0]
    assert torch.equal(visible, dense[0].isfinite())
    zero = torch.tensor(0.0)
    for h in range(4):
        for i in range(len(q_pos)):
            for j in range(len(k_pos)):
                got = flex.mask.score_mod(zero, torch.tensor(0), torch.tensor(h), torch.tensor(i), torch.tensor(j))
                if visible[i, j]:
                    assert got.item() == pytest.approx(dense[h, i, j].item(), abs=1e-6)


@pytest.mark.parametrize("name", SCHEMES)
def test_kv_cache_decoding_equals_full_forward(name):
    model, idx = random_model(name), tokens()
    full = model(idx)
    step = DenseCache(model, 2, 64)
    one_by_one = torch.cat([model.decode(idx[:, t : t + 1], step) for t in range(T)], dim=1)
    chunked = DenseCache(model, 2, 64)
    pieces = torch.cat(
        [model.decode(idx[:, :10], chunked), model.decode(idx[:, 10:13], chunked), model.decode(idx[:, 13:], chunked)],
        dim=1,
    )
    assert torch.allclose(full, one_by_one, atol=1e-4)
    assert torch.allclose(full, pieces, atol=1e-4)


def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="does not divide model.d_model"):
        GPTConfig(vocab_size=10, n_head=5, d_model=32)
    with pytest.raises(ValueError, match="GQA"):
        GPTConfig(vocab_size=10, n_head=4, n_kv_head=3, d_model=32)


@pytest.mark.parametrize("name", SCHEMES)
def test_save_load_gives_the_same_logits(name, tmp_path):
    model = random_model(name)
    checkpoint.save(tmp_path / "ckpt.pt", checkpoint_state(model))
    loaded, _ = checkpoint.load_model(tmp_path)
    idx = tokens()
    assert torch.equal(model(idx), loaded(idx))


@pytest.mark.parametrize("name", ["rope", "alibi"])
@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_grouped_query_attention_shares_each_key_head_with_its_group(name, backend):
    """GQA with 2 key/value heads for 4 query heads equals full multi-head attention whose key and value heads are
    each repeated for the 2 query heads of their group (heads 0, 1 read kv head 0; heads 2, 3 kv head 1)."""
    gqa = random_model(name, n_kv_head=2, attn_backend=backend)
    full = random_model(name, n_kv_head=4, attn_backend=backend)
    state = gqa.state_dict()
    for key, w in state.items():
        if key.endswith(("attn.c_k.weight", "attn.c_v.weight")):  # (2 heads x 8, 32) -> (4 heads x 8, 32)
            state[key] = w.view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
    full.load_state_dict(state)
    assert gqa.blocks[0].attn.c_k.weight.shape == (16, 32)
    idx = tokens()
    assert torch.allclose(gqa(idx), full(idx), atol=1e-5)
    state = full.state_dict()  # and the grouping matters: pairing query heads with the wrong kv head differs
    for key, w in state.items():
        if key.endswith("attn.c_k.weight"):
            state[key] = w.view(4, 8, 32).flip(0).reshape(32, 32)
    full.load_state_dict(state)
    assert not torch.allclose(gqa(idx), full(idx), atol=1e-3)


def test_fresh_model_output_projections_are_zero():
    model = GPT(GPTConfig(vocab_size=10, d_model=32))
    for block in model.blocks:
        assert block.attn.c_proj.weight.abs().sum() == 0 and block.mlp.c_proj.weight.abs().sum() == 0
    assert all(p.dim() != 1 for p in model.parameters())  # no biases, no norm weights


@pytest.mark.parametrize("name", ["shaw", "fox"])
def test_flex_content_bias_in_a_chunked_prefill_equals_the_reference(name):
    """Flex's per-layer score_mod reads the content tables at rows clamped to the real ones (flex pads queries and
    keys to 128): queries and keys at different positions (a cache) give the reference's full forward."""
    flex, ref = random_model(name, attn_backend="flex"), random_model(name, attn_backend="reference")
    idx = tokens()
    cache = DenseCache(flex, 2, 64)
    with torch.no_grad():
        got = torch.cat([flex.decode(idx[:, :10], cache), flex.decode(idx[:, 10:], cache)], dim=1)
        assert torch.allclose(got, ref(idx), atol=2e-4)


@pytest.mark.parametrize("inner", ["shaw", "fox"])
def test_a_learned_sink_token_wraps_a_content_bias(inner):
    """positional=sink positional.inner={name:fox}: the content hooks pass through the wrapper, sink token first."""
    model = random_model("sink", positional={"name": "sink", "inner": {"name": inner}})
    assert model.blocks[0].attn.pe_layer is not None if inner == "fox" else model.pe.content_bias is not None
    idx = tokens()
    step = torch.cat(
        [model.decode(idx[:, t : t + 1], cache) for cache in [DenseCache(model, 2, 64)] for t in range(T)], 1
    )
    assert torch.allclose(model(idx), step, atol=1e-4)


@pytest.mark.parametrize("name", ["rope", "fox", "path"])
def test_matrices_held_in_bf16_decode_as_autocast_computes(name):
    """hold_matrices (sample.py, decode_bench): decoding under bf16 autocast with every matrix weight kept in bf16
    gives exactly the logits of fp32 weights that autocast casts at every step, through a dense cache and the static
    step; embeddings and a scheme's own tensors stay fp32."""
    from model.kv_cache import hold_matrices
    from model.static_decode import StaticDecoder

    cast, held = random_model(name), hold_matrices(random_model(name), torch.bfloat16)
    assert held.lm_head.weight.dtype == held.blocks[0].attn.c_q.weight.dtype == torch.bfloat16
    assert held.wte.weight.dtype == torch.float32
    idx = tokens()
    outs = []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for model in (cast, held):
            cache = DenseCache(model, 2, 64, torch.bfloat16)
            first = model.decode(idx[:, :5], cache)[:, -1]
            step = StaticDecoder(model, cache, compile=False)
            outs.append(torch.stack([first, *(step(idx[:, t : t + 1]) for t in range(5, T))], dim=1))
    assert torch.equal(outs[0], outs[1])


def test_sample_decodes_in_its_dtype_with_matrices_held_in_it(tiny_checkpoint, monkeypatch):
    """sample.py dtype=bf16 (auto on CUDA) decodes under bf16 autocast with bf16 matrix weights and a bf16 cache (it
    decoded in fp32, ignoring the setting)."""
    from conftest import ROOT
    from hydra import compose, initialize_config_dir

    import sample

    seen = []

    def record(model, enc, prompt, cache, *args, **kw):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), model.lm_head.weight.dtype))
        seen.append(cache.k.dtype)
        return 0, None

    monkeypatch.setattr(sample, "stream_one", record)
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("sample", [f"checkpoint={tiny_checkpoint}", "device=cpu", "dtype=bf16", "max_new_tokens=2"])
    sample.sample(cfg)
    assert seen == [(True, torch.bfloat16, torch.bfloat16), torch.bfloat16]
