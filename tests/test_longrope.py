"""LongRoPE: plain RoPE at factors of 1, the search's monotone candidates and working selection, the factors file
round trip through eval.py, and one-line errors.

python -m pytest -q tests/test_longrope.py
"""

import json
import shutil
from functools import partial

import numpy as np
import pytest
import torch
from conftest import ROOT, random_model
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from evaluation import length, longrope, variants
from evaluation import longrope_search as ls
from evaluation.pieces import Piece
from model.variant import Variant
from positional import rope_scaling
from positional.rope_scaling import Scaling
from utils import runtime
from utils.errors import UserError, cli, compose_message

TRAIN_LEN = 16


def compose_cfg(name: str, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(name, overrides=list(overrides))


def pairs(model) -> int:
    return len(rope_scaling.scheme_factors(model.pe, "linear", 4.0, TRAIN_LEN))


@pytest.mark.parametrize("scheme", ["rope", "sink"])
@pytest.mark.parametrize("start_tokens", [0, 5])
def test_factors_of_one_reproduce_plain_rope(scheme, start_tokens):
    """lambda_i = 1 (with the cos/sin scale at 1) is plain RoPE exactly, at 4x and with kept start tokens; the
    default scale is sqrt(1 + ln s / ln L) on cos and sin; factors of 2 do change the logits past the first tokens."""
    model = random_model(scheme)
    idx = torch.randint(0, 97, (2, 4 * TRAIN_LEN), generator=torch.Generator().manual_seed(0))
    ones = [1.0] * pairs(model)
    longrope = partial(Scaling, "longrope", 4.0, TRAIN_LEN, start_tokens=start_tokens)
    with torch.no_grad():
        plain = model(idx)
        same = model(idx, variant=Variant(longrope(rescale=ones, attn_scale=1.0)))
        scaled = model(idx, variant=Variant(longrope(rescale=[2.0] * len(ones))))
    assert torch.equal(same, plain)
    assert (scaled - plain)[:, start_tokens + 1 :].abs().max() > 1e-2

    pe = model.pe.inner if scheme == "sink" else model.pe
    pos = torch.arange(3 * TRAIN_LEN)
    cos0, _ = pe.rotation(pos)
    cos1, _ = pe.rotation(pos, longrope(rescale=ones))
    scale = (1 + np.log(4.0) / np.log(TRAIN_LEN)) ** 0.5
    assert torch.equal(cos1[:start_tokens], cos0[:start_tokens])  # the kept positions: unscaled, as released
    assert torch.allclose(cos1[start_tokens:], cos0[start_tokens:] * scale)


def test_at_or_below_the_training_length_it_is_plain_rope_and_needs_no_factors():
    model = random_model("rope")
    idx = torch.randint(0, 97, (1, TRAIN_LEN), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(idx)
        for factor in (1.0, 0.5):
            assert torch.equal(model(idx, variant=Variant(Scaling("longrope", factor, TRAIN_LEN))), plain)
    with pytest.raises(ValueError, match="needs its searched factors"):
        model(idx, variant=Variant(Scaling("longrope", 2.0, TRAIN_LEN)))


def test_seeds_are_the_closed_form_kinds_as_factors():
    """PI, NTK and YaRN written as factors give back their own frequencies: the search starts where they are."""
    for kind in ls.SEEDS:
        lam = rope_scaling.equivalent_factors(kind, 16, 10000.0, 4.0, 64)
        inv, pos_scale, _ = rope_scaling.static_frequencies(kind, 16, 10000.0, 4.0, 64)
        assert torch.allclose(rope_scaling.base_inv_freq(16, 10000.0) / lam, inv * pos_scale)
        assert (lam[1:] >= lam[:-1]).all() and lam.min() >= 1 - 1e-12 and lam.max() <= 4 + 1e-9


def test_mutation_and_crossover_keep_factors_monotone():
    """Over many seeded draws from random monotone parents, every child is non-decreasing, on the grid and within
    range, with start_tokens from the list; most children differ from their parents (the property is not idle)."""
    space = ls.Space(0.01, 300, (0, 1, 2, 4, 8))
    changed = crossed = 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        a, b = (
            ls.Candidate(tuple(sorted(rng.integers(0, 301, 8).tolist())), int(rng.choice(space.starts))) for _ in "ab"
        )
        children = [ls.mutate(a, space, rng, 0.3)]
        child = ls.crossover(a, b, rng, 20)
        crossed += child is not None
        children += [child] if child is not None else []
        for c in children:
            assert ls.monotone(c) and min(c.levels) >= 0 and max(c.levels) <= space.top and c.start in space.starts
            changed += c not in (a, b)
    assert changed >= 500 and crossed >= 100


def synthetic_fitness(target):
    """A tiny stand-in for held-out NLL: squared distance of the factors to a monotone target, and start_tokens'."""
    space = ls.Space(0.05, 100, (0, 1, 2, 4, 8, 16))

    def fitness(c):
        return float(np.sum((np.array(space.factors(c)) - target) ** 2) + 0.01 * abs(c.start - 4))

    return space, fitness


class Settings:
    population, parents, mutations, crossovers, generations = 12, 6, 6, 6, 8
    mutation_rate, crossover_tries = 0.3, 20


def run_synthetic():
    target = np.array([1.0, 1.0, 1.3, 1.9, 2.6, 3.4, 4.4, 5.0])
    space, fitness = synthetic_fitness(target)
    seeds = [space.snap(np.full(8, 4.0)), space.snap(4.0 ** (np.arange(8) / 7)), space.snap(np.linspace(1, 4, 8))]
    return ls.evolve(seeds, fitness, space, Settings, np.random.default_rng(0))


def test_search_improves_on_its_initial_population():
    result = run_synthetic()
    assert all(b <= a for a, b in zip(result["history"], result["history"][1:], strict=False))
    assert result["fitness"] < 0.5 * result["initial"]  # well past the seeds, not merely no worse


def test_the_improvement_needs_selection(monkeypatch):
    """The control: keeping the least fit instead of the fittest loses the seeds' best and finds nothing better, so
    the test above fails where selection is broken."""
    monkeypatch.setattr(ls, "select", lambda pop, fit, k: sorted(dict.fromkeys(pop), key=fit, reverse=True)[:k])
    result = run_synthetic()
    assert result["fitness"] > result["initial"]


def tiny_search_cfg(ckpt, *extra):
    return compose_cfg(
        "longrope",
        f"checkpoint={ckpt}",
        f"target_length={2 * 32}",
        "search.population=4",
        "search.parents=2",
        "search.mutations=2",
        "search.crossovers=2",
        "search.generations=1",
        "search.windows=2",
        "eval.tokens=256",
        "eval.lengths=[32,64]",  # the table length_rows() reads: the search keeps clear of it
        "device=cpu",
        *extra,
    )


EVAL = ["eval.tokens=256", "eval.lengths=[32,64]", "logger.wandb=false", "device=cpu"]


def length_rows(ckpt, kind: str = "longrope") -> dict:
    cfg = compose_cfg("eval", f"checkpoint={ckpt}", *EVAL, f"eval.rope_scaling={kind}")
    rows = length.evaluate_lengths(ckpt, cfg, runtime.setup("cpu", "auto", 0))["results"]
    return {(r["variant"], r["length"], r["mode"]): r["ppl"] for r in rows}


def test_search_windows_stay_outside_what_the_table_reads():
    works = [("a", np.arange(5000)), ("b", np.arange(3000)), ("c", np.arange(100))]
    spans = {"a": [(0, 1200), (1100, 2500), (4000, 4100)], "b": [(500, 900)]}
    windows = longrope.search_windows(works, 256, 6, spans)
    assert longrope.overlap(windows, spans) == 0 and len(windows) == 6
    assert [w["work"] for w in windows] == ["a"] * 3 + ["b"] * 3  # equal shares; c has no room for one
    assert all(w["start"] + 257 <= len(dict(works)[w["work"]]) for w in windows)
    assert longrope.overlap(windows, {"a": [(0, 5000)]}) == 3 * 257
    with pytest.raises(UserError, match="search.windows=99"):
        longrope.search_windows(works, 256, 99, spans)


def copy_run(tiny_checkpoint, tmp_path):
    """A run folder of its own: the shared tiny checkpoint is read by other tests."""
    ckpt = tmp_path / "run"
    shutil.copytree(tiny_checkpoint, ckpt, ignore=shutil.ignore_patterns("eval", "longrope_*"))
    return ckpt


def test_saved_file_round_trips_and_eval_loads_it(tiny_checkpoint, tmp_path, capsys):
    """The search writes longrope_x2.json beside the checkpoint, on windows the length table does not read; eval.py
    reads it back: its factors change the 2x row, and neutral factors written into the file give plain RoPE's. A
    table that reads the search's windows says so."""
    ckpt = copy_run(tiny_checkpoint, tmp_path)
    path = ls.run(tiny_search_cfg(ckpt))
    assert path == ckpt / "longrope_x2.json"
    record = json.loads(path.read_text())
    assert record == longrope.load(ckpt, 2.0, 32)
    assert record["fitness"]["nll"] <= record["initial_best"]["nll"] and len(record["windows"]) == 2
    assert len(record["factors"]) == 4 and record["factors"] == sorted(record["factors"])  # head dim 8: 4 pairs
    assert record["attn_scale"] == pytest.approx((1 + np.log(2) / np.log(32)) ** 0.5)
    capsys.readouterr()
    rows = length_rows(ckpt) | length_rows(ckpt, "none")
    assert "note:" not in capsys.readouterr().out
    for mode in ("nonoverlap", "sliding"):
        assert rows["longrope", 32, mode] == rows["none", 32, mode]
        assert rows["longrope", 64, mode] != rows["none", 64, mode]
    record.update(factors=[1.0] * 4, start_tokens=0, attn_scale=1.0)
    path.write_text(json.dumps(record))
    rows = rows | length_rows(ckpt)  # the new longrope rows replace the old
    assert all(rows["longrope", 64, m] == rows["none", 64, m] for m in ("nonoverlap", "sliding"))
    w = record["windows"][0]  # a table whose piece starts inside a search window (the note eval.py makes for it):
    variants.note_search_overlap({("longrope", 64): record}, [Piece(w["work"], 0, w["start"] + 64, 64)], 64)
    assert "65 tokens of its search windows are read here too"  # all 64 + 1 in capsys.readouterr().out


def one_line_exit_2(capsys, fn, *needles):
    with pytest.raises(SystemExit) as e:
        cli(fn)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    for needle in needles:
        assert needle in err[0], err[0]


def test_eval_bad_factors_file_is_one_line(tiny_checkpoint, tmp_path, capsys):
    """Missing (naming the key and the command that makes it), not JSON, the wrong count, another length."""
    ckpt = copy_run(tiny_checkpoint, tmp_path)
    command = f"python -m evaluation.longrope_search checkpoint={ckpt} target_length=64"
    one_line_exit_2(capsys, lambda: length_rows(ckpt), "eval.rope_scaling=longrope", command)
    (ckpt / "longrope_x2.json").write_text("{not json")
    one_line_exit_2(capsys, lambda: length_rows(ckpt), "not a LongRoPE factors file", command)
    record = {"factors": [1.0, 2.0], "start_tokens": 0, "attn_scale": 1.1, "original_length": 32, "factor": 2.0}
    (ckpt / "longrope_x2.json").write_text(json.dumps(record))
    one_line_exit_2(capsys, lambda: length_rows(ckpt), "2 given for 4 rotary pairs")
    (ckpt / "longrope_x2.json").write_text(json.dumps({**record, "original_length": 16, "factor": 4.0}))
    one_line_exit_2(capsys, lambda: length_rows(ckpt), "searched for x4 of 16 tokens", command)
    with pytest.raises(ConfigCompositionException) as e:  # a choice not offered: refused as the config composes
        compose_cfg("eval", f"checkpoint={ckpt}", *EVAL, "eval.rope_scaling=longrop")
    assert "eval.rope_scaling=longrop is not one of" in compose_message(e.value)


def test_search_bad_input_is_one_line(tiny_checkpoint, tmp_path, capsys):
    ckpt = copy_run(tiny_checkpoint, tmp_path)
    one_line_exit_2(capsys, lambda: ls.run(tiny_search_cfg(ckpt, "target_length=32")), "target_length=32 must be")
    one_line_exit_2(capsys, lambda: ls.run(tiny_search_cfg(ckpt, "search.parents=9")), "search.parents=9")
    one_line_exit_2(capsys, lambda: ls.run(tiny_search_cfg(ckpt, "search.windows=100000")), "search.windows=100000")


def test_all_adds_longrope_only_where_every_factor_has_been_searched(tmp_path):
    closed = list(rope_scaling.KINDS)
    factors = [0.5, 1.0, 2.0, 4.0]
    (tmp_path / longrope.file_name(2.0)).write_text("{}")
    assert variants.with_searched(closed, "all", tmp_path, factors) == closed  # x4 not searched yet
    (tmp_path / longrope.file_name(4.0)).write_text("{}")
    assert variants.with_searched(closed, "all", tmp_path, factors) == [*closed, "longrope"]
    assert variants.with_searched(["none"], "all", tmp_path, factors) == ["none"]  # no rotation, or a scaling built in
    assert variants.with_searched(["yarn"], "yarn", tmp_path, factors) == ["yarn"]  # asked by name: only that
