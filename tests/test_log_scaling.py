"""Log-length attention scaling (model/log_scaling.py): eval-time log_L n and trained SSMax, against their formulas
in an explicit fp32 attention, in every backend, through the dense cache, and through eval.py and a resumed run."""

import json
import math

import pytest
import torch
from conftest import TINY, assert_decoding_equals_full_forward, assert_same_logits_and_grads, config, random_model
from hydra import compose, initialize_config_dir

from evaluation import length
from model.attention import dense_bias, reference_attention
from model.gpt import GPT, GPTConfig
from model.log_scaling import SSMAX_INIT, log_length_factor, log_positions
from model.variant import Variant
from train import train
from utils import runtime

T, L = 24, 4  # a training length of 4: the factor changes at every position of a 24-token test sequence


def tokens(length=T, batch=2, seed=1):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def scaled(name="rope", log=True, **kw):
    """A random model of `name` with model.ssmax (kw ssmax=True), and the variant of log scaling at L (log) or the
    model as trained."""
    model = random_model(name, **kw)
    if model.cfg.ssmax:  # random_model draws every vector from N(0, 1): positive s, as a trained head has
        with torch.no_grad():
            for block in model.blocks:
                block.attn.ssmax.abs_()
    return model, Variant(log_length=L if log else None)


def test_the_factor_is_one_within_the_training_length_and_log_L_n_past_it():
    """n = position + 1 keys seen: position 7 is the 8th, still 1 at L = 8; 8 is the 9th, ln 9 / ln 8. Prefix tokens
    (negative positions) get 1."""
    pos = torch.tensor([-2, -1, 0, 6, 7, 8, 15, 63, 511])
    want = [1, 1, 1, 1, 1, math.log(9) / math.log(8), 4 / 3, 2, 3]
    assert torch.allclose(log_length_factor(pos, 8)[:, 0], torch.tensor(want), atol=1e-6)
    assert torch.equal(log_length_factor(torch.arange(8), 8), torch.ones(8, 1))  # exactly: logits bit-identical
    assert torch.allclose(log_positions(pos)[:, 0], torch.tensor([0, 0, 0, *(math.log(p + 1) for p in pos[3:])]))
    with pytest.raises(ValueError, match="at least 2"):
        log_length_factor(pos, 1)


@pytest.mark.parametrize("name", ["rope", "alibi", "nope", "sink"])
def test_logits_within_the_training_length_are_the_plain_models(name):
    """At L = T every query sees at most L positions: the same logits, bit for bit, as without the option (and an n
    one too large would scale the last query). Past it they change."""
    model, idx = random_model(name), tokens()
    with torch.no_grad():
        plain = model(idx)
        assert torch.equal(model(idx, variant=Variant(log_length=T)), plain)
        past = model(idx, variant=Variant(log_length=T - 1))  # only the last query is past it
    assert torch.equal(past[:, :-1], plain[:, :-1]) and not torch.allclose(past[:, -1], plain[:, -1], atol=1e-3)


def reference_layer(model, x, pos, factor):
    """Layer 0 of `model` computed by hand: q (rotated) x factor, keys and values as they are, an fp32 softmax."""
    attn, pe = model.blocks[0].attn, model.pe
    q, k, v = attn.project(x)
    q = pe.rotate(q, pos) * factor
    k = pe.rotate_key(k, pos)
    bias = dense_bias(pe, pos, pos, True, attn.n_head)
    y = reference_attention(q, k, v, bias)
    return attn.c_proj(y.transpose(1, 2).reshape(x.size(0), len(pos), -1))


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_the_layer_scales_its_queries_by_the_formula(name):
    """Layer 0's output against an explicit attention whose queries are multiplied by max(1, ln(p+1) / ln L) (log)
    and by s_h ln(p+1) (ssmax), written here from the papers' formulas with math.log: scaling the keys instead, or
    counting n from the position itself, gives other numbers."""
    pos, x = torch.arange(T), torch.randn(2, T, 32, generator=torch.Generator().manual_seed(3))
    log = torch.tensor([max(1.0, math.log(p + 1) / math.log(L)) for p in range(T)])[:, None]
    ln_n = torch.tensor([math.log(p + 1) for p in range(T)])[:, None]
    for (model, variant), factor in (
        (scaled(name), log),
        (scaled(name, log=False, ssmax=True), None),
        (scaled(name, ssmax=True), None),
    ):
        attn = model.blocks[0].attn
        if factor is None:
            s = attn.ssmax.detach()[:, None, None]
            factor = s * ln_n * (log if variant.log_length else 1)
        with torch.no_grad():
            got = attn(x, model.plan(pos, pos, True, variant=variant))
            want = reference_layer(model, x, pos, factor)
            assert torch.allclose(got, want, atol=1e-5)
            wrong = reference_layer(model, x, pos, torch.ones(()))
            assert not torch.allclose(got, wrong, atol=1e-3)  # the factor does something here


