"""The presets of 2025 models' attention layouts (configs/experiment/): each composes to the layers it names, and a
model built from it decodes through the dense cache as its full forward computes.

python -m pytest -q tests/test_presets.py
  experiment=rnope_swa   Command A: 3 sliding-window RoPE layers, then 1 global NoPE layer
  experiment=gemma3      Gemma 3: 5 sliding-window layers at RoPE base 10,000, then 1 global layer at 1,000,000
  experiment=llama4      Llama 4: 3 chunked RoPE layers, then 1 global NoPE layer with the query temperature
  experiment=gpt_oss     gpt-oss: windowed and full RoPE layers alternating, YaRN x32 built in, a sink logit per head
  experiment=smollm3     SmolLM3: 3 RoPE layers, then 1 NoPE layer, full attention in all
  experiment=olmo3       OLMo 3: 3 sliding-window RoPE layers, then 1 full-attention RoPE layer
"""

import pytest
import torch
from conftest import TINY, assert_decoding_equals_full_forward, config
from test_hf_rope_scaling import close, mscale, released_yarn_reference

from model.attention import Chunk
from model.gpt import GPT, GPTConfig
from utils import checkpoint, checks, schema

ROPE, NOPE = ("rope", 10000.0), ("nope", None)
LAYOUTS = {  # preset -> per layer: (scheme, what it sees, RoPE base)
    "rnope_swa": [(*ROPE, "window 64")] * 3 + [(*NOPE, "all")],
    "gemma3": [(*ROPE, "window 64")] * 5 + [("rope", 1e6, "all")],
    "llama4": [(*ROPE, "chunk 64")] * 3 + [(*NOPE, "all")],
    "gpt_oss": [("rope", 150000.0, "window 8"), ("rope", 150000.0, "all")] * 2,
    "smollm3": [(*ROPE, "all")] * 3 + [(*NOPE, "all")],
    "olmo3": [(*ROPE, "window 128")] * 3 + [(*ROPE, "all")],
}
SMALL = ["model.d_model=32", "model.n_head=4", "model.n_kv_head=2"]  # the layout as composed, narrower and quick


def built(*overrides) -> GPT:
    """The model a composed train config builds, after train.py's checks before any work."""
    cfg = config(*overrides)
    checks.check(cfg)
    checks.check_model(cfg)
    return GPT(GPTConfig(**schema.model_config(schema.plain(cfg), vocab_size=97)))


def layout(model: GPT) -> list[tuple]:
    """Per layer: its scheme, what it sees (a window, a chunk or all keys) and its RoPE base (None: no rotation)."""
    rows = []
    for i, block in enumerate(model.blocks):
        pe, w = model.layer_scheme(i), block.attn.window
        sees = "all" if w is None else f"chunk {w.size}" if isinstance(w, Chunk) else f"window {w}"
        rows.append((pe.name, getattr(pe, "base", None), sees))
    return rows


@pytest.mark.parametrize("preset", LAYOUTS)
def test_each_preset_is_one_word_for_its_layout(preset):
    model = built(f"experiment={preset}")
    assert layout(model) == LAYOUTS[preset]
    assert model.cfg.window_pattern == {"gemma3": "SSSSSL", "gpt_oss": "SL", "smollm3": "S"}.get(preset, "SSSL")
    assert all(b.attn.sink is not None for b in model.blocks) == (preset == "gpt_oss")
    if preset == "llama4":  # Llama 4's temperature on the NoPE layer's queries, its floor the training length
        assert (model.pe_nope.attn_scale, model.pe_nope.floor_scale) == (0.1, 256)
    if preset in ("rnope_swa", "smollm3"):  # Command A's and SmolLM3's NoPE layers have none
        assert model.pe_nope.attn_scale == 0


def test_gpt_oss_rotates_at_yarn_x32_from_the_training_length():
    """Hugging Face's rope_type yarn at factor 32 from 256 tokens, base 150,000 (beta_fast 32, beta_slow 1), at every
    position, and cos and sin scaled by 0.1 ln 32 + 1: the frequencies and the temperature gpt-oss runs at."""
    pe = built("experiment=gpt_oss").pe
    close(pe.inv_freq, released_yarn_reference(32, 150000.0, 32.0, 256), rel=1e-6)  # fp32: a few ulps
    assert pe.cos_scale == pytest.approx(mscale(32.0), rel=1e-12)
    plain = 150000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    assert (pe.inv_freq[-6:].double() / plain[-6:]).sub(1 / 32).abs().max() < 1e-6  # the slow pairs: interpolated
    assert pe.inv_freq[0].double() == pytest.approx(plain[0].item(), rel=1e-6)  # the fastest: untouched


@pytest.mark.parametrize("preset", ["rnope_swa", "llama4"])
@pytest.mark.parametrize("size", ["tiny", "small", "d12"])
def test_the_local_layers_are_the_rope_layers_at_every_depth(preset, size):
    """positional.layers=PPPN and model.window_pattern=SSSL tile alike: at 4, 6 and 12 layers the NoPE layers (3, 7,
    11) are exactly the global ones."""
    with torch.device("meta"):
        model = built(f"experiment={preset}", f"model={size}")
    n_layer = model.cfg.n_layer
    assert [b.attn.nope for b in model.blocks] == [b.attn.window is None for b in model.blocks]
    assert [i for i in range(n_layer) if model.blocks[i].attn.nope] == list(range(3, n_layer, 4))


LOCAL = {"rnope_swa": "window", "gemma3": "window", "llama4": "chunk", "gpt_oss": "window", "olmo3": "window"}


@pytest.mark.parametrize("preset", LAYOUTS)
def test_decoding_equals_the_full_forward(preset):
    """The preset's layers at a window or chunk of 5 (seen within 24 tokens) and, for llama4, a temperature floor of
    8, for gpt_oss YaRN from 8: token by token and in chunks, the dense cache gives the full forward's logits."""
    torch.manual_seed(0)
    local = [f"model.{LOCAL[preset]}=5"] if preset in LOCAL else []
    model = built(f"experiment={preset}", *SMALL, *local, "train.seq_len=8")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5 if p.dim() > 1 else 1.0)
    idx = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    assert_decoding_equals_full_forward(model.eval(), idx, static=False)


@pytest.mark.parametrize("preset", LAYOUTS)
def test_a_preset_trains_and_its_checkpoint_keeps_the_layout(preset, tmp_path, shakespeare_dir):
    from train import train

    tiny = [o for o in TINY if not o.startswith("model.")] + SMALL
    train(config(f"experiment={preset}", *tiny, "train.max_steps=2", f"out_dir={tmp_path}"), tmp_path)
    model, _ = checkpoint.load_model(tmp_path, torch.device("cpu"))
    assert layout(model) == LAYOUTS[preset]
