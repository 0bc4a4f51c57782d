"""The benchmarks read configs/ (one source of truth), count FLOPs the same way, and ablate positions soundly."""

import pytest
import torch
from conftest import ROOT  # noqa: F401  (puts the repo on sys.path)

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


def test_position_ablation_leaves_nope_alone_and_moves_rope():
    """bench/position_ablation.py's premise: positions all at 0 leave a model only the token order (the causal mask
    does not read the ids), so NoPE scores bit for bit the same, while RoPE, which reads them, does not."""
    from bench.position_ablation import val_loss

    class Rows:
        def batch(self, first, n, device):
            g = torch.Generator().manual_seed(first)
            x = torch.randint(0, 97, (n, 33), generator=g)
            return x[:, :-1], x[:, 1:]

    for scheme, moved in (("nope", False), ("rope", True)):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**model_config(scheme, "tiny", 32, vocab=97))).eval()
        with torch.no_grad():  # the output projections start at zero: give attention a say
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        true = val_loss(model, Rows(), 2, lambda T: torch.arange(T))
        zero = val_loss(model, Rows(), 2, lambda T: torch.zeros(T, dtype=torch.long))
        assert (zero != true) == moved, (scheme, true, zero)
