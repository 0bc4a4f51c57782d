"""eval.py: RoPE extension against its formulas, windowing against brute force, the report files."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY, config, random_model, run
from omegaconf import OmegaConf

from evaluation.length import score, windows
from evaluation.pieces import Region, regions, scoring_pieces
from model.variant import Variant
from positional import rope_scaling
from positional.rope import RoPE, rotate_by
from positional.rope_scaling import Scaling
from train import train
from utils import runtime

D, BASE, L = 16, 10000.0, 64


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x (..., T, Dh) rotated by angles (T, Dh/2), the two halves of Dh the (real, imaginary) pairs: RoPE's formula."""
    return rotate_by(x, angles.cos(), angles.sin())


@pytest.mark.parametrize("kind", rope_scaling.KINDS)
@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_every_variant_is_plain_rope_at_factor_one(kind, factor):
    plain, scaled = RoPE(1, D, D), RoPE(1, D, D, scaling=Scaling(kind, factor, L))
    x, pos = torch.randn(1, 1, 40, D), torch.arange(40)  # dynamic_ntk: 40 positions < L, so s = 1
    assert torch.equal(plain.rotate(x, pos), scaled.rotate(x, pos))


def test_linear_interpolation_divides_positions():
    rope = RoPE(1, D, D, scaling=Scaling("linear", 4.0, L))
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
    rope = RoPE(1, D, D, scaling=Scaling("yarn", s, original))
    x = torch.randn(1, 1, 5, D)
    assert rope.rotate(x, torch.arange(5)).norm() == pytest.approx(cos_scale * x.norm().item(), rel=1e-5)


