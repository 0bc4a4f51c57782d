"""ReRoPE and Leaky ReRoPE (positional/rerope.py): exact against a brute force, in every backend and cache.

python -m pytest -q tests/test_rerope.py      (the CUDA test is skipped where CUDA is absent)
The brute force builds each (query, key) score from the clamped or compressed distance itself, q_i rotated by
d' theta against an unrotated k_j, in float64: it shares no code with the far rotation it checks.
"""

import math

import pytest
import torch
from conftest import assert_decoding_equals_full_forward, random_model
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from evaluation import length, variants
from model.gpt import norm
from model.kv_cache import SinkCache
from model.variant import Variant
from positional import rerope
from positional.rope_scaling import Scaling
from utils import runtime
from utils.errors import UserError

W, TRAIN = 12, 20  # the window, and the training length the leak's auto k is worked out from
T = 80  # > 64: the sdpa path goes by query blocks along the diagonal
KINDS = {"rerope": None, "leaky_rerope": 3.5}  # kind -> k (rerope: inf), a k that is no whole number


def scaled(kind, name="rope", w=W, leak=None, **kw):
    """A random model of `name` (kw: its config, model.window among them) and the variant that extends it by `kind`
    at factor 4 from TRAIN tokens, ReRoPE's window w."""
    return random_model(name, **kw), Variant(Scaling(kind, 4.0, TRAIN, window=w, leak=leak))


def logits(pair, idx, **kw):
    model, variant = pair
    return model(idx, variant=variant, **kw)


def tokens(n=T, batch=2, seed=0):
    return torch.randint(0, 97, (batch, n), generator=torch.Generator().manual_seed(seed))


def brute_force_attention(attn, x, w, k):
    """One attention layer in float64, scores at the distances ReRoPE defines, built per (query, key)."""
    q, key, v = (t.double() for t in attn.project(x))
    groups = attn.n_head // attn.n_kv_head
    key, v = key.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    n, dh = x.size(1), q.size(-1)
    d = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).double()
    dist = torch.where(d < w, d, w + (d - w) / k)  # k = inf: w
    theta = 10000.0 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angle = dist[..., None] * theta  # (Tq, Tk, Dh/2)
    q1, q2 = (half[:, :, :, None] for half in q.chunk(2, dim=-1))  # (B, H, Tq, 1, Dh/2)
    k1, k2 = (half[:, :, None] for half in key.chunk(2, dim=-1))  # (B, H, 1, Tk, Dh/2)
    # (q_i rotated by angle) . k_j: the score RoPE gives a query and key d' apart
    scores = ((q1 * angle.cos() - q2 * angle.sin()) * k1 + (q1 * angle.sin() + q2 * angle.cos()) * k2).sum(-1)
    scores = (scores / math.sqrt(dh)).masked_fill(d < 0, float("-inf"))
    y = scores.softmax(-1) @ v
    return y.transpose(1, 2).reshape(*x.shape[:2], -1) @ attn.c_proj.weight.double().T


def brute_force_logits(model, idx, w, k):
    x = model.wte(idx).double()
    for block in model.blocks:
        x = x + brute_force_attention(block.attn, norm(x.float()), w, k)
        x = x + block.mlp(norm(x.float())).double()
    return model._head(x.float())


@pytest.mark.parametrize("kind", KINDS)
def test_inside_the_window_it_is_rope(kind):
    """A window past every distance leaves RoPE exactly (fp32): the far scores are never taken. Leaky ReRoPE at
    k = 1 is RoPE at any window: the far rotation then puts every query and key where RoPE does."""
    idx, plain = tokens(), random_model("rope")
    with torch.no_grad():
        want = plain(idx)
        assert torch.allclose(logits(scaled(kind, w=T), idx), want, atol=1e-5)
        if kind == "leaky_rerope":
            assert torch.allclose(logits(scaled(kind, w=4, leak=1.0), idx), want, atol=1e-4)
        assert not torch.allclose(logits(scaled(kind, leak=KINDS[kind]), idx), want, atol=1e-2)  # it acts past W


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("kind", KINDS)
def test_past_the_window_logits_equal_the_brute_force(kind, backend):
    """The whole model's logits against the float64 brute force (flex: test_backends_agree)."""
    idx = tokens()
    model, variant = scaled(kind, leak=KINDS[kind], attn_backend=backend)
    with torch.no_grad():
        got = model(idx, variant=variant)
        want = brute_force_logits(model, idx, W, KINDS[kind] or math.inf)
    assert torch.allclose(got, want.float(), atol=2e-4), (got - want).abs().max()