def test_every_layer_and_window_plan_carries_the_factor():
    """A PN model with SL windows: the scheme's plan, the NoPE layers' plan and each one's window plan all hold the
    same query factor, so no layer attends unscaled."""
    model, variant = scaled(
        n_layer=4, window=5, window_pattern="SL", positional={"name": "rope", "layers": "PN"}, ssmax=True
    )
    pos = torch.arange(T)
    plan = model.plan(pos, pos, True, variant=variant)
    for block in model.blocks:
        own = block.attn.own_plan(plan)
        assert torch.equal(own.q_scale, log_length_factor(pos, L)) and torch.equal(own.log_n, log_positions(pos))


CASES = [
    ("rope", {}),
    ("alibi", {"window": 5, "window_pattern": "SL"}),
    ("rope", {"positional": {"name": "rope", "layers": "PN"}}),
    ("fox", {}),
]


@pytest.mark.parametrize("name, kw", CASES)
@pytest.mark.parametrize("ssmax", [False, True])
def test_dense_cache_decoding_equals_the_full_forward(name, kw, ssmax):
    """Token by token, in chunks and (without a window ring) the static step: each query's factor is read from its
    absolute position, as in the full forward."""
    model, variant = scaled(name, ssmax=ssmax, **kw)
    assert_decoding_equals_full_forward(model, tokens(), static="window" not in kw, variant=variant)


@pytest.mark.parametrize("name", ["rope", "alibi"])
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_backends_agree_with_the_fp32_reference(name, backend):
    """Log scaling and SSMax together, with windows: sdpa (its blocked causal path, and is_causal without a bias or
    window) and flex (forward, eager on the CPU) give the reference's logits, sdpa its gradients (s included)."""
    kw = dict(ssmax=True, n_layer=2, window=5, window_pattern="SL")
    (ref, v), (other, _) = scaled(name, attn_backend="reference", **kw), scaled(name, attn_backend=backend, **kw)
    idx = tokens(80)  # past BLOCK_MIN_ROWS: the sdpa bias path splits its queries into diagonal blocks
    with torch.no_grad():
        assert torch.allclose(ref(idx, variant=v), other(idx, variant=v), atol=2e-4)
    if backend == "sdpa":  # gradients at 24 tokens: at 80 the sharpened softmax leaves fp32 noise above 1e-3
        assert_same_logits_and_grads(other, ref, tokens(), v)
        (plain_ref, v), (plain, _) = scaled(name, attn_backend="reference", ssmax=True), scaled(name, ssmax=True)
        assert_same_logits_and_grads(plain, plain_ref, tokens(), v)  # no bias, no window: SDPA's is_causal path


def test_ssmax_starts_at_its_init_learns_and_is_saved(tmp_path, shakespeare_dir):
    """model.ssmax=true: every layer's s starts at 0.43 and gets a gradient; a run stopped and resumed continues the
    straight run's loss curve (s in the checkpoint, ssmax in its model config)."""
    model = GPT(GPTConfig(vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ssmax=True))
    assert all(torch.equal(b.attn.ssmax, torch.full((4,), SSMAX_INIT)) for b in model.blocks)
    with torch.no_grad():  # zero-initialised projections would leave s without a gradient at step 0
        for block in model.blocks:
            block.attn.c_proj.weight.normal_(0, 0.1)
    model(tokens(), tokens(seed=2)).backward()
    assert all(b.attn.ssmax.grad.abs().min() > 0 for b in model.blocks)
    opts = [*TINY, "model.ssmax=true", "train.schedule=constant", "train.warmup_steps=1", "train.eval_interval=100"]
    train(config(*opts, "train.max_steps=4"), tmp_path / "straight")
    train(config(*opts, "train.max_steps=2"), tmp_path / "stopped")
    train(config(*opts, "train.max_steps=4", "train.resume=true"), tmp_path / "stopped")
    a, b = (train_losses(tmp_path / run) for run in ("straight", "stopped"))
    assert len(a) == 4 and b == pytest.approx(a, abs=1e-5)
    ckpt = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=True)
    assert ckpt["model_config"]["ssmax"] is True
    assert not torch.equal(ckpt["model"]["blocks.1.attn.ssmax"], torch.full((4,), SSMAX_INIT))


