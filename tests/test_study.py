"""runs/study.sh: trains schemes x seeds, evaluates, reports; a second call redoes nothing, an interrupted run resumes.

python -m pytest -q tests/test_study.py
"""

import json
import os
import subprocess
import sys

from conftest import ROOT, TINY


def study(folder, env_extra):
    env = {
        **os.environ,
        "STUDY": str(folder),
        "SCHEMES": "rope alibi",
        "SEEDS": "1 2",
        "PYTHON": sys.executable,
        "EVAL_ARGS": "eval.tokens=2048 eval.lengths=[32,64]",
        "STREAM_ARGS": "eval.stream_tokens=96 eval.block=32",
        **env_extra,
    }
    overrides = [o for o in TINY if not o.startswith("logger")] + ["train.max_steps=2", "logger.wandb=false"]
    return subprocess.run(
        ["bash", "runs/study.sh", *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def test_study_trains_evaluates_reports_and_resumes(tmp_path, shakespeare_dir):
    first = study(tmp_path, {})
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    groups = json.loads((tmp_path / "eval" / "compare.json").read_text())["groups"]
    assert sorted((g["label"], sorted(g["seeds"])) for g in groups) == [("alibi", [1, 2]), ("rope", [1, 2])]
    report = (tmp_path / "REPORT.md").read_text()
    assert "[" in report and "compare.png" in report and report.count("### ") == 2  # intervals, plot, 2 streams

    # a run cut short (no DONE) resumes from its checkpoint; finished and evaluated runs are left alone
    (tmp_path / "rope-s2" / "DONE").unlink()
    before = (tmp_path / "alibi-s1" / "eval" / "length.json").stat().st_mtime_ns
    second = study(tmp_path, {})
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "rope-s2: training train.resume=true" in second.stdout
    assert "alibi-s1: trained" in second.stdout
    assert (tmp_path / "alibi-s1" / "eval" / "length.json").stat().st_mtime_ns == before
