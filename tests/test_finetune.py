"""init_from: a fine-tune takes a checkpoint's weights (not its optimizer or step), at a new length, for any scheme;
positional.scaling is built into the saved model, so eval.py and sample.py rebuild it exactly."""

from dataclasses import asdict

import pytest
import torch
from conftest import SCHEMES, TINY, config, random_model, run, scheme_spec

from evaluation.report import scheme_label, trained_scaling
from evaluation.variants import resolve_variants
from model.gpt import GPT, GPTConfig
from model.variant import Variant
from positional.learned import interpolate_rows
from positional.rope_scaling import Scaling
from train import train
from utils import checkpoint, finetune, schema
from utils.errors import UserError

ADAMW = ["optim=adamw", "train.warmup_steps=0", "train.schedule=constant", "train.max_steps=1"]
STILL = ["optim.lr=1e-12"]  # a step that moves no weight by more than ~1e-12: the weights are where they started


@pytest.fixture(scope="module")
def init_runs(tmp_path_factory, shakespeare_dir):
    """rope and learned runs of 2 AdamW steps at seq_len 32: AdamW's per-parameter step count shows whether a later
    run's optimizer was fresh."""
    root = tmp_path_factory.mktemp("init")
    for name in ("rope", "learned"):
        train(config(*TINY, *ADAMW, f"positional={name}", "train.max_steps=2"), root / name)  # the later max_steps wins
    return root


@pytest.mark.parametrize("name", ["rope", "learned"])
def test_fine_tuning_starts_from_a_checkpoints_weights_and_not_its_optimizer(name, init_runs, tmp_path):
    init = checkpoint.load(init_runs / name)
    out = tmp_path / "ft"
    cfg = config(*TINY, *ADAMW, *STILL, f"positional={name}", f"init_from={init_runs / name}", "train.seq_len=64")
    train(cfg, out)
    ft = checkpoint.load(out)
    assert ft["step"] == 1 and ft["rows"] == cfg.train.batch_size  # its own step count and data position
    assert ft["seq_len"] == 64 and ft["init_from"]["step"] == 2
    steps = {float(s["step"]) for s in ft["optimizer"][0]["state"].values()}
    assert steps == {1.0}  # a fresh AdamW took one step (a resumed one would count 3)
    for key, before in init["model"].items():
        after = ft["model"][key]
        if key == "pe.table.weight":  # 32 rows interpolated to 64: the old rows at the even positions
            assert after.shape == (64, before.shape[1])
            torch.testing.assert_close(after[::2], before, atol=1e-9, rtol=0)
        else:
            torch.testing.assert_close(after, before, atol=1e-9, rtol=0)
    fresh = GPT(GPTConfig(**ft["model_config"])).state_dict()
    assert not torch.allclose(fresh["blocks.0.attn.c_q.weight"], ft["model"]["blocks.0.attn.c_q.weight"])


def test_learned_table_interpolation_keeps_the_rows_where_positions_coincide():
    """Row j of the new table is the old table at j N / n: exactly the old row where that is a whole number."""
    old = torch.randn(32, 8)
    new = interpolate_rows(old, 96)  # 3x: every old row kept, at rows 0, 3, 6, ...
    assert torch.equal(new[::3], old)
    torch.testing.assert_close(new[1], old[0] + (old[1] - old[0]) / 3)
    torch.testing.assert_close(new[2], old[0] + 2 * (old[1] - old[0]) / 3)
    assert torch.equal(new[94], old[31]) and torch.equal(new[95], old[31])  # past the last row: repeated
    assert torch.equal(interpolate_rows(old, 80)[::5], old[::2])  # 2.5x: positions coincide every 5 new rows
    assert torch.equal(interpolate_rows(old, 20), old[:20])  # shrinking keeps the first rows


@pytest.mark.parametrize("name", SCHEMES)
def test_every_scheme_takes_a_shorter_checkpoints_weights(name):
    """Built for twice the length, every scheme loads a checkpoint of half of it; all but the learned table (which
    is resized) then give the same logits over the old length."""
    short = random_model(name, positional=scheme_spec(name, max_positions=32))
    long = random_model(name, seed=1, positional=scheme_spec(name, max_positions=64))
    ckpt = {"model": short.state_dict(), "model_config": asdict(short.cfg), "tokenizer": {}, "step": 5, "seq_len": 32}
    run_ = {"model_config": asdict(long.cfg), "tokenizer": {}}
    finetune.load_weights(long, ckpt, run_, "short")
    idx = torch.randint(0, 97, (1, 32))
    if name == "learned":
        torch.testing.assert_close(long.pe.table.weight[::2], short.pe.table.weight)
    else:
        torch.testing.assert_close(long(idx), short(idx))


