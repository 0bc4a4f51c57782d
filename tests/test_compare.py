"""evaluation/compare.py: runs that differ only in seed become one row with mean and spread; noise is marked."""

import json
import math

import numpy as np
import pytest

from evaluation.compare import compare, group_runs
from evaluation.report import scheme_label

PIECES = [{"work": f"w{i % 4}", "start": 64 * (i // 4 + 1), "tokens": 64} for i in range(16)]


def fake_run(scheme: str, seed: int, shift, **train) -> dict:
    """A length.json as eval.py writes it: one cell, per-piece NLLs that vary a lot from piece to piece."""
    piece_nll = 4.0 + np.sin(np.arange(16)) + shift
    nll = float(piece_nll.mean())
    return {
        "checkpoint": f"/runs/{scheme}-{seed}/ckpt.pt",
        "scheme": scheme,
        "train_length": 32,
        "step": 20,
        "pieces": PIECES,
        "train_config": {
            "seed": seed,
            "out_dir": f"/runs/{scheme}-{seed}",  # differs in every run, as in a Hydra sweep
            "logger": {"group": f"g{seed}"},
            "positional": {"name": scheme},
            "train": {"seq_len": 32, "log_interval": seed, **train},
        },
        "results": [
            {"scheme": scheme, "variant": "none", "length": 64, "mode": "nonoverlap", "nll": nll,
             "ppl": math.exp(nll), "tokens": 1024, "piece_nll": list(piece_nll)}
        ],
    }  # fmt: skip


def test_two_schemes_two_seeds_make_two_groups_with_their_means(tmp_path):
    runs = [fake_run("rope", 1, 0.0), fake_run("alibi", 1, 0.5), fake_run("rope", 2, 0.1), fake_run("alibi", 2, 0.7)]
    groups = group_runs(runs)
    assert [(g["label"], g["seeds"]) for g in groups] == [("rope", [1, 2]), ("alibi", [1, 2])]
    text = compare(runs, tmp_path)
    out = json.loads((tmp_path / "compare.json").read_text())
    rows = {r["run_label"]: r for r in out["results"]}
    base = float((4.0 + np.sin(np.arange(16))).mean())
    for name, shifts in {"rope": (0.0, 0.1), "alibi": (0.5, 0.7)}.items():
        row, ppls = rows[name], [math.exp(base + s) for s in shifts]
        assert row["runs"] == 2 and row["seeds"] == [1, 2]
        assert row["ppl"] == pytest.approx(math.exp(base + np.mean(shifts)))  # exp(mean NLL over seeds)
        assert row["ppl_runs"] == pytest.approx(ppls) and row["ppl_sd"] == pytest.approx(np.std(ppls, ddof=1))
        assert row["ci"][0] < row["ppl"] < row["ci"][1]
    assert rows["rope"]["mark"] == "*" and rows["alibi"]["mark"] == ""  # 0.55 nats worse on every piece: no noise
    assert not rows["alibi"]["vs_best"]["within_noise"] and rows["alibi"]["vs_best"]["best"] == "rope"
    assert [p["paired"] for p in out["pairs"]] == [True]
    assert "±" in text and "rope: 2 runs (seed 1, 2)" in text and (tmp_path / "compare.png").exists()


def test_a_difference_inside_the_noise_is_marked_and_other_keys_split_groups(tmp_path):
    wobble = 0.1 * np.cos(3 * np.arange(16))  # better on some pieces, worse on others, 0.005 nats worse on average
    runs = [fake_run("rope", 1, 0.0), fake_run("nope", 1, wobble), fake_run("rope", 1, 0.3, seq_len=64)]
    groups = group_runs(runs)
    assert [g["label"] for g in groups] == ["rope [train.seq_len=32]", "nope", "rope [train.seq_len=64]"]
    compare(runs, tmp_path)
    rows = {r["run_label"]: r for r in json.loads((tmp_path / "compare.json").read_text())["results"]}
    assert rows["nope"]["mark"] == "~" and rows["nope"]["vs_best"]["within_noise"]
    assert rows["rope [train.seq_len=32]"]["ppl_sd"] is None  # one run: no spread to give


def test_a_run_saved_before_an_option_existed_joins_only_runs_with_it_off():
    """The study's learned seeds were saved across two new options (positional.scaling, model.ssmax): a run that
    lacks a key is the same recipe as one holding the option's off value, and not as one that turned it on."""
    old = fake_run("learned", 1, 0.0)
    off = fake_run("learned", 2, 0.1, scaling="none", factor=1.0, ssmax=False)
    on = fake_run("learned", 3, 0.2, scaling="none", factor=1.0, ssmax=True)
    big = fake_run("learned", 4, 0.2, factor=4.0)
    groups = group_runs([old, off, on, big])
    assert [g["seeds"] for g in groups] == [[1, 2], [3], [4]]
    labels = [g["label"] for g in groups]  # what tells them apart, a missing key at its off value not among it
    assert labels == ["learned", "learned [train.ssmax=True]", "learned [train.factor=4.0]"]


def test_a_variant_study_names_each_variant_by_what_it_changed_and_the_baseline_by_its_scheme():
    """RoPE, partial RoPE and windowed RoPE in one study: each label holds only the keys where that group leaves
    the value most groups share, so the baseline reads `rope` and no label lists another variant's defaults."""
    base = fake_run("rope", 1, 0.0, window=None, window_pattern="S", rotary_fraction=1.0)
    partial = fake_run("rope", 1, 0.1, window=None, window_pattern="S", rotary_fraction=0.25)
    windowed = fake_run("rope", 1, 0.2, window=64, window_pattern="SSSL", rotary_fraction=1.0)
    labels = [g["label"] for g in group_runs([base, partial, windowed, fake_run("alibi", 1, 0.3)])]
    assert labels == [
        "rope",
        "rope [train.rotary_fraction=0.25]",
        "rope [train.window=64, train.window_pattern=SSSL]",
        "alibi",
    ]


def test_reports_name_a_scheme_by_its_config_not_its_module():
    """iRoPE's attention module is RoPE's: a label from the module would make rope and irope one row."""
    rope = {"positional": {"name": "rope", "base": 10000}}
    irope = {"positional": {"name": "rope", "base": 10000, "layers": "PPPN", "attn_scale": 0.1}}
    every_layer = {"positional": {"name": "rope", "layers": "P"}}
    yarn = {"positional": {"name": "rope", "scaling": "yarn", "scaling_factor": 4.0, "original_length": 256}}
    nope = {"positional": {"name": "nope", "layers": "N"}}
    labels = [scheme_label({"model_config": c, "init_from": None}) for c in (rope, irope, every_layer, yarn, nope)]
    assert labels == ["rope", "rope/PPPN", "rope", "rope[yarn x4 from 256]", "nope"]
    drope = {"model_config": {"positional": {"name": "nope"}}, "init_from": {"path": "out/rope", "dropped": "rope"}}
    assert scheme_label(drope) == "nope[dropped rope]"
    longer = {"model_config": rope, "seq_len": 1024, "init_from": {"path": "out/rope", "seq_len": 256}}
    assert scheme_label(longer) == "rope[at 1024 from 256]"
    assert scheme_label({**longer, "seq_len": 256}) == "rope"  # at its own length (a passkey fine-tune): rope


def test_runs_that_scored_other_pieces_are_said_to_be_unpaired(tmp_path):
    """Runs trained at other lengths score other held-out pieces, though as many tokens: the table does not say they
    scored the same tokens, and the noise marks say they are unpaired."""
    other = fake_run("alibi", 1, 0.5)
    other["pieces"] = [{**p, "start": p["start"] + 1} for p in PIECES]
    text = compare([fake_run("rope", 1, 0.0), other], tmp_path)
    assert "every cell scored the same" not in text and "rows are not paired" in text and "unpaired" in text
    assert [p["paired"] for p in json.loads((tmp_path / "compare.json").read_text())["pairs"]] == [False]
    same = compare([fake_run("rope", 1, 0.0), fake_run("alibi", 1, 0.5)], tmp_path / "same")
    assert "every cell scored the same 1,024 held-out tokens" in same and "unpaired" not in same
