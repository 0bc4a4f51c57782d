"""evaluation/study.py's markdown table: the README's Results table made from compare.compare's rows."""

from evaluation.study import markdown_table


def row(scheme, length, ppl, mark="", sd=0.5, mode="nonoverlap"):
    return {
        "scheme": scheme,
        "variant": "none",
        "length": length,
        "mode": mode,
        "ppl": ppl,
        "ppl_sd": sd,
        "ci": [ppl - 5, ppl + 5],
        "mark": mark,
    }


def test_rows_sorted_by_the_training_length_marks_kept_sd_at_train_and_longest():
    rows = [
        row("rope", 128, 106.0, "*"),
        row("rope", 256, 104.8, "~"),
        row("rope", 1024, 150.0),
        row("alibi", 128, 107.0),
        row("alibi", 256, 100.5, "*"),
        row("alibi", 1024, 98.0, "*"),
        {**row("learned", 256, 130.0), "mark": ""},
        {**row("learned", 1024, 0.0), "ppl": None, "ci": None},
        row("alibi", 256, 90.0, "*", mode="sliding"),  # another mode: not in the table
    ]
    lines = markdown_table(rows, 256).splitlines()
    assert lines[0] == "| scheme | 128 | **256 (trained)** | 1024 (4x) |"
    assert [ln.split(" | ")[0] for ln in lines[2:]] == ["| alibi", "| rope", "| learned"]
    alibi, rope, learned = lines[2:]
    assert alibi == "| alibi | 107.0 [102.0, 112.0] | **100.5** ±0.5 [95.5, 105.5] | **98.0** ±0.5 [93.0, 103.0] |"
    assert rope.split(" | ")[1:3] == ["**106.0** [101.0, 111.0]", "104.8~ ±0.5 [99.8, 109.8]"]
    assert learned.endswith("| n/a | 130.0 ±0.5 [125.0, 135.0] | n/a |")  # no 128 row, 1024 beyond its table


FAKE_PYTHON = """#!{exe}
import os, shutil, sys, pathlib
if sys.argv[1] == "-c":  # the scripts' own one-liners (a checkpoint's step and length, a factor): real python
    os.execv({exe!r}, [{exe!r}, *sys.argv[1:]])
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
with open({log!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1] == "train.py":
    pathlib.Path(args["out_dir"]).mkdir(parents=True, exist_ok=True)
    shutil.copy({ckpt!r}, pathlib.Path(args["out_dir"]) / "ckpt.pt")
elif sys.argv[1] == "eval.py":
    out = pathlib.Path(args["checkpoint"]) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    (out / (args.get("eval.mode", "length") + ".json")).write_text({result!r})
"""
RESULT = '{"checkpoint": "ckpt.pt", "scheme": "rope", "results": [], "methods": {}}'  # as much as the scripts read


def fake_python(tmp_path):
    """A python for runs/*.sh that logs each call and writes what train.py (a checkpoint holding step 280 at length
    256) and eval.py (<mode>.json) would. Returns its path, its log and that checkpoint."""
    import sys

    import torch

    ckpt, log, fake = tmp_path / "base.pt", tmp_path / "calls.log", tmp_path / "python"
    torch.save({"step": 280, "seq_len": 256}, ckpt)
    fake.write_text(FAKE_PYTHON.format(exe=sys.executable, log=str(log), ckpt=str(ckpt), result=RESULT))
    fake.chmod(0o755)
    return fake, log, ckpt


def run_study_script(tmp_path, kept: list[str], env: dict, *overrides: str) -> tuple[list[str], str]:
    """runs/study.sh with a fake python that logs each call and writes what train.py and eval.py would; `kept` are
    runs already evaluated (length.json, no checkpoint). Returns the logged calls and the script's stdout."""
    import os
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    fake, log, _ = fake_python(tmp_path)
    for run in kept:
        (tmp_path / "study" / run / "eval").mkdir(parents=True)
        (tmp_path / "study" / run / "eval" / "length.json").write_text(RESULT)
    env = {**os.environ, "PYTHON": str(fake), "STUDY": str(tmp_path / "study"), **env}
    cmd = ["bash", str(repo / "runs" / "study.sh"), *overrides]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return log.read_text().splitlines(), out


