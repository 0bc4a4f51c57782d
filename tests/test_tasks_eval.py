"""eval.mode=tasks (evaluation/tasks.py) and the battery's runner (runs/tasks.sh): exact match scored only on the
answer, n/a where positions run out, a seed group's interval over its samples and its seeds, differences paired on the
same samples; and the task names the config offers are data/tasks.py's."""

import os
import subprocess

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY, config
from test_study import RESULT, fake_python

from data import tasks
from evaluation import tasks as scoring
from model.gpt import GPTConfig


class Oracle(torch.nn.Module):
    """A stand-in model whose argmax at every position is the sample's true next token, except where told; it
    records the positions it was given."""

    def __init__(self, samples, wrong=(), max_positions=None):
        super().__init__()
        self.samples, self.wrong, self.seen = samples, set(wrong), []
        self.pe = type("PE", (), {"max_positions": max_positions})()

    def forward(self, idx, pos=None):
        self.seen.append(pos)
        logits = torch.zeros(*idx.shape, tasks.VOCAB_SIZE)
        for b, row in enumerate(idx.tolist()):
            k = next(i for i, s in enumerate(self.samples) if s[:-1].tolist() == row[: len(s) - 1])
            s = self.samples[k]
            for t in range(len(s) - 1):
                logits[b, t, (s[t + 1] + (k in self.wrong)) % tasks.VOCAB_SIZE if t == len(s) - 2 else s[t + 1]] = 1
        return logits


def test_a_sample_is_right_only_when_every_answer_token_is():
    """The oracle errs only on the closing '.' of samples 1 and 33 (the last scored token): those two score 0, the
    rest 1, over two batches of mixed lengths padded with PAD."""
    samples = tasks.held_out("copy", 5, 20, seed=0) + tasks.held_out("copy", 9, 20, seed=0)
    got = scoring.score(Oracle(samples, wrong=(1, 33)), samples, None, np.random.default_rng(0), "cpu")
    assert got.tolist() == [0 if i in (1, 33) else 1 for i in range(40)]


def test_random_positions_are_drawn_per_batch_and_lengths_past_them_are_na():
    samples = tasks.held_out("copy", 8, 40, seed=0)
    model = Oracle(samples)
    assert scoring.score(model, samples, 64, np.random.default_rng(0), "cpu").all()
    first, second = model.seen
    for pos in (first, second):
        assert len(pos) == len(samples[0]) - 1 and (pos.diff() > 0).all() and pos.max() < 64
    assert not torch.equal(first, second)
    ev = type("Ev", (), {"trials": 4, "seed": 0})()  # the eval config's fields a cell reads
    new = {"config": {"data": {"random_positions": 40}}, "model_config": {"positional": {"name": "rope"}}}
    old = {"config": {"data": {}}, "model_config": {"positional": {"name": "rope", "random_positions": 40}}}
    for ckpt in (new, old):  # data.random_positions, or a checkpoint's from before the key moved there
        na = scoring.cell(Oracle(samples), ckpt, "copy", 32, ev, "cpu")  # 67 tokens: past the range of 40
        assert na["accuracy"] is None and "random range 40" in na["note"]
    with_old_key = GPTConfig(
        vocab_size=97, n_layer=1, n_head=2, n_kv_head=1, d_model=16, positional=old["model_config"]["positional"]
    )
    assert with_old_key.positional == {"name": "rope"}  # such a checkpoint still builds
    plain = {"config": {"data": {}}, "model_config": {"positional": {}}}
    table = scoring.cell(Oracle(samples, max_positions=20), plain, "copy", 16, ev, "cpu")
    assert table["accuracy"] is None and "learned table covers 20" in table["note"]