def window_end(j: int, first: int, n: int, length: int, stride: int) -> tuple[int, int]:
    """(start, end) of the sliding window that scores target j: windows end every `stride` targets from `first`
    on, unless the text before `first` is too short, when the first window runs from 0 to `length`."""
    if min(first + stride, n) < length:
        if j < min(length, n):
            return 0, min(length, n)
        end = min(length + -(-(j + 1 - length) // stride) * stride, n)
    else:
        end = min(first + -(-(j + 1 - first) // stride) * stride, n)
    return end - length, end


def brute_force(model, region: Region, length, mode, stride):
    """Per scored token, a forward over exactly the context its window gives it."""
    tokens, n, total, count = region.tokens, len(region.tokens) - 1, 0.0, 0
    for j in range(region.first, n):
        if mode == "nonoverlap":
            start = region.first + (j - region.first) // length * length
        else:
            start, _ = window_end(j, region.first, n, length, stride)
            assert j - start + 1 >= min(length - stride, j + 1)  # context between L - stride and L where there is one
        x = torch.tensor(tokens[start : j + 1])[None]
        logits = model(x)[0, -1]
        total += torch.nn.functional.cross_entropy(logits, torch.tensor(tokens[j + 1])).item()
        count += 1
    return total, count


@pytest.mark.parametrize("mode", ["nonoverlap", "sliding"])
@pytest.mark.parametrize("name", ["rope", "alibi", "sink"])
def test_windows_against_brute_force(mode, name):
    """score() gives every token the context its window gives it: at a document's opening (first = 0), after text
    that supplies the context (first = 20), and with a scored span that is no multiple of the length."""
    model = random_model(name)
    rng = np.random.default_rng(0)
    regs = [Region(rng.integers(0, 97, 50), 0), Region(rng.integers(0, 97, 37), 0), Region(rng.integers(0, 97, 61), 20)]
    rt = runtime.Runtime(torch.device("cpu"), torch.float32)
    with torch.no_grad():
        cell = score(model, regs, 16, mode, 6, 64, rt)
        want = [brute_force(model, r, 16, mode, 6) for r in regs]
    assert cell.tokens == sum(c for _, c in want) == 49 + 36 + 40
    assert cell.nll_sum == pytest.approx(sum(t for t, _ in want), rel=1e-5)
    assert cell.piece_nll == pytest.approx([t for t, _ in want], rel=1e-5)  # the bootstrap's units, per piece


def scored(regs: list[Region], length: int, mode: str, stride: int) -> set:
    """(region, target) of every token a cell scores; fails if one is scored twice."""
    out = []
    for r, reg in enumerate(regs):
        for start, n, first in windows(reg, length, mode, stride):
            out += [(r, start + i) for i in range(first, n)]
    assert len(out) == len(set(out))
    return set(out)


def test_pieces_spread_over_every_work_and_every_cell_scores_them():
    works = [(f"w{i}", np.arange(n)) for i, n in enumerate((5000, 300, 9000, 1500, 20000))]
    pieces = scoring_pieces(works, 1024, 6000)  # 6 pieces asked, 8 taken: 2 per usable work, water-filled
    by_work = {w: [p.start for p in pieces if p.work == w] for w in ("w0", "w2", "w3", "w4")}
    assert {p.work for p in pieces} == set(by_work) and len(pieces) == 8  # w1 holds no whole piece
    assert by_work == {
        "w0": [1024, 2048, 3072],  # takes the piece w3 has no room for
        "w2": [1024, 7 * 1024],  # spread from beginning to end, after a piece's length of context
        "w3": [0],  # room for one piece only: its opening
        "w4": [1024, 18 * 1024],
    }
    regs = regions(works, pieces, 1024)
    assert all(len(r.tokens) - 1 - r.first == 1024 for r in regs)
    every = {(i, r.first + j) for i, r in enumerate(regs) for j in range(1024)}
    for length in (64, 100, 256, 512, 1024):  # 100 divides nothing: a shorter last window keeps every token
        for mode, stride in [("nonoverlap", 0), ("sliding", 32), ("sliding", length // 2)]:
            assert scored(regs, length, mode, stride) == every, (length, mode, stride)


def test_many_short_works_give_one_piece_each_from_an_even_selection():
    works = [(f"w{i}", np.arange(2049)) for i in range(10)]
    pieces = scoring_pieces(works, 1024, 5 * 1024)
    assert [(p.work, p.start) for p in pieces] == [(f"w{i}", 1024) for i in (0, 2, 4, 7, 9)]
    assert len(scoring_pieces(works, 1024, 1)) == 4  # a tiny budget still spans four works


def test_pieces_of_the_real_held_out_split(shakespeare_dir):
    """The default budget on the Shakespeare split: four distinct plays (one spelling of each), each scored at
    four places from its beginning to its end."""
    from data.loader import TokenSplit
    from data.sources import work_of
    from evaluation.heldout import distinct_works, document_names

    docs = TokenSplit(shakespeare_dir, "val").documents()
    data = OmegaConf.to_container(config().data)
    names = document_names(data, len(docs))
    works = [(names[i], docs[i]) for i in distinct_works(names, "shakespeare")]
    pieces = scoring_pieces(works, 4096, 65536)
    plays = [work_of(p.work) for p in pieces]
    assert len(set(plays)) == 4 and len({p.work for p in pieces}) == 4  # one spelling of each play
    assert sorted(set(plays)) == sorted(data["val_works"]) and len(pieces) * 4096 == 65536
    for w in set(plays):
        starts = [p.start for p in pieces if work_of(p.work) == w]
        doc = len(works[next(p.doc for p in pieces if work_of(p.work) == w)][1])
        assert len(starts) == 4 and min(starts) >= 4096 and max(starts) > doc // 2


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, shakespeare_dir):
    """Three tiny trained runs (seq_len 32), as a sweep folder: rope, learned, and rope again with another seed."""
    sweep = tmp_path_factory.mktemp("sweep")
    for i, (name, seed) in enumerate([("rope", 1), ("learned", 1), ("rope", 2)]):
        cfg = config(*TINY, f"positional={name}", f"seed={seed}", "train.max_steps=20", "train.warmup_steps=5")
        train(cfg, sweep / f"{i}-{name}")
    return sweep


EVAL = ["eval.tokens=1024", "eval.batch_tokens=2048", "logger.wandb=false", "device=cpu"]


def test_eval_writes_table_json_and_plot(checkpoints):
    proc = run("eval.py", f"checkpoint={checkpoints / '0-rope'}", *EVAL, "eval.rope_scaling=all", check=True)
    result = json.loads((checkpoints / "0-rope" / "eval" / "length.json").read_text())
    assert result["train_length"] == 32 and result["lengths"] == [16, 32, 64, 128, 256, 512]
    assert result["stride"] == "L/2" and result["scheme"] == "rope"
    assert len(result["works"]) == 4 and len(result["pieces"]) == 4  # 1024 asked: one 512-token piece per play
    rows = result["results"]
    assert len(rows) == 7 * 6 * 2  # variants x lengths x modes
    assert {r["tokens"] for r in rows} == {2048}
    for r in rows:
        assert {"variant", "length", "mode", "ppl", "nll", "tokens", "ci", "piece_nll"} <= r.keys()
        assert r["ppl"] == pytest.approx(math.exp(r["nll"])) and r["ci"][0] < r["ppl"] < r["ci"][1]
        assert r.get("stride", r["length"] // 2) == r["length"] // 2
    none = {(r["length"], r["mode"]): r["ppl"] for r in rows if r["variant"] == "none"}
    for r in rows:  # no extension needed at or below the training length
        if r["length"] <= 32:
            assert r["ppl"] == none[(r["length"], r["mode"])]
    assert len(result["nll_by_position"]["none"]["512"]) > 10
    assert (checkpoints / "0-rope" / "eval" / "length.png").read_bytes()[:4] == b"\x89PNG"
    assert "rope+yarn" in proc.stdout and "every cell scored the same 2,048 held-out tokens" in proc.stdout
    assert "[lo, hi]: 95% bootstrap interval" in proc.stdout
    assert "length eval" not in proc.stderr  # no progress bar where stderr is not a terminal


def test_learned_table_row_says_na_and_the_run_goes_on(checkpoints):
    proc = run("eval.py", f"checkpoint={checkpoints / '1-learned'}", *EVAL, check=True)
    rows = json.loads((checkpoints / "1-learned" / "eval" / "length.json").read_text())["results"]
    assert all(r["ppl"] is not None for r in rows if r["length"] <= 32)
    assert all(r["ppl"] is None and "learned table covers 32 positions" in r["note"] for r in rows if r["length"] > 32)
    assert "n/a: learned table covers 32 positions" in proc.stdout


def test_sweep_dir_compares_every_run(checkpoints):
    """Every run of a training sweep in one table; the two rope runs differ only in seed: one row, two runs."""
    proc = run("eval.py", f"sweep_dir={checkpoints}", *EVAL, "eval.lengths=[16,32,64]", check=True)
    out = checkpoints / "eval"
    compared = json.loads((out / "compare.json").read_text())
    assert [(g["label"], g["seeds"]) for g in compared["groups"]] == [("rope", [1, 2]), ("learned", [1])]
    rows = [r for r in compared["results"] if r["mode"] == "nonoverlap" and r["length"] == 32]
    assert [(r["scheme"], r["runs"]) for r in rows] == [("rope", 2), ("learned", 1)]
    per_seed = [
        next(r for r in json.loads((checkpoints / d / "eval" / "length.json").read_text())["results"]
             if (r["mode"], r["length"]) == ("nonoverlap", 32))
        for d in ("0-rope", "2-rope")
    ]  # fmt: skip
    assert rows[0]["ppl"] == pytest.approx(math.exp((per_seed[0]["nll"] + per_seed[1]["nll"]) / 2))
    assert rows[0]["ppl_runs"] == pytest.approx([r["ppl"] for r in per_seed])
    assert sorted(r.get("mark") for r in rows) in (["", "*"], ["*", "~"])
    assert (out / "compare.png").exists() and "rope: 2 runs (seed 1, 2)" in proc.stdout


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
STATIC = {"linear", "ntk", "yarn", "yarn_released", "llama3"}  # a fixed rescaling: in-range logits change too


@pytest.mark.parametrize("kind", ["linear", "ntk", "dynamic_ntk", "yarn", "yarn_released", "llama3"])
@pytest.mark.parametrize("scheme", ["rope", "sink"])
def test_rope_scaling_changes_the_model_past_the_training_length(scheme, kind):
    """Through the whole model (and through the sink wrapper, which must pass the scaling on to its RoPE): at
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
        scaled = Variant(Scaling(kind, 4.0, TRAIN_LEN))
        scaled_long, scaled_short = model(idx, variant=scaled), model(short, variant=scaled)
        at_factor_one = model(short, variant=Variant(Scaling(kind, 1.0, TRAIN_LEN)))
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


def test_variants_scored_in_every_order_give_the_numbers_each_gives_alone():
    """A variant is a value passed into the forward: scoring every variant in every order, through one model, gives
    bit for bit what each gives alone on a fresh copy (a variant that lingered, or a model left changed, would not).
    The variants differ from one another, so an order that swapped two would be caught."""
    import itertools

    variants = [
        Variant(),
        Variant(log_length=TRAIN_LEN),
        Variant(Scaling("yarn", 4.0, TRAIN_LEN)),
        Variant(Scaling("dynamic_ntk", 4.0, TRAIN_LEN)),
        Variant(Scaling("leaky_rerope", 4.0, TRAIN_LEN, window=6)),
    ]
    idx = torch.randint(0, 97, (1, 4 * TRAIN_LEN), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        alone = [random_model("rope")(idx, variant=v) for v in variants]
        assert all(not torch.equal(a, b) for a, b in itertools.combinations(alone, 2))
        model = random_model("rope")
        for order in itertools.permutations(range(len(variants))):
            for i in order:
                assert torch.equal(model(idx, variant=variants[i]), alone[i]), (order, i)


def test_without_sliding_windows_the_same_nonoverlap_cells_alone(tiny_checkpoint, tmp_path):
    """eval.sliding=false scores the non-overlapping windows alone, each the number the default run gives it; a
    study whose first seed held sliding cells its other seeds skipped compares the cells every seed scored."""
    from hydra import compose, initialize_config_dir

    from evaluation import compare, length

    def scored(*overrides):
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose(
                "eval", [f"checkpoint={tiny_checkpoint}", "eval.lengths=[32,64]", "eval.tokens=256", *overrides]
            )
        return length.evaluate_lengths(tiny_checkpoint, cfg, runtime.setup("cpu", "fp32", 0))

    both, alone = scored(), scored("eval.sliding=false")
    assert {r["mode"] for r in both["results"]} == {"nonoverlap", "sliding"}
    assert [r["mode"] for r in alone["results"]] == ["nonoverlap", "nonoverlap"]
    assert [r["ppl"] for r in alone["results"]] == [r["ppl"] for r in both["results"] if r["mode"] == "nonoverlap"]
    second = json.loads(json.dumps(alone))  # the same scheme at another seed, scored without sliding windows
    second["train_config"]["seed"] += 1
    second["checkpoint"] = str(tmp_path / "seed2")
    compare.compare([both, second], tmp_path)
    rows = json.loads((tmp_path / "compare.json").read_text())["results"]
    assert [(r["length"], r["mode"], r["runs"]) for r in rows] == [(32, "nonoverlap", 2), (64, "nonoverlap", 2)]