def test_study_script_grows_a_kept_study_without_retraining_or_streaming_what_it_holds(tmp_path):
    """A study kept as its evaluations alone (results/study-breadth: length.json and stream.json, no checkpoints):
    runs/study.sh trains and evaluates only the runs it lacks, and asks no checkpoint-less run for a stream."""
    study = tmp_path / "study"
    env = {"SCHEMES": "fox kerple", "SEEDS": "1 2"}
    calls, out = run_study_script(tmp_path, ["fox-s1", "fox-s2"], env, "logger.wandb=false")  # fox: checkpoint gone
    trained = [c for c in calls if c.startswith("train.py")]
    assert [c.split("out_dir=")[1].split()[0] for c in trained] == [f"{study}/kerple-s1", f"{study}/kerple-s2"]
    evals = [c for c in calls if c.startswith("eval.py")]
    assert len([c for c in evals if "fox" in c]) == 0
    assert len([c for c in evals if "kerple" in c and "eval.mode=stream" not in c]) == 2
    assert [c for c in evals if "eval.mode=stream" in c] == [
        f"eval.py checkpoint={study}/kerple-s1 eval.mode=stream logger.wandb=false"
    ]
    assert "fox-s1: no checkpoint left to stream" in out
    assert calls[-1] == f"-m evaluation.study {study}"


def test_study_script_puts_a_tagged_variant_beside_the_plain_runs_with_its_overrides(tmp_path):
    """TAG=window64 trains <scheme>-window64-s<seed> with the overrides, beside a kept plain <scheme>-s<seed>,
    which it neither retrains nor evaluates (the plain and the variant runs would otherwise share a folder)."""
    study = tmp_path / "study"
    calls, _ = run_study_script(
        tmp_path, ["rope-s1"], {"SCHEMES": "rope", "SEEDS": "1", "TAG": "window64"}, "model.window=64"
    )
    assert calls[0] == (
        f"train.py positional=rope seed=1 out_dir={study}/rope-window64-s1 logger.group=study model.window=64"
    )
    assert f"eval.py checkpoint={study}/rope-window64-s1 logger.wandb=false" in calls
    assert not any(f"{study}/rope-s1" in c for c in calls)
    [record] = (study / "commands.txt").read_text().splitlines()  # the call, kept beside what it made
    assert record.startswith(f'STUDY={study} SCHEMES="rope" SEEDS="1" STREAM=1 TAG=window64 EVAL_ARGS=""')
    assert "bash runs/study.sh model.window=64   # " in record and ", commit " in record
    from evaluation.report import made_by

    assert made_by(study)[3] == record and made_by(tmp_path) == []


def test_the_report_titles_a_variants_stream_by_its_seed_group_not_its_bare_scheme(tmp_path, monkeypatch):
    """A windowed RoPE run's stream.json says scheme `rope`, as the plain run's does: the report must name it by
    what its seed group's label says it changed, or two streams read `rope` with nothing to tell them apart."""
    import json

    from test_compare import fake_run

    import evaluation.study as study_module

    monkeypatch.setattr(study_module, "stream_table", lambda result: "(stream table)")
    study = tmp_path / "study"
    runs = {"rope-s1": fake_run("rope", 1, 0.0), "rope-window64-s1": fake_run("rope", 1, -0.1, window=64)}
    for name, run in runs.items():
        run["checkpoint"] = f"study/{name}/ckpt.pt"
        (study / name / "eval").mkdir(parents=True)
        (study / name / "eval" / "length.json").write_text(json.dumps(run))
        stream = {"checkpoint": run["checkpoint"], "scheme": "rope", "stream_tokens": 512, "block": 256, "methods": {}}
        (study / name / "eval" / "stream.json").write_text(json.dumps(stream))
    text = study_module.report(study)
    assert "### rope (rope-s1)" in text and "### rope [train.window=64] (rope-window64-s1)" in text


def test_the_report_shows_each_passkey_run_as_its_table_and_heatmap(tmp_path):
    """runs/extension.sh's passkey runs (no length.json of their own) appear in its report with their accuracy
    per (length, depth) and Wilson interval, beside the length table of the runs that have one."""
    import json

    from test_compare import fake_run

    import evaluation.study as study_module
    from evaluation.bootstrap import wilson

    study = tmp_path / "study"
    (study / "rope" / "eval").mkdir(parents=True)
    (study / "rope" / "eval" / "length.json").write_text(json.dumps(fake_run("rope", 1, 0.0)))
    rows = [
        {"length": n, "depth": d, "accuracy": k / 50, "correct": k, "trials": 50, "ci": wilson(k, 50)}
        for n, k in ((256, 50), (1024, 3))
        for d in (0.0, 1.0)
    ]
    passkey = {
        **{"scheme": "alibi", "step": 600, "train_length": 256, "train_data": "passkey", "key_digits": 5},
        **{"trials": 50, "lengths": [256, 1024], "depths": [0.0, 1.0], "works": ["hamlet_gut"], "results": rows},
    }
    (study / "alibi-passkey" / "eval").mkdir(parents=True)
    (study / "alibi-passkey" / "eval" / "passkey.json").write_text(json.dumps(passkey))
    text = study_module.report(study)
    section = text.split("## Passkey retrieval\n")[1]
    assert section.startswith("\n### alibi (alibi-passkey)\n")
    assert "1.00 [0.93, 1.00]" in section and "0.06 [0.02, 0.16]" in section  # 50/50 and 3/50 with their intervals
    (study / "rope-passkey" / "eval").mkdir(parents=True)  # learned QK gains: said, as the heads may pass the cap
    (study / "rope-passkey" / "eval" / "passkey.json").write_text(json.dumps({**passkey, "qk_norm": "learned"}))
    assert "### alibi (qk_norm=learned) (rope-passkey)" in study_module.report(study)
    far = {**passkey, "variant": "rerope", "results": [{**r, "window": 128, "leak": None} for r in rows]}
    (study / "rope-passkey" / "eval" / "passkey-rerope.json").write_text(json.dumps(far))  # eval.rope_scaling=rerope
    (study / "rope-passkey" / "eval" / "passkey-rerope.png").write_bytes(b"png")
    text = study_module.report(study)  # after the model as trained, under its own name and heatmap
    assert text.index("### alibi + rerope (w 128) (rope-passkey)") > text.index("(qk_norm=learned) (rope-passkey)")
    assert "(rope-passkey/eval/passkey-rerope.png)" in text
    for name in ("passkey.json", "passkey-rerope.json", "passkey-rerope.png"):
        (study / "rope-passkey" / "eval" / name).unlink()
    (study / "alibi-passkey" / "eval" / "passkey.json").unlink()
    assert "Passkey" not in study_module.report(study)  # a study without passkey runs has no such section