@pytest.mark.parametrize("kind", KINDS)
def test_translation_invariant(kind):
    """Shifting every position by c moves the far queries and keys alike (by c / k), so the logits stay: with the
    auto k, no whole number (at factor 4 from 20 tokens, w 12: (79 - 12) / (19 - 12))."""
    pair, idx = scaled(kind), tokens()
    assert kind == "rerope" or pair[1].scaling.leak % 1 > 0
    with torch.no_grad():
        base = logits(pair, idx)
        for c in (7, 1000):
            assert torch.allclose(logits(pair, idx, pos=torch.arange(T) + c), base, atol=1e-4), c


def test_auto_leak_keeps_every_distance_trained():
    """auto k: the longest distance of the target length lands on the longest trained one; k = 1 within it."""
    k = rerope.leak("leaky_rerope", W, TRAIN, 4.0)
    assert k == pytest.approx((4 * TRAIN - 1 - W) / (TRAIN - 1 - W))
    assert W + (4 * TRAIN - 1 - W) / k == pytest.approx(TRAIN - 1)
    assert rerope.leak("leaky_rerope", W, TRAIN, 1.0) == 1.0 and rerope.leak("rerope", W, TRAIN, 4.0) == math.inf
    assert rerope.window(256) == 128


@pytest.mark.parametrize("variant", ["rope", "rope-window", "rope-nope", "sink", "pope", "xpos"])
@pytest.mark.parametrize("kind", KINDS)
def test_kv_cache_decoding_equals_the_full_forward(kind, variant):
    """Token by token, in chunks and by the static step, through the dense cache (its far keys beside the near
    ones; with model.window=24 > w, in the window layers' rings too, where the static step keeps none; with
    positional.layers=PN, a NoPE layer's unsplit keys in a row as wide as the split's)."""
    name, _, option = variant.partition("-")
    kw = {"window": 24, "window_pattern": "SL"} if option == "window" else {}
    if option == "nope":
        kw["positional"] = {"name": name, "layers": "PN"}
    model, variant = scaled(kind, name, leak=KINDS[kind], **kw)
    assert model.cfg.window == kw.get("window")
    # static: no rings
    assert_decoding_equals_full_forward(model, tokens(40), static=option != "window", variant=variant)


@pytest.mark.parametrize("kind", KINDS)
def test_sink_cache_rotates_at_in_cache_positions(kind):
    """Past its capacity the sink cache re-indexes what it keeps: in a one-layer model (whose cached keys and values
    depend on their token alone) the last token's logits are a full forward over the kept tokens at positions
    0..capacity-1, far scores included."""
    (model, variant), idx = scaled(kind, leak=KINDS[kind], n_layer=1), tokens(50, batch=1)
    cache = SinkCache(model, 1, sinks=2, window=28, variant=variant)
    with torch.no_grad():
        last = torch.cat([model.decode(idx[:, t : t + 1], cache) for t in range(idx.size(1))], dim=1)[:, -1]
        want = model(idx[:, cache.token_indices().sort().values], variant=variant)[:, -1]  # slots by position
    assert torch.allclose(last, want, atol=1e-4)