def fake_result(scheme: str, seed: int, correct: list[int], trained=("copy",), eval_seed: int = 0) -> dict:
    rows = [{"task": task, "n": 8, "tokens": 18, "accuracy": sum(correct) / len(correct), "correct": sum(correct),
             "trials": len(correct), "ci": scoring.wilson(sum(correct), len(correct)), "right": correct}
            for task in trained]  # fmt: skip
    config = {"positional": {"name": scheme}, "seed": seed, "data": {"tasks": list(trained)}}
    ranges = {task: [1, 16] for task in trained}
    return {"checkpoint": f"{scheme}-s{seed}", "scheme": scheme, "train_config": config, "step": 10,
            "train": ranges, "trials": len(correct), "seed": eval_seed, "results": rows}  # fmt: skip


def test_runs_of_one_task_each_are_labelled_by_scheme_and_a_shared_task_by_its_set():
    """A battery of one run per task: each task's table has a row per scheme, the seeds of a (task, scheme) pooled.
    A mixture run beside them, on a task both trained: each row names the task set it trained on."""
    per_task = [fake_result("rope", seed, [1, 0], (task,)) for task in ("copy", "reverse") for seed in (1, 2)]
    got = scoring.cells(per_task)
    assert list(got) == ["copy", "reverse"] and all(list(by) == ["rope"] for by in got.values())
    assert got["copy"]["rope"][8]["trials"] == 4 and got["copy"]["rope"][8]["samples"] == 2  # two seeds, one draw
    got = scoring.cells([*per_task, fake_result("rope", 1, [1, 1], ("copy", "reverse"))])
    assert sorted(got["copy"]) == ["rope [data.tasks=copy,reverse]", "rope [data.tasks=copy]"]
    assert got["copy"]["rope [data.tasks=copy,reverse]"][8]["accuracy"] == 1.0


def test_a_seed_group_reports_the_mean_and_spread_of_its_seeds():
    results = [
        fake_result("rope", 1, [1, 1, 0, 0]),
        fake_result("rope", 2, [1, 1, 1, 1]),
        fake_result("alibi", 1, [0] * 4),
    ]
    cells = scoring.cells(results)["copy"]
    rope, alibi = cells["rope"][8], cells["alibi"][8]
    assert (rope["accuracy"], rope["seeds"], rope["trials"], rope["samples"]) == (0.75, [0.5, 1.0], 8, 4)
    assert rope["sd"] == pytest.approx(np.std([0.5, 1.0], ddof=1))
    assert alibi["accuracy"] == 0 and alibi["sd"] is None and alibi["ci"] == scoring.wilson(0, 4)  # one run: Wilson
    assert "| rope | 0.75* ±0.35" in scoring.table(results)


def test_seeds_scoring_the_same_samples_are_not_independent_trials():
    """Three seeds right on the same 40 of 50 samples know no more than one run of 50: the interval holds that of 50
    samples, not the narrower one of 150 pooled trials; seeds that disagree widen it further."""
    same = [fake_result("rope", seed, [1] * 40 + [0] * 10) for seed in (1, 2, 3)]
    cell = scoring.cells(same)["copy"]["rope"][8]
    lo, hi = scoring.wilson(40, 50)
    assert cell["samples"] == 50 and cell["ci"][0] <= round(lo, 4) and cell["ci"][1] >= round(hi, 4)
    assert cell["ci"][1] - cell["ci"][0] > 1.5 * np.subtract(*scoring.wilson(120, 150)[::-1])  # 150 pooled: narrower
    apart = [fake_result("rope", seed, [1] * k + [0] * (50 - k)) for seed, k in ((1, 10), (2, 25), (3, 40))]
    wide = scoring.cells(apart)["copy"]["rope"][8]
    assert wide["accuracy"] == 0.5 and wide["ci"][0] < 0.3 and wide["ci"][1] > 0.7
    own = [fake_result("rope", seed, [1] * 40 + [0] * 10, eval_seed=seed) for seed in (1, 2, 3)]
    assert scoring.cells(own)["copy"]["rope"][8]["samples"] == 150  # each seed scored its own draw