def test_extension_script_searches_longrope_at_every_length_within_the_held_out_text(tmp_path):
    """runs/extension.sh from a study's seed-1 runs: LongRoPE is searched at every length past training, with at most
    16K fitness tokens (at 16x the held-out text left unread by the table holds only 4 windows of 4096: asking for
    8 stopped the whole script there), then every length, fine-tune, DroPE and passkey run in turn."""
    import os
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    fake, log, ckpt = fake_python(tmp_path)
    for scheme in ("rope", "alibi", "nope"):
        (tmp_path / "study" / f"{scheme}-s1").mkdir(parents=True)
        (tmp_path / "study" / f"{scheme}-s1" / "ckpt.pt").write_bytes(ckpt.read_bytes())
        (tmp_path / "study" / f"{scheme}-s1" / "DONE").write_text("")
    env = {**os.environ, "PYTHON": str(fake), "BASE": str(tmp_path / "study"), "EXT": str(tmp_path / "ext")}
    subprocess.run(["bash", str(repo / "runs" / "extension.sh")], env=env, check=True, capture_output=True)
    calls = log.read_text().splitlines()
    searches = [c for c in calls if c.startswith("-m evaluation.longrope_search")]
    found = [(c.split("target_length=")[1].split()[0], c.split("search.windows=")[1].split()[0]) for c in searches]
    assert found == [("512", "8"), ("1024", "8"), ("2048", "8"), ("4096", "4")]
    passkeys = [c for c in calls if c.startswith("eval.py") and "eval.mode=passkey" in c]
    assert len(passkeys) == 5 + 4  # 4.'s five models, then 5.: RoPE's under four training-free extensions
    free = [c.split("eval.rope_scaling=")[1] for c in passkeys if "eval.rope_scaling=" in c]
    assert free == ["rerope", "leaky_rerope", "yarn", "ntk"] and all("ext/rope-passkey " in c for c in passkeys[5:])
    assert calls[-1] == f"-m evaluation.study {tmp_path / 'ext'}"
    tunes = [c for c in calls if c.startswith("train.py") and "data=passkey" in c]  # with QK gains, by default
    assert len(tunes) == 5 and all("model.qk_norm=learned" in c and "-passkey " in c for c in tunes)
    steps = {
        c.split("init_from=")[1].split()[0].split("/")[-1]: c.split("train.max_steps=")[1].split()[0] for c in tunes
    }
    assert steps == {"rope": "1200", "rope-yarn4": "4080", "drope": "1200", "alibi": "1200", "nope": "1200"}  # samples
    env["PASSKEY_QK"] = "rms"  # the gain-free fine-tunes, beside them: everything else is done and skipped
    log.write_text("")
    subprocess.run(["bash", str(repo / "runs" / "extension.sh")], env=env, check=True, capture_output=True)
    trained = [c for c in log.read_text().splitlines() if c.startswith("train.py")]
    assert len(trained) == 5 and all("model.qk_norm=rms" in c and "-passkey-rms " in c for c in trained)