def train_losses(run_dir):
    lines = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return [m["train_loss"] for m in lines if "train_loss" in m]


def test_eval_scores_a_log_row_beside_none(tiny_checkpoint):
    """eval.log_scaling=true adds a `log` variant, after `none` and before any RoPE variant (whose frequencies must
    not linger into it): the same perplexity as `none` at the training length, another one past it, and not NTK's;
    the model is left unscaled after."""
    import eval as entry

    rt = runtime.setup("cpu", "fp32", 0)
    with initialize_config_dir(config_dir=str(entry.Path(entry.__file__).parent / "configs"), version_base="1.3"):
        cfg = compose("eval", ["eval.tokens=256", "eval.lengths=[32,128]", "device=cpu", "eval.log_scaling=true"])
    for kinds, want in (
        ("all", ["none", "log", "linear", "ntk", "dynamic_ntk", "yarn", "yarn_released", "llama3"]),
        ("ntk", ["log", "ntk"]),
    ):
        cfg.eval.rope_scaling = kinds
        rows = length.evaluate_lengths(tiny_checkpoint, cfg, rt)["results"]
        assert list(dict.fromkeys(r["variant"] for r in rows)) == want
    ppl = {(r["variant"], r["length"], r["mode"]): r["ppl"] for r in rows}
    plain = length.evaluate_lengths(tiny_checkpoint, unscaled(cfg), rt)["results"]
    for r in plain:  # scored after: the model is as it was (no log factor, no NTK frequencies left)
        assert r["variant"] == "none"
        if r["length"] == 32:
            assert ppl["log", 32, r["mode"]] == r["ppl"]
        else:
            assert ppl["log", 128, r["mode"]] not in (r["ppl"], ppl["ntk", 128, r["mode"]])


def unscaled(cfg):
    cfg = cfg.copy()
    cfg.eval.rope_scaling, cfg.eval.log_scaling = "none", False
    return cfg


def test_eval_rerope_adds_both_rerope_rows_equal_to_asking_for_each_by_name(tiny_checkpoint):
    """eval.rerope=true puts rerope and leaky_rerope after `all`'s frequency scalings, each row the same numbers as
    eval.rope_scaling=<kind> alone gives (the frequencies of the rows before it do not linger into it)."""
    import eval as entry

    rt = runtime.setup("cpu", "fp32", 0)
    with initialize_config_dir(config_dir=str(entry.Path(entry.__file__).parent / "configs"), version_base="1.3"):
        cfg = compose("eval", ["eval.tokens=256", "eval.lengths=[32,128]", "device=cpu", "eval.rope_scaling=all"])
    cfg.eval.rerope = True
    rows = length.evaluate_lengths(tiny_checkpoint, cfg, rt)["results"]
    want = ["none", "linear", "ntk", "dynamic_ntk", "yarn", "yarn_released", "llama3", "rerope", "leaky_rerope"]
    assert list(dict.fromkeys(r["variant"] for r in rows)) == want
    ppl = {(r["variant"], r["length"], r["mode"]): r["ppl"] for r in rows}
    for kind in ("rerope", "leaky_rerope"):
        alone = unscaled(cfg)
        alone.eval.rope_scaling, alone.eval.rerope = kind, False
        for r in length.evaluate_lengths(tiny_checkpoint, alone, rt)["results"]:
            assert ppl[kind, r["length"], r["mode"]] == r["ppl"]
    assert ppl["rerope", 128, "nonoverlap"] != ppl["none", 128, "nonoverlap"]  # past L the far rotation acts
