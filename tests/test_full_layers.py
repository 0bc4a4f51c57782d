"""A RoPE extension on the full-attention layers alone (Variant.full_layers: eval.full_layers, sample.py full_layers),
as OLMo 3 applies YaRN and Gemma 3 its linear x8: the sliding-window and chunked layers keep their trained rotation.

python -m pytest -q tests/test_full_layers.py
The reference runs the model's blocks one by one, each windowed layer under the plan of the model as trained and
each full layer under the plan of the scaling on every layer: the two paths the variant must stitch together.
"""

import math
from dataclasses import replace

import pytest
import torch
from conftest import TINY, assert_decoding_equals_full_forward, assert_sink_cache_reindexes, config, random_model
from hydra import compose, initialize_config_dir

from evaluation import length
from model.variant import Variant
from positional.rope_scaling import Scaling
from utils import runtime

TRAIN, T = 16, 40  # training length, tokens: x2.5, and 40 > 8 + a window: every window slides
YARN = Variant(Scaling("yarn", 4.0, TRAIN))
FULL = replace(YARN, full_layers=True)
LAYOUTS = {  # SL: layer 0 windowed, layer 1 full
    "window": dict(window=8, window_pattern="SL"),
    "chunk": dict(chunk=8, window_pattern="SL"),
    "global_base": dict(window=8, window_pattern="SL", positional={"name": "rope", "global_base": 1e6}),
}


def tokens(n=T, batch=2):
    return torch.randint(0, 97, (batch, n), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def stitched_logits(model, idx):
    """Block by block: a windowed layer under the as-trained plan, a full layer under YARN's."""
    pos = torch.arange(idx.size(1))
    trained, scaled = model.plan(pos, pos, True), model.plan(pos, pos, True, variant=YARN)
    x = model.wte(idx)
    for block in model.blocks:
        x = block(x, trained if block.attn.window is not None else scaled)
    return model._head(x)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_windowed_layers_keep_their_rotation_and_full_layers_take_the_scaling(layout):
    model, idx = random_model("rope", **LAYOUTS[layout]), tokens()
    with torch.no_grad():
        got, trained, everywhere = model(idx, variant=FULL), model(idx), model(idx, variant=YARN)
    assert torch.allclose(got, stitched_logits(model, idx), atol=1e-4)
    for other in (trained, everywhere):  # it reaches the full layer, and not the windowed one
        assert (got - other).abs().max() > 1e-2


def test_a_model_of_windows_alone_is_left_as_trained():
    model, idx = random_model("rope", window=8, window_pattern="S"), tokens()
    with torch.no_grad():
        assert torch.equal(model(idx, variant=FULL), model(idx))


@pytest.mark.parametrize("layout", ["window", "chunk", "global_base"])
def test_kv_cache_decoding_equals_the_full_forward(layout):
    model = random_model("rope", **LAYOUTS[layout])
    assert_decoding_equals_full_forward(model, tokens(24), static=False, variant=FULL)  # windows: no static step


@pytest.mark.parametrize("pattern", ["S", "L"])
def test_sink_cache_rotates_at_in_cache_positions(pattern):
    model = random_model("rope", n_layer=1, window=8, window_pattern=pattern)  # windowed or full
    assert_sink_cache_reindexes(model, tokens(50, batch=1), FULL)


def test_a_split_has_no_full_layers_form():
    with pytest.raises(ValueError, match="rerope splits every layer's keys"):
        Variant(Scaling("rerope", 4.0, TRAIN), full_layers=True)


@pytest.fixture(scope="module")
def windowed_checkpoint(tmp_path_factory, shakespeare_dir):
    """A tiny RoPE model with windows of 8 in layer 0 and a full layer 1, trained 2 steps at 32 tokens."""
    from train import train

    out = tmp_path_factory.mktemp("windowed")
    overrides = [*TINY, "model.window=8", "model.window_pattern=SL", "train.max_steps=2", "train.warmup_steps=1"]
    train(config(*overrides), out)
    return out


def scored(checkpoint, *overrides) -> dict:
    import eval as entry

    rt = runtime.setup("cpu", "fp32", 0)
    with initialize_config_dir(config_dir=str(entry.Path(entry.__file__).parent / "configs"), version_base="1.3"):
        args = ["eval.tokens=256", "eval.lengths=[32,128]", "eval.sliding=false", "device=cpu", "logger.wandb=false"]
        cfg = compose("eval", [*args, *overrides])
    return {(r["variant"], r["length"]): r["ppl"] for r in length.evaluate_lengths(checkpoint, cfg, rt)["results"]}


def test_eval_adds_a_full_layers_row_beside_each_frequency_scaling(windowed_checkpoint, tiny_checkpoint, capsys):
    """yarn_full beside yarn, on the same tokens: equal at the training length, where YaRN changes nothing, apart at
    4x; a split (rerope) gets no such row, and a model with no windowed layer none at all, with a note."""
    rows = scored(windowed_checkpoint, "eval.rope_scaling=yarn", "eval.rerope=true", "eval.full_layers=true")
    assert {v for v, _ in rows} == {"yarn", "rerope", "leaky_rerope", "yarn_full"}
    assert rows["yarn_full", 32] == pytest.approx(rows["yarn", 32], rel=1e-6)
    assert math.isfinite(rows["yarn_full", 128]) and rows["yarn_full", 128] != pytest.approx(rows["yarn", 128])
    plain = scored(tiny_checkpoint, "eval.rope_scaling=yarn", "eval.full_layers=true")
    assert {v for v, _ in plain} == {"yarn"}
    assert "eval.full_layers=true adds no rows: no sliding-window or chunked layer" in capsys.readouterr().out


def test_sample_decodes_under_the_full_layers_variant():
    import sample

    model = random_model("rope", window=8, window_pattern="SL")
    cfg = compose_sample(["rope_scaling=yarn", "full_layers=true"])
    variant = sample.rope_variant(model, {"seq_len": TRAIN, "model_config": {"positional": {}}}, cfg, 64)
    assert variant == Variant(Scaling("yarn", 4.0, TRAIN), full_layers=True)


def compose_sample(overrides):
    import sample

    with initialize_config_dir(config_dir=str(sample.Path(sample.__file__).parent / "configs"), version_base="1.3"):
        return compose("sample", ["checkpoint=x", *overrides])


def test_the_plan_rotates_windows_as_trained_and_full_layers_scaled():
    model, pos = random_model("rope", window=8, window_pattern="SL"), torch.arange(T)
    plan = model.plan(pos, pos, True, variant=FULL)
    for got, want in ((plan.windows[8], model.pe.rotation(pos)), (plan, model.pe.rotation(pos, YARN.scaling))):
        assert all(torch.equal(a, b) for rot in (got.q_rot, got.k_rot) for a, b in zip(rot, want, strict=True))
