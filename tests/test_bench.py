"""The benchmarks read configs/ (one source of truth) and count FLOPs the same way as the model."""

import pytest
import torch

from bench import cpu_bench
from bench.configs import SCHEMES, SIZES, model_config, run_config
from bench.plain_gpt import PlainGPT
from model.gpt import GPT, GPTConfig


@pytest.mark.parametrize("size", SIZES)
def test_sizes_come_from_configs(size):
    run = run_config("rope", [f"model={size}"])
    cfg = model_config("rope", size, 256)
    assert {k: cfg[k] for k in ("n_layer", "n_head", "n_kv_head", "d_model")} == {
        k: run["model"][k] for k in ("n_layer", "n_head", "n_kv_head", "d_model")
    }
    assert set(SCHEMES) >= {"rope", "alibi", "learned", "sink", "t5", "nope", "sinusoidal"}


def test_plain_block_has_the_same_matmul_flops():
    cfg = model_config("rope", "tiny", 64, vocab=97)
    ours = GPT(GPTConfig(**cfg))
    plain = PlainGPT(**cfg, seq_len=64)
    matmul = sum(p.numel() for n, p in plain.named_parameters() if p.dim() == 2 and not n.startswith("wpe"))
    assert matmul == ours.num_params(matmul_only=True)  # the tied table counts once, as the untied head
    assert cpu_bench.flops_per_token(cfg, 64, 97) == ours.flops_per_token(64)
    loss = plain(*torch.randint(0, 97, (2, 2, 64)))
    assert torch.isfinite(loss)