def test_two_groups_on_the_same_samples_differ_by_a_paired_interval():
    """rope is right wherever alibi is and on 6 samples more, in every seed: a paired difference of 0.12 whose
    interval excludes 0, though each cell's interval holds the other's accuracy. nope, as often right as alibi but
    on other samples, differs from alibi by no detected amount, nor from rope (46 samples where the two disagree)."""
    a = [fake_result("alibi", seed, [1] * 20 + [0] * 30) for seed in (1, 2, 3)]
    b = [fake_result("rope", seed, [1] * 26 + [0] * 24) for seed in (1, 2, 3)]
    c = [fake_result("nope", seed, [0] * 30 + [1] * 20) for seed in (1, 2, 3)]
    got = scoring.summary(a + b + c)
    pairs = {(p["a"], p["b"]): p for p in got["pairs"]}
    assert pairs[("alibi", "rope")]["diff"] == -0.12 and pairs[("alibi", "rope")]["hi"] < 0
    assert got["cells"]["copy"]["rope"][8]["ci"][0] < 0.4 < 0.52 < got["cells"]["copy"]["alibi"][8]["ci"][1]
    assert pairs[("alibi", "nope")]["diff"] == 0 and pairs[("alibi", "nope")]["within_noise"]
    assert [got["cells"]["copy"][g][8]["mark"] for g in ("rope", "alibi", "nope")] == ["*", "", "~"]


def test_groups_whose_seeds_score_their_own_samples_pair_seed_by_seed():
    """Each seed scored its own draw (eval.seed), at accuracies far apart (0.2, 0.5, 0.8), and rope is right on 3 of
    50 samples more than alibi in every seed: paired seed by seed, the difference 0.06 excludes 0; seeds picked apart
    for each group would mix the seeds' spread into it."""

    def runs(scheme, extra):
        return [fake_result(scheme, seed, [1] * (k + extra) + [0] * (50 - k - extra), eval_seed=seed)
                for seed, k in ((1, 10), (2, 25), (3, 40))]  # fmt: skip

    got = scoring.summary(runs("alibi", 0) + runs("rope", 3))
    pair = next(p for p in got["pairs"] if (p["a"], p["b"]) == ("alibi", "rope"))
    assert pair["diff"] == -0.06 and pair["hi"] < 0, pair


def test_the_config_offers_exactly_the_tasks_data_tasks_generates():
    assert list(config("data=tasks").data.tasks) == list(tasks.TASKS)


def test_train_and_score_a_task_model_end_to_end(tmp_path):
    """data=tasks trains (one sample a row at random positions), eval.mode=tasks writes its table and heatmap, and a
    text-only mode refuses the task model in one line (as tasks mode refuses a text model)."""
    from eval import run
    from train import train

    out = tmp_path / "copy"
    overrides = [*TINY, "experiment=tasks", "data.tasks=[copy]", "train.seq_len=36", "train.max_steps=2",
                 "train.warmup_steps=1", "data.train_docs=256", "data.val_docs=64",
                 "data.random_positions=300"]  # fmt: skip
    train(config(*overrides), out)
    ev = config_eval(f"checkpoint={out}", "eval.mode=tasks", "eval.trials=3", "device=cpu", "logger.wandb=false")
    result = run(ev)
    assert [r["n"] for r in result["results"]] == list(tasks.TASKS["copy"].test)
    assert result["scheme"].endswith("+random") and all(r["trials"] in (0, 3) for r in result["results"])
    assert (out / "eval" / "tasks.png").stat().st_size > 0 and (out / "eval" / "tasks.txt").exists()
    with pytest.raises(Exception, match="eval.mode=length does not fit .* eval.mode=tasks scores"):
        run(config_eval(f"checkpoint={out}", "device=cpu", "logger.wandb=false"))