def test_init_from_refuses_a_missing_checkpoint_or_another_shape(init_runs, tmp_path):
    """UserErrors: one line and exit status 2 from train.py (utils/errors.py, tests/test_errors.py)."""
    with pytest.raises(UserError, match=r"init_from=/no/such/run has no checkpoint at"):
        train(config(*TINY, "init_from=/no/such/run"), tmp_path / "a")
    with pytest.raises(UserError, match=r"init_from=.* another model shape.*model.n_layer=3 \(it has 2\)"):
        train(config(*TINY, *ADAMW, f"init_from={init_runs / 'rope'}", "model.n_layer=3"), tmp_path / "b")
    with pytest.raises(UserError, match=r"positional.name=alibi \(it has rope\)"):
        train(config(*TINY, *ADAMW, f"init_from={init_runs / 'rope'}", "positional=alibi"), tmp_path / "c")


def test_a_fine_tune_may_learn_qk_gains_from_gain_free_qk_norm(init_runs):
    """model.qk_norm=learned from an rms checkpoint: the gains start at ones, so the model is the init model exactly;
    the other way, and from no QK-norm, the weights do not fit and are refused."""
    init = checkpoint.load(init_runs / "rope")
    rms = GPT(GPTConfig(**init["model_config"]))
    rms.load_state_dict(init["model"])
    learned = GPT(GPTConfig(**{**init["model_config"], "qk_norm": "learned"}))
    run_ = {"model_config": asdict(learned.cfg), "tokenizer": init["tokenizer"]}
    finetune.load_weights(learned, init, run_, "rope")
    assert torch.equal(learned.blocks[0].attn.q_gain, torch.ones_like(learned.blocks[0].attn.q_gain))
    idx = torch.randint(0, 4096, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(learned(idx), rms(idx), atol=0, rtol=0)
    gained = {**init, "model": learned.state_dict(), "model_config": asdict(learned.cfg)}
    bare = {**init, "model_config": {**init["model_config"], "qk_norm": "none"}}
    for qk_norm, source in (("rms", gained), ("learned", bare)):
        model = GPT(GPTConfig(**{**init["model_config"], "qk_norm": qk_norm}))
        run_ = {"model_config": asdict(model.cfg), "tokenizer": init["tokenizer"]}
        with pytest.raises(UserError, match=f"model.qk_norm={qk_norm} \\(it has"):
            finetune.load_weights(model, source, run_, "x")


def test_scaling_is_saved_and_rebuilt_by_eval_and_sample(init_runs, tmp_path):
    out = tmp_path / "yarn"
    scaled = ["positional.scaling=yarn", "positional.scaling_factor=2", "train.seq_len=64"]
    train(config(*TINY, *ADAMW, f"init_from={init_runs / 'rope'}", *scaled, "train.max_steps=1"), out)
    ckpt = checkpoint.load(out)
    pos = ckpt["model_config"]["positional"]
    assert (pos["scaling"], pos["scaling_factor"], pos["original_length"]) == ("yarn", 2.0, 32)  # 32: init's length
    model, _ = checkpoint.load_model(out)  # what eval.py and sample.py build
    assert model.pe.scaling == Scaling("yarn", 2.0, 32)
    by_hand = GPT(GPTConfig(**{**ckpt["model_config"], "positional": {"name": "rope", "base": 10000}}))
    by_hand.load_state_dict(ckpt["model"])
    idx = torch.randint(0, 4096, (1, 64))
    with torch.no_grad():
        unscaled, yarn = by_hand(idx), by_hand(idx, variant=Variant(Scaling("yarn", 2.0, 32)))
        assert torch.equal(model(idx), yarn) and not torch.allclose(model(idx), unscaled)
    # eval.py: the trained scaling is the model's own; another one is refused, `all` scores it as it is
    assert trained_scaling(ckpt["model_config"]) == "yarn x2 from 32"
    with pytest.raises(UserError, match="eval.rope_scaling=ntk.*trained with positional.scaling=yarn"):
        resolve_variants("ntk", model.pe, trained_scaling(ckpt["model_config"]))
    assert resolve_variants("all", model.pe, trained_scaling(ckpt["model_config"])) == ["none"]
    proc = run("sample.py", f"checkpoint={out}", "max_new_tokens=4", "temperature=0", "device=cpu")
    assert proc.returncode == 0, proc.stderr
    # sample.py refuses in the same words (positional/rope_scaling.py refusal)
    proc = run("sample.py", f"checkpoint={out}", "max_new_tokens=4", "rope_scaling=rerope", "device=cpu")
    assert proc.returncode == 2, proc.stderr
    assert "rope_scaling=rerope: this model was trained with positional.scaling=yarn" in proc.stderr


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn", "yarn_released", "llama3"])
def test_every_fixed_frequency_scaling_trains_in_as_it_evaluates(kind):
    """positional.scaling takes each scaling whose frequencies do not move with the length: the model it builds
    scores as the unscaled model given that scaling as an evaluation variant."""
    cfg = config(*TINY, f"positional.scaling={kind}", "positional.scaling_factor=4", "positional.original_length=32")
    kw = schema.model_config(schema.plain(cfg), 97)
    scaled = GPT(GPTConfig(**kw))
    with torch.no_grad():  # random weights: zero-initialised projections would hide the positions
        for p in scaled.parameters():
            p.normal_(0, 0.3)
    plain = GPT(GPTConfig(**{**kw, "positional": {"name": "rope", "base": 10000}}))
    plain.load_state_dict(scaled.state_dict())
    idx = torch.randint(0, 97, (1, 128))
    with torch.no_grad():
        want = plain(idx, variant=Variant(Scaling(kind, 4.0, 32)))
        assert torch.equal(scaled(idx), want) and not torch.allclose(scaled(idx), plain(idx))


@pytest.mark.parametrize("name", SCHEMES)
def test_drope_drops_exactly_the_schemes_own_weights(name):
    """positional=nope from any scheme: every weight but the scheme's own is kept; the NoPE model is then the old
    one with its positions taken out (for RoPE: the same weights, no rotation)."""
    old = random_model(name)
    nope = random_model("nope", seed=1)
    ckpt = {"model": old.state_dict(), "model_config": asdict(old.cfg), "tokenizer": {}, "step": 5, "seq_len": 32}
    info = finetune.load_weights(nope, ckpt, {"model_config": asdict(nope.cfg), "tokenizer": {}}, "old")
    assert info.get("dropped") == (name if name != "nope" else None)
    kept, own = nope.state_dict(), finetune.scheme_keys(asdict(old.cfg))
    assert set(old.state_dict()) - own == set(kept)  # nothing else left out, nothing missing
    assert own == {k for k in old.state_dict() if k.startswith("pe.") or ".pe_layer." in k}
    for key, value in kept.items():
        torch.testing.assert_close(value, old.state_dict()[key], atol=0, rtol=0)
    if name in ("rope", "xpos", "prope"):  # no weights of their own: identical tensors, only the rotation is gone
        assert not own


def test_drope_fine_tune_records_what_it_dropped(init_runs, tmp_path):
    out = tmp_path / "drope"
    train(config(*TINY, *ADAMW, *STILL, "positional=nope", f"init_from={init_runs / 'rope'}"), out)
    ft, init = checkpoint.load(out), checkpoint.load(init_runs / "rope")
    assert ft["model_config"]["positional"]["name"] == "nope" and ft["init_from"]["dropped"] == "rope"
    for key, before in init["model"].items():
        torch.testing.assert_close(ft["model"][key], before, atol=1e-9, rtol=0)
    assert scheme_label(ft) == "nope[dropped rope]"
    train(config(*TINY, *ADAMW, "positional=nope", f"init_from={out}"), tmp_path / "drope-again")
    assert scheme_label(checkpoint.load(tmp_path / "drope-again")) == "nope[dropped rope]"  # and its fine-tunes
    with pytest.raises(UserError, match=r"another model shape.*model.n_layer=3 \(it has 2\)"):
        train(config(*TINY, *ADAMW, "positional=nope", f"init_from={init_runs / 'rope'}", "model.n_layer=3"), out / "b")
    drope_dir = schema.default_out_dir("nope", "out/rope", "shakespeare", 256, "none", 1.0)
    assert drope_dir == "out/rope-nope-shakespeare-256"


def test_a_fine_tune_has_its_own_default_out_dir():
    assert schema.default_out_dir("rope", None, "shakespeare", 256, "none", 1.0) == "out/rope"
    got = schema.default_out_dir("rope", "out/rope", "shakespeare", 1024, "yarn", 4.0)
    assert got == "out/rope-shakespeare-1024-yarn4"
    assert schema.default_out_dir("alibi", "runs/a/ckpt.pt", "passkey", 256, "none", 1.0) == "runs/a-passkey-256"
