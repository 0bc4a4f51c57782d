"""Compiled FlexAttention keeps a bounded number of versions, whatever the lengths (tests its CPU forward).

python -m pytest -q tests/test_flex_compile.py
torch.compile keeps at most 8 versions per code object; with a version per (batch, Tq, Tk), an eval over a few
lengths of two biased schemes passed the cap and flex then ran eagerly, building the dense scores. Flex now runs
at lengths padded to a power of two (model/flex.py flex_length).
"""

import pytest
import torch
from conftest import random_model
from torch._dynamo.utils import counters

from model import attention
from model import flex as flex_backend

LENGTHS = (130, 160, 200, 256, 300, 420)  # six eval or prefill lengths in two padded sizes, 256 and 512


def test_flex_length_pads_to_a_power_of_two_block():
    lengths = (1, 24, 128, 129, 256, 300, 4096, 4097)
    assert [flex_backend.flex_length(n) for n in lengths] == [128, 128, 128, 256, 256, 512, 4096, 8192]


def test_six_lengths_compile_one_version_per_padded_length(monkeypatch):
    monkeypatch.setattr(flex_backend, "COMPILE_ON_CPU", True)
    counters.clear()
    flex, ref = random_model("alibi", attn_backend="flex"), random_model("alibi", attn_backend="reference")
    for n in LENGTHS:
        idx = torch.randint(0, 97, (2, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            assert torch.allclose(flex(idx), ref(idx), atol=2e-4), n
    graphs = counters["stats"]["unique_graphs"]
    # flex_attention and create_block_mask, one version each per padded length (2); one per length made 12
    assert 0 < graphs <= 4, graphs


@pytest.mark.parametrize("name", ["alibi", "sink"])
def test_a_compiled_model_runs_flex_at_the_real_lengths(name, monkeypatch):
    """Inside torch.compile nothing is padded (q, k, v padded in the same graph broke inductor's CUDA lowering of
    flex): the block mask is made at the real lengths and flex bounds its own last block. Tested as the compiled
    model traces it (is_compiling true, flex eager on the CPU), against the fp32 reference: a sink over ALiBi has
    one key more than queries, 132 against 131, neither a multiple of flex's 128-row block."""
    kw = {"positional": {"name": "sink", "inner": {"name": "alibi"}}} if name == "sink" else {}
    flex, ref = random_model(name, attn_backend="flex", **kw), random_model(name, attn_backend="reference", **kw)
    idx = torch.randint(0, 97, (2, 131), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(131 + flex.pe.n_prefix)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    plan = attention.make_plan(flex.pe, pos, pos, True, 4, "flex")
    assert plan.mask.flex_pad == (0, 0) and plan.mask.block_mask.shape[-2:] == (len(pos), len(pos))
    with torch.no_grad():
        assert torch.allclose(flex(idx), ref(idx), atol=2e-4)
