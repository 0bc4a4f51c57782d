"""eval.py: RoPE extension against its formulas, windowing against brute force, the report files."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import TINY, config, random_model, run

from evaluation.length import score, scoring_regions, sliding_windows
from positional import rope_scaling
from positional.rope import RoPE, apply_rotary
from train import train
from utils import runtime

D, BASE, L = 16, 10000.0, 64


@pytest.mark.parametrize("kind", rope_scaling.KINDS)
@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_every_variant_is_plain_rope_at_factor_one(kind, factor):
    plain, scaled = RoPE(1, D, D), RoPE(1, D, D)
    scaled.set_scaling(kind, factor, L)
    x, pos = torch.randn(1, 1, 40, D), torch.arange(40)  # dynamic_ntk: 40 positions < L, so s = 1
    assert torch.equal(plain.rotate(x, pos), scaled.rotate(x, pos))


def test_linear_interpolation_divides_positions():
    rope = RoPE(1, D, D)
    rope.set_scaling("linear", 4.0, L)
    x, pos = torch.randn(1, 1, 10, D), torch.arange(10)
    want = apply_rotary(x, (pos.double() / 4)[:, None] * rope_scaling.base_inv_freq(D, BASE)[None, :])
    assert torch.allclose(rope.rotate(x, pos), want, atol=1e-5)


def test_ntk_raises_the_base():
    inv, pos_scale, cos_scale = rope_scaling.static_frequencies("ntk", D, BASE, 4.0, L)
    new_base = BASE * 4.0 ** (D / (D - 2))
    assert torch.allclose(inv, new_base ** (-torch.arange(0, D, 2).double() / D))
    assert (pos_scale, cos_scale) == (1.0, 1.0)


def test_dynamic_ntk_follows_the_current_length():
    got = rope_scaling.dynamic_inv_freq(D, BASE, L, torch.tensor(4 * L))
    assert torch.allclose(got, rope_scaling.static_frequencies("ntk", D, BASE, 4.0, L)[0].float())


def test_yarn_ramp_and_temperature():
    s, theta, original = 8.0, rope_scaling.base_inv_freq(D, BASE), 2048
    inv, _, cos_scale = rope_scaling.static_frequencies("yarn", D, BASE, s, original)
    for i in range(D // 2):
        r = original * theta[i].item() / (2 * math.pi)  # rotations over the original length
        g = min(1.0, max(0.0, (r - 1) / (32 - 1)))
        assert inv[i].item() == pytest.approx(theta[i].item() * ((1 - g) / s + g), rel=1e-9)
    assert inv[0] == theta[0] and inv[-1] == pytest.approx(theta[-1].item() / s)  # keep high, interpolate low
    assert cos_scale == pytest.approx(0.1 * math.log(s) + 1)
    rope = RoPE(1, D, D)
    rope.set_scaling("yarn", s, original)
    x = torch.randn(1, 1, 5, D)
    assert rope.rotate(x, torch.arange(5)).norm() == pytest.approx(cos_scale * x.norm().item(), rel=1e-5)


def brute_force(model, region, length, mode, stride):
    """Per scored token, a forward over exactly the context its window gives it."""
    n, total, count = len(region) - 1, 0.0, 0
    for j in range(n):
        if mode == "nonoverlap":
            start = j // length * length
            if start + length > n:
                continue
        else:  # the first window scores its whole length, then windows end every `stride` tokens
            end = length if j < length else min(length + -(-(j + 1 - length) // stride) * stride, n)
            start = max(0, end - length)
        x = torch.tensor(region[start : j + 1])[None]
        logits = model(x)[0, -1]
        total += torch.nn.functional.cross_entropy(logits, torch.tensor(region[j + 1])).item()
        count += 1
    return total, count


@pytest.mark.parametrize("mode", ["nonoverlap", "sliding"])
@pytest.mark.parametrize("name", ["rope", "alibi", "sink"])
def test_windows_against_brute_force(mode, name):
    model = random_model(name)
    rng = np.random.default_rng(0)
    regions = [rng.integers(0, 97, 50), rng.integers(0, 97, 37)]
    rt = runtime.Runtime(torch.device("cpu"), torch.float32)
    with torch.no_grad():
        cell = score(model, regions, 16, mode, 6, 64, rt)
        want = [brute_force(model, r, 16, mode, 6) for r in regions]
    assert cell.tokens == sum(c for _, c in want)
    assert cell.nll_sum == pytest.approx(sum(t for t, _ in want), rel=1e-5)


def test_every_length_scores_the_same_tokens():
    docs = [np.arange(n) for n in (5000, 300, 9000, 4097)]
    regions = scoring_regions(docs, 1024, 6000)
    assert [len(r) - 1 for r in regions] == [4096, 2048]  # whole multiples of the longest length
    for length in (64, 128, 256, 512, 1024):
        for stride in (32, 64):
            scored = [sum(n - first for _, n, first in sliding_windows(r, length, stride)) for r in regions]
            assert scored == [4096, 2048]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, shakespeare_dir):
    """Two tiny trained runs (seq_len 32), as a sweep folder: rope and learned."""
    sweep = tmp_path_factory.mktemp("sweep")
    for i, name in enumerate(["rope", "learned"]):
        train(config(*TINY, f"positional={name}", "train.max_steps=20", "train.warmup_steps=5"), sweep / f"{i}-{name}")
    return sweep


EVAL = ["eval.tokens=1024", "eval.batch_tokens=2048", "logger.wandb=false", "device=cpu"]


def test_eval_writes_table_json_and_plot(checkpoints):
    proc = run("eval.py", f"checkpoint={checkpoints / '0-rope'}", *EVAL, "eval.rope_scaling=all", check=True)
    result = json.loads((checkpoints / "0-rope" / "eval" / "length.json").read_text())
    assert result["train_length"] == 32 and result["lengths"] == [16, 32, 64, 128, 256, 512]
    assert result["stride"] == 16 and result["scheme"] == "rope"
    rows = result["results"]
    assert len(rows) == 5 * 6 * 2  # variants x lengths x modes
    assert {r["tokens"] for r in rows} == {1024}
    for r in rows:
        assert {"variant", "length", "mode", "ppl", "nll", "tokens"} <= r.keys()
        assert r["ppl"] == pytest.approx(math.exp(r["nll"]))
    none = {(r["length"], r["mode"]): r["ppl"] for r in rows if r["variant"] == "none"}
    for r in rows:  # no extension needed at or below the training length
        if r["length"] <= 32:
            assert r["ppl"] == none[(r["length"], r["mode"])]
    assert len(result["nll_by_position"]["none"]["512"]) > 10
    assert (checkpoints / "0-rope" / "eval" / "length.png").read_bytes()[:4] == b"\x89PNG"
    assert "rope+yarn" in proc.stdout and "every cell scored the same 1,024 held-out tokens" in proc.stdout
    assert "length eval" not in proc.stderr  # no progress bar where stderr is not a terminal


def test_learned_table_row_says_na_and_the_run_goes_on(checkpoints):
    proc = run("eval.py", f"checkpoint={checkpoints / '1-learned'}", *EVAL, check=True)
    rows = json.loads((checkpoints / "1-learned" / "eval" / "length.json").read_text())["results"]
    assert all(r["ppl"] is not None for r in rows if r["length"] <= 32)
    assert all(r["ppl"] is None and "learned table covers 32 positions" in r["note"] for r in rows if r["length"] > 32)
    assert "n/a: learned table covers 32 positions" in proc.stdout


def test_sweep_dir_compares_every_run(checkpoints):
    proc = run("eval.py", f"sweep_dir={checkpoints}", *EVAL, "eval.lengths=[16,32,64]", check=True)
    out = checkpoints / "eval"
    rows = json.loads((out / "compare.json").read_text())["results"]
    assert {r["scheme"] for r in rows} == {"rope", "learned"}
    assert (out / "compare.png").exists() and "learned" in proc.stdout.splitlines()[-3]


def test_multirun_comparison_callback(checkpoints, tmp_path):
    ckpts = f"{checkpoints / '0-rope'},{checkpoints / '1-learned'}"
    run(
        "eval.py", "-m", f"checkpoint={ckpts}", *EVAL, "eval.lengths=[32,64]", f"hydra.sweep.dir={tmp_path}", check=True
    )
    rows = json.loads((tmp_path / "compare.json").read_text())["results"]
    assert {(r["scheme"], r["length"]) for r in rows} == {(s, n) for s in ("rope", "learned") for n in (32, 64)}


def one_line_error(proc, needle):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (
        proc.stderr
    )


def test_bad_input(checkpoints, tmp_path):
    one_line_error(run("eval.py", f"checkpoint={tmp_path}", *EVAL), "no checkpoint at")
    (tmp_path / "ckpt.pt").write_bytes(b"garbage")
    one_line_error(run("eval.py", f"checkpoint={tmp_path}", *EVAL), "corrupt or truncated")
    rope = checkpoints / "0-rope"
    one_line_error(
        run("eval.py", f"checkpoint={rope}", *EVAL, "eval.lengths=[100000000]"), "longer than every held-out"
    )
    one_line_error(run("eval.py", f"checkpoint={rope}", *EVAL, "eval.stride=64", "eval.lengths=[32]"), "eval.stride=64")
    one_line_error(run("eval.py", f"checkpoint={rope}", *EVAL, "eval.rope_scaling=yarm"), "eval.rope_scaling=yarm")


def test_unprepared_data_is_named(checkpoints, tmp_path):
    ckpt = torch.load(checkpoints / "0-rope" / "ckpt.pt", weights_only=True)
    ckpt["data_dir"] = str(tmp_path / "gone")
    ckpt["config"]["data"]["cache_dir"] = str(tmp_path / "gone")
    torch.save(ckpt, tmp_path / "ckpt.pt")
    one_line_error(run("eval.py", f"checkpoint={tmp_path}", *EVAL), "eval.prepare=true")


TRAIN_LEN = 16
STATIC = {"linear", "ntk", "yarn"}  # a fixed rescaling of every frequency: in-range logits change too


@pytest.mark.parametrize("kind", ["linear", "ntk", "dynamic_ntk", "yarn"])
@pytest.mark.parametrize("scheme", ["rope", "sink"])
def test_rope_scaling_changes_the_model_past_the_training_length(scheme, kind):
    """Through the whole model (and through the sink wrapper, which must pass set_scaling on to its RoPE): at
    factor 4 every variant changes the logits past the training length. Within it, dynamic NTK leaves them
    exactly as they were (its factor is the current length over the training length, at least 1), while the
    static variants change them too: PI divides every position, NTK raises the base, YaRN interpolates the low
    frequencies and scales the logits. At eval.py's own factor, length / training length <= 1, every variant is
    plain RoPE."""
    model = random_model(scheme)
    idx = torch.randint(0, 97, (1, 4 * TRAIN_LEN), generator=torch.Generator().manual_seed(0))
    short = idx[:, :TRAIN_LEN]
    with torch.no_grad():
        plain_long, plain_short = model(idx), model(short)
        model.pe.set_scaling(kind, 4.0, TRAIN_LEN)
        scaled_long, scaled_short = model(idx), model(short)
        model.pe.set_scaling(kind, 1.0, TRAIN_LEN)
        at_factor_one = model(short)
    assert (scaled_long - plain_long)[:, TRAIN_LEN:].abs().max() > 1e-2
    if kind in STATIC:
        assert (scaled_short - plain_short).abs().max() > 1e-2
    else:
        assert torch.equal(scaled_short, plain_short)
    assert torch.equal(at_factor_one, plain_short)


def test_progress_bar_is_drawn_on_a_terminal_only():
    import io

    from utils.progress import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal, log = Terminal(), io.StringIO()
    assert list(progress(range(3), "length eval", file=terminal)) == list(progress(range(3), "x", file=log))
    assert "length eval:" in terminal.getvalue() and "/3 [" in terminal.getvalue() and log.getvalue() == ""