@pytest.mark.parametrize("options", ["", "sink_logit", "window"])
@pytest.mark.parametrize("kind", KINDS)
def test_backends_agree(kind, options):
    """sdpa (query blocks), the fp32 reference and flex, with the nothing slot or a window. Flex runs eagerly on the
    CPU: the same two calls and log-sum-exp merge as compiled on CUDA (the CPU's compiled flex returns no lse in
    torch 2.13, so the compiled kernel is checked by test_cuda_flex_agrees_in_bf16 only)."""
    kw = {"sink_logit": True} if options == "sink_logit" else {}
    kw = {"window": 40, "window_pattern": "SL"} if options == "window" else kw
    idx = tokens(128)  # two query blocks of 64 (sdpa), the second with far and near spans; one flex block
    with torch.no_grad():
        out = {
            b: logits(scaled(kind, leak=KINDS[kind], attn_backend=b, **kw), idx) for b in ("sdpa", "reference", "flex")
        }
    assert torch.allclose(out["sdpa"], out["reference"], atol=1e-4)
    assert torch.allclose(out["flex"], out["reference"], atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_flex_agrees_in_bf16(kind):
    """On CUDA, 256 queries take compiled flex: two block-sparse calls merged by log-sum-exp, against the fp32
    reference, in bf16 autocast; and a decode through the dense cache (sdpa on the GPU) against the full forward."""
    models = {}
    for backend in ("reference", "auto"):
        model, variant = scaled(kind, leak=KINDS[kind], attn_backend=backend, d_model=128)
        models[backend] = model.cuda()
    idx, pos = tokens(256).cuda(), torch.arange(256, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        plan = models["auto"].plan(pos, pos, True, variant=variant)
        assert plan.backend == "flex" and plan.parts.block_masks[0] is not None
        got, want = (models[b](idx, variant=variant).float() for b in ("auto", "reference"))
    assert (got - want).norm() <= 0.02 * want.norm(), (got - want).abs().max()
    with torch.no_grad():
        assert_decoding_equals_full_forward(models["auto"].float(), idx[:, :40], False, 1e-3, variant)


def test_bad_settings_name_their_key():
    """A non-rotary scheme, w < 1 and k < 1 are refused with the key that set them (the config keys' own checks, one
    line and exit 2 from every entry point: tests/test_errors.py)."""
    import sample

    alibi = random_model("alibi")
    with pytest.raises(UserError, match="eval.rope_scaling=rerope"):
        variants.resolve_variants("rerope", alibi.pe)
    cfg = OmegaConf.create({"rope_scaling": "leaky_rerope", "rerope_leak": "auto", "rerope_window": None})
    ckpt = {"seq_len": TRAIN, "model_config": {"positional": {"name": "alibi"}}}
    with pytest.raises(UserError, match="rope_scaling=leaky_rerope"):
        sample.rope_variant(alibi, ckpt, cfg, 4 * TRAIN)
    with pytest.raises(ValueError, match="w=0"):
        rerope.window(TRAIN, 0)
    with pytest.raises(ValueError, match="k=0.5"):
        rerope.leak("leaky_rerope", W, TRAIN, 4.0, 0.5)


def test_eval_scores_rerope_rows(tiny_checkpoint):
    """eval.rope_scaling=rerope / leaky_rerope rows carry their w and k; at the training length (32, w 16) leaky
    ReRoPE's auto k is 1, the plain model's perplexity exactly, and ReRoPE's clamp changes it; the model is left
    unscaled after."""
    import eval as entry

    rt = runtime.setup("cpu", "fp32", 0)
    with initialize_config_dir(config_dir=str(entry.Path(entry.__file__).parent / "configs"), version_base="1.3"):
        cfg = compose("eval", ["eval.tokens=256", "eval.lengths=[32,64]", "device=cpu", "logger.wandb=false"])
    rows = {}
    for kind in ("none", "rerope", "leaky_rerope"):
        cfg.eval.rope_scaling = kind
        for r in length.evaluate_lengths(tiny_checkpoint, cfg, rt)["results"]:
            rows[r["variant"], r["length"], r["mode"]] = r
    leaky, clamped = rows["leaky_rerope", 32, "nonoverlap"], rows["rerope", 32, "nonoverlap"]
    assert leaky["window"] == clamped["window"] == 16 and leaky["leak"] == 1.0 and clamped["leak"] is None
    assert rows["leaky_rerope", 64, "nonoverlap"]["leak"] == pytest.approx((63 - 16) / (31 - 16), abs=1e-4)
    assert leaky["ppl"] == pytest.approx(rows["none", 32, "nonoverlap"]["ppl"], rel=1e-5)
    assert clamped["ppl"] != pytest.approx(rows["none", 32, "nonoverlap"]["ppl"], rel=1e-5)
