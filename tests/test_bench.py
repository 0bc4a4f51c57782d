"""The benchmarks read configs/ (one source of truth) and count FLOPs the same way as the model."""

import re
import time
from contextlib import nullcontext

import pytest
import torch
from conftest import random_model

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


def test_a_recorded_run_replaces_its_latest_table_and_adds_a_history_row():
    """bench/RESULTS.md keeps one current table per benchmark: recording twice leaves one block (the newest table),
    the prose around it, no new heading, and a history row per run; a benchmark with no block yet gets one."""
    from bench.table import HISTORY_END, recorded

    text = "### cpu\n<!-- latest: cpu_bench -->\nold table\n<!-- /latest -->\nprose\n\n| date |\n|---|\n" + HISTORY_END
    once = recorded(text, "cpu_bench", "note 1", "| a |\n|---|\n| 1 |", "rope 1.01")
    twice = recorded(once, "cpu_bench", "note 2", "| a |\n|---|\n| 2 |", "rope 1.02")
    assert "old table" not in twice and "note 1" not in twice and "| 2 |" in twice and "prose" in twice
    assert twice.count("<!-- latest: cpu_bench -->") == 1 and twice.count("###") == 1
    assert twice.index("rope 1.01") < twice.index("rope 1.02") < twice.index(HISTORY_END)
    other = recorded(twice, "decode_bench", "note 3", "| b |", "sink 400")
    assert other.count("### decode_bench") == 1 and "<!-- latest: decode_bench -->\nnote 3" in other


def test_a_history_row_gives_each_row_its_figure(tmp_path):
    """The history row names each table row by its first column and gives the column asked for (train_bench: tok/s,
    not its last column, the backend); a row without it (an error) gives its last column."""
    from bench.table import HISTORY_END, fmt, publish

    path = tmp_path / "RESULTS.md"
    path.write_text("| date |\n|---|\n" + HISTORY_END)
    rows = [{"scheme": "rope", "tok/s": 484712.0, "backend": "sdpa"}, {"scheme": "t5", "error": "OutOfMemoryError"}]
    publish(rows, fmt, "details", torch.device("cpu"), True, path, figure="tok/s")
    assert "| rope 484,712; t5 OutOfMemoryError | recorded run |" in path.read_text()


def test_the_compiled_decoding_step_compiles_before_its_clock_starts(monkeypatch):
    """decode_bench times the compiled step only after it compiled: its first token goes through eager decode (an
    empty cache), so a clock started after that one token timed the compile in the first block."""
    from types import SimpleNamespace

    from torch._dynamo.utils import counters

    from bench import decode_bench
    from model.kv_cache import SinkCache

    model = random_model("rope")
    graphs_at_each_reading = []

    def perf_counter():
        graphs_at_each_reading.append(counters["stats"]["unique_graphs"])
        return time.perf_counter()

    monkeypatch.setattr(decode_bench, "time", SimpleNamespace(perf_counter=perf_counter))
    torch._dynamo.reset()
    counters.clear()
    cache = SinkCache(model, 1, 4, 28)
    blocks = list(decode_bench.run_cached(model, cache, 40, 10, torch.device("cpu"), nullcontext(), static=True))
    assert len(blocks) == 4
    assert graphs_at_each_reading[0] == counters["stats"]["unique_graphs"] > 0  # no compile once the clock ran
    torch._dynamo.reset()


def test_a_profiled_row_prints_where_its_training_steps_spend_their_time(capsys):
    """train_bench --profile: after a row's clock, the ops of its own training steps (forward, backward, optimizer)."""
    from types import SimpleNamespace

    from bench import train_bench

    args = SimpleNamespace(
        model="tiny", seq=64, vocab=512, batch_tokens=128, steps=1, warmup=0, eval_len=0, compile=False, profile=1
    )
    row = train_bench.bench_one("t5", args, torch.device("cpu"), torch.float32, peak=1e12)
    out = capsys.readouterr().out
    assert row["scheme"] == "t5" and "profile of 1 steps: t5, T=64" in out
    assert "aten::mm" in out and "Optimizer.step#AdamW.step" in out  # the matrix products and the optimizer step


def test_the_compiled_decoding_step_is_profiled_after_its_warm_tokens(capsys):
    """decode_bench --static-only --profile n: n tokens of the compiled step, after its warm-up tokens (which yield
    no reading) and n more: the profile sees the compiled region, never eager decoding or the compile."""
    from bench import decode_bench
    from model.kv_cache import SinkCache

    model = random_model("rope")
    torch._dynamo.reset()
    decode_bench.profile(model, SinkCache(model, 1, 4, 28), 2, torch.device("cpu"), nullcontext(), static=True)
    out = capsys.readouterr().out
    torch._dynamo.reset()
    region = re.search(r"Torch-Compiled Region: 0/0\s+((\S+\s+){5})(\d+)", out)  # its columns, then # of Calls
    assert region and region.group(3) == "2"  # the 2 profiled tokens, each one call of the compiled step