def config_eval(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("eval", overrides=list(overrides))


def test_the_battery_trains_each_task_scheme_and_random_variant_once_and_resumes(tmp_path):
    """runs/tasks.sh with a fake python: per seed, every task of BATTERY alone with every scheme, random-position
    variant (a learned table as wide as the range) and layout preset (over the battery's recipe), then each run
    scored once and the report; a second call trains and scores nothing again."""
    fake, log, _ = fake_python(tmp_path)
    env = {**os.environ, "PYTHON": str(fake), "TASKS": str(tmp_path / "battery"), "BATTERY": "copy add",
           "SCHEMES": "rope learned", "RANDOMIZED": "learned", "PRESETS": "gemma3", "SEEDS": "1 2",
           "RANGE": "512"}  # fmt: skip
    for _ in range(2):
        subprocess.run(["bash", "runs/tasks.sh", "train.max_steps=5"], cwd=ROOT, env=env, check=True)
    calls = log.read_text().splitlines()
    trains = [c for c in calls if c.startswith("train.py")]
    assert len(trains) == 16 and all("train.max_steps=5" in c for c in trains)
    assert sum("data.tasks=[copy]" in c for c in trains) == sum("data.tasks=[add]" in c for c in trains) == 8
    random = [c for c in trains if "random_positions=512" in c]
    assert len(random) == 4 and all("positional.max_positions=512" in c for c in random)
    presets = [c for c in trains if "experiment=[tasks,gemma3]" in c]
    assert len(presets) == 4 and not any("positional=" in c for c in presets)  # the preset picks its scheme
    assert all("experiment=tasks " in c for c in trains if c not in presets)
    evals = [c for c in calls if c.startswith("eval.py")]
    assert len(evals) == 16 and all("eval.mode=tasks" in c for c in evals)
    words = [dict(w.split("=", 1) for w in c.split()[1:] if "=" in w) for c in evals]
    assert all(w["checkpoint"].endswith(f"-s{w['eval.seed']}") for w in words)  # on its own seed's samples
    assert sum(c.startswith("-m evaluation.tasks") for c in calls) == 2  # the report, each time
    assert (tmp_path / "battery" / "add" / "rope-s1" / "eval" / "tasks.json").read_text() == RESULT
    record = (tmp_path / "battery" / "commands.txt").read_text().splitlines()  # each call, every variable it ran with
    settings = 'BATTERY="copy add" SCHEMES="rope learned" RANDOMIZED="learned" PRESETS="gemma3" SEEDS="1 2" RANGE=512'
    call = f"TASKS={tmp_path / 'battery'} {settings} EXPERIMENT=tasks bash runs/tasks.sh train.max_steps=5   # "
    assert len(record) == 2 and record[0].startswith(call)
    empty = {**env, "TASKS": str(tmp_path / "none"), "SCHEMES": "", "RANDOMIZED": "", "PRESETS": ""}
    log.write_text("")
    subprocess.run(["bash", "runs/tasks.sh"], cwd=ROOT, env=empty, check=True)
    assert not any(c.startswith("train.py") for c in log.read_text().splitlines())  # empty lists: nothing trained


def test_the_readme_headline_is_written_from_the_battery_summary(tmp_path, monkeypatch):
    """python -m evaluation.doc_tables writes the tasks table from results/tasks/eval/tasks.json: a row per scheme,
    the longest training length, 2x and 8x per task, seeds pooled with their sd, n/a where a length was not scored."""
    from evaluation import doc_tables

    def result(scheme, seed, right):
        out = fake_result(scheme, seed, right)
        rows = [{**out["results"][0], "n": n, "accuracy": None if n == 128 else out["results"][0]["accuracy"]}
                for n in (16, 32, 128)]  # fmt: skip
        return {**out, "results": rows}

    scoring.compare([result("rope", 1, [1, 0]), result("rope", 2, [1, 1]), result("alibi", 1, [0, 0])],
                    tmp_path / "tasks" / "eval")  # fmt: skip
    monkeypatch.setattr(doc_tables, "RESULTS", tmp_path)
    doc_tables.load.cache_clear()
    try:
        lines = doc_tables.tasks().splitlines()
    finally:
        doc_tables.load.cache_clear()
    assert lines[0] == "| scheme | copy 16 | copy 32 (2x) | copy 128 (8x) |"
    assert lines[2] == "| rope | **0.75** ±0.35 | **0.75** ±0.35 | n/a |" and lines[3] == "| alibi | 0~ | 0~ | n/a |"
    assert "the mean of 1-2 seeds ±sd, all on the same 2 held-out samples" in lines[5]