def test_a_result_cut_short_is_named_and_scored_again(tmp_path):
    """runs/study.sh over a run whose eval/length.json was cut short (a disk that filled, an older writer): the script
    names the file and evaluates the run again, where it used to skip it for existing and leave the report to fail on
    it at every rerun."""
    study = tmp_path / "study"
    _, _, ckpt = fake_python(tmp_path)
    (study / "rope-s1" / "eval").mkdir(parents=True)
    (study / "rope-s1" / "DONE").write_text("")
    (study / "rope-s1" / "ckpt.pt").write_bytes(ckpt.read_bytes())
    (study / "rope-s1" / "eval" / "length.json").write_text(RESULT[:20])
    calls, _ = run_study_script(tmp_path, [], {"SCHEMES": "rope", "SEEDS": "1", "STREAM": "0"})
    assert calls == [f"eval.py checkpoint={study}/rope-s1 logger.wandb=false", f"-m evaluation.study {study}"]


STOPPED_BY_SIGTERM = """#!{exe}
import signal, sys, time, pathlib
with open({log!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))  # as train.py: save, then exit 0, a stop that was asked for
pathlib.Path({log!r} + ".started").write_text("")
time.sleep(60)
"""


def test_sigterm_stops_a_study_without_marking_the_run_done(tmp_path):
    """SIGTERM to the script's process group (timeout, SLURM, Ctrl-C's SIGINT alike) while a run trains: train.py
    saves and exits 0, and the script stops there (exit 130), neither marking that run DONE nor starting the next.
    Fails on the code before: the stopped run was marked DONE, so never resumed, and the next one started."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    fake, log = tmp_path / "python", tmp_path / "calls.log"
    fake.write_text(STOPPED_BY_SIGTERM.format(exe=sys.executable, log=str(log)))
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "STUDY": str(tmp_path / "study"), "SCHEMES": "rope alibi", "SEEDS": "1"}
    proc = subprocess.Popen(["bash", str(repo / "runs" / "study.sh")], env=env, start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    for _ in range(600):
        if Path(f"{log}.started").exists():
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "stopped: run the same command again" in err
    assert len(log.read_text().splitlines()) == 1 and not (tmp_path / "study" / "rope-s1" / "DONE").exists()


def stream_run(name: str, window: list[float], sinks: list[float], tokens: int = 1000, block: int = 256) -> dict:
    """A stream.json with per-block mean NLLs for two methods, on one stream of `tokens` tokens."""
    method = lambda nll: {"nll": nll, "tokens": tokens}  # noqa: E731
    return {"checkpoint": name, "scheme": "rope", "stream_tokens": tokens, "block": block, "works": [],
            "methods": {"window 0+256": method(window), "sinks 4+252": method(sinks)}}  # fmt: skip


def test_pooled_streams_weigh_tokens_pair_blocks_and_seeds_and_leave_out_single_seeds():
    import math

    from evaluation.study import pooled_streams

    a1, a2 = [4.0, 5.0, 6.0, 3.0], [4.5, 5.5, 5.0, 3.5]  # two seeds of a; blocks of 256, 256, 256, 232 tokens
    streams = [
        stream_run("a1", a1, [x - 0.2 for x in a1]),
        stream_run("a2", a2, [x - 0.2 for x in a2]),
        stream_run("b1", a1, a1),  # b: two seeds alike, so which seed a draw picks does not matter
        stream_run("b2", a1, a1),
        stream_run("c1", [x + 0.5 for x in a1], a1),
        stream_run("c2", [x + 0.5 for x in a1], [1.0, 1.0]),  # sinks cut short in one seed: not pooled for c
        stream_run("d1", a1, a1),  # one seed: left out
    ]
    group_of = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "c1": "c", "c2": "c", "d1": "d"}
    pooled = pooled_streams(streams, group_of)
    assert list(pooled["groups"]) == ["a", "b", "c"] and list(pooled["groups"]["c"]["methods"]) == ["window 0+256"]
    weights = [256, 256, 256, 232]
    mean = lambda nll: sum(w * x for w, x in zip(weights, nll, strict=True)) / 1000  # noqa: E731
    got = pooled["groups"]["a"]["methods"]["window 0+256"]
    assert got["ppl_runs"] == [round(math.exp(mean(a1)), 4), round(math.exp(mean(a2)), 4)]
    assert got["ppl"] == round(math.exp((mean(a1) + mean(a2)) / 2), 4)
    assert got["ci"][0] < got["ppl"] < got["ci"][1]
    pairs = {(p["a"], p["b"]): p for p in pooled["pairs"]}
    # within a group the same seeds and blocks are drawn for both methods: a constant gap has no spread
    same = pairs["a: window 0+256", "a: sinks 4+252"]
    assert math.isclose(same["diff_nll"], 0.2) and math.isclose(same["lo"], 0.2) and math.isclose(same["hi"], 0.2)
    # between groups the same blocks are drawn: c is b shifted by 0.5 in every block
    shift = pairs["b: window 0+256", "c: window 0+256"]
    assert math.isclose(shift["lo"], -0.5) and math.isclose(shift["hi"], -0.5)
    assert ("a: window 0+256", "b: sinks 4+252") not in pairs  # neither one group nor one method: not compared
