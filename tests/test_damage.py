"""Every file read back is checked: each kind the project reads (checkpoint, metrics.jsonl, the prepared corpus, eval
and task results, LongRoPE records, the picture index), damaged in each way (cut short, empty, random bytes, a key
missing, a value of another type, another scheme's weights), and read by each entry point that reads it, ends in one
line on stderr naming the file, exit status 2, and every file as it was. A torn last line of metrics.jsonl is
dropped with a warning, and the run resumes.

python -m pytest -q tests/test_damage.py
The entry points run in this process (their checks are theirs, Hydra's callback only repeats them): train.py's
train(), eval.py's run(), sample.py's sample(), viz.py's run(), under utils/errors.py's cli() as their mains call
them; tests/test_faults.py runs the same as processes, for the contract's exit status and stderr.
"""

import copy
import importlib
import io
import json
import random
import shutil

import pytest
import torch
from conftest import ROOT, TINY, config
from hydra import compose, initialize_config_dir

from model.gpt import GPT, GPTConfig
from train import train
from utils.errors import cli

RANDOM = random.Random(0).randbytes(4096)


def entry_config(name: str, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(name, overrides=list(overrides))


def refused(fn, capsys) -> str:
    """fn() under cli(), as an entry point's main runs it: the one line it ends with (exit status 2)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        cli(fn)
    err = capsys.readouterr().err
    assert ended.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# what each entry point does with a run folder, and which checkpoint entries it reads
def evaluate(run, tmp_path):
    cfg = entry_config("eval", f"checkpoint={run}", "eval.lengths=[32]")
    return lambda: importlib.import_module("eval").run(cfg)


def sample(run, tmp_path):
    cfg = entry_config("sample", f"checkpoint={run}", "max_new_tokens=2")
    return lambda: importlib.import_module("sample").sample(cfg)


def fine_tune(run, tmp_path):
    return lambda: train(config(*TINY, f"init_from={run}", "train.max_steps=1"), tmp_path / "fine-tune")


def resume(run, tmp_path):
    return lambda: train(config(*TINY, "train.resume=true", "train.max_steps=4"), run)


def picture(run, tmp_path):
    cfg = entry_config("viz", f"checkpoint={run}", "viz.heads=[[0,0]]", f"viz.out={tmp_path / 'pictures'}")
    return lambda: importlib.import_module("viz").run(cfg)


READERS = {"eval.py": evaluate, "sample.py": sample, "init_from": fine_tune, "train.resume": resume, "viz.py": picture}
EVERY = tuple(READERS)
READS = {  # an entry a reader does not read may be missing: eval.py scores a checkpoint stripped of its optimizer
    "config": ("eval.py", "viz.py"),
    "step": ("eval.py", "init_from", "train.resume", "viz.py"),
    "optimizer": ("train.resume",),
    "rows": ("train.resume",),
}


def without(key):
    return lambda ckpt: ckpt.pop(key)


def setting(key, value):
    def damage(ckpt):
        *path, last = key.split(".")
        node = ckpt
        for k in path:
            node = node[k]
        node[last] = value

    return damage


def other_scheme(ckpt):
    """T5's weights (its bucket table) under the RoPE model's config."""
    t5 = {**ckpt["model_config"], "positional": {"name": "t5"}}
    ckpt["model"] = GPT(GPTConfig(**t5)).state_dict()


def other_optimizer(ckpt):
    ckpt["optimizer"] = ckpt["optimizer"][:1]  # AdamW's state alone, where Muon's run has two optimizers


# damage -> (what it does to the checkpoint's bytes or its dict, the readers that refuse it, what the line says)
CHECKPOINT = {
    "cut short": (lambda raw: raw[: len(raw) // 2], EVERY, "corrupt or truncated"),
    "empty": (lambda raw: b"", EVERY, "corrupt or truncated"),
    "random bytes": (lambda raw: RANDOM, EVERY, "corrupt or truncated"),
    "no model_config": (without("model_config"), EVERY, "has no 'model_config'"),
    "no tokenizer": (without("tokenizer"), EVERY, "has no 'tokenizer'"),
    "no seq_len": (without("seq_len"), EVERY, "has no 'seq_len'"),
    "no model_config.positional": (lambda c: c["model_config"].pop("positional"), EVERY, "has no model_config.pos"),
    "no config": (without("config"), READS["config"], "has no 'config'"),
    "no step": (without("step"), READS["step"], "has no 'step'"),
    "no optimizer": (without("optimizer"), READS["optimizer"], "has no 'optimizer'"),
    "no rows": (without("rows"), READS["rows"], "has no 'rows'"),
    "seq_len a string": (setting("seq_len", "256"), EVERY, "holds seq_len as str where int is expected"),
    "model_config a string": (setting("model_config", "rope"), EVERY, "holds model_config as str"),
    "tokenizer a list": (setting("tokenizer", [1, 2]), EVERY, "holds tokenizer as list"),
    "tokenizer without ranks": (lambda c: c["tokenizer"].pop("ranks"), EVERY, "holds a tokenizer that has no ranks"),
    "config.data a number": (setting("config.data", 3), EVERY, "holds config.data as int"),
    "model_config.n_layer a string": (setting("model_config.n_layer", "2"), EVERY, "builds no model"),
    "weights not tensors": (setting("model", {"w": [1.0]}), EVERY, "holds weights that are not tensors"),
    "another scheme's weights": (other_scheme, EVERY, "the weights of another model than its model_config (rope)"),
    "another optimizer's state": (other_optimizer, READS["optimizer"], "does not fit this run's optimizer"),
}
CASES = [(damage, reader) for damage, (_, readers, _) in CHECKPOINT.items() for reader in readers]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shakespeare_dir):
    """A tiny RoPE run of 2 steps (Muon: two optimizers), kept pristine: each case damages a copy."""
    out = tmp_path_factory.mktemp("trained")
    train(config(*TINY, "train.max_steps=2"), out)
    return out


@pytest.mark.parametrize("damage,reader", CASES, ids=[f"{d}-{r}" for d, r in CASES])
def test_a_damaged_checkpoint_is_one_line_and_changes_nothing(damage, reader, trained, tmp_path, capsys):
    """67 cases: each damage, read by each entry point that reads what it damaged. Fails on the code before: a key
    missing or of another type was a KeyError or TypeError traceback in eval.py, sample.py, finetune.py or checks.py,
    another scheme's weights torch's multi-line load_state_dict message, another optimizer's state a ValueError."""
    change, _, words = CHECKPOINT[damage]
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    raw = (run / "ckpt.pt").read_bytes()
    if damage in ("cut short", "empty", "random bytes"):
        (run / "ckpt.pt").write_bytes(change(raw))
    else:
        ckpt = copy.deepcopy(torch.load(io.BytesIO(raw), weights_only=True))
        change(ckpt)
        torch.save(ckpt, run / "ckpt.pt")
    before = snapshot(tmp_path)
    line = refused(READERS[reader](run, tmp_path), capsys)
    assert str(run) in line and words in line, line
    assert snapshot(tmp_path) == before


def test_a_checkpoint_read_once_is_read_again_when_it_changes(trained, tmp_path, capsys):
    """An entry point's checks and its own reads share one mapped read of a checkpoint; a file written over since (a
    run saving again, a damage) is read and checked afresh: the same bytes read twice are one read, other bytes never
    the earlier ones."""
    from utils import checkpoint

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    first = checkpoint.load(run, mmap=True)
    assert checkpoint.load(run, mmap=True) is first
    ckpt = copy.deepcopy(torch.load(run / "ckpt.pt", weights_only=True))
    ckpt["seq_len"] = 48
    torch.save(ckpt, run / "ckpt.pt")
    assert checkpoint.load(run, mmap=True)["seq_len"] == 48
    other_scheme(ckpt)
    torch.save(ckpt, run / "ckpt.pt")
    line = refused(sample(run, tmp_path), capsys)
    assert "the weights of another model than its model_config (rope)" in line, line


@pytest.fixture
def metrics_run(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run, (run / "metrics.jsonl").read_text().splitlines()


def test_a_torn_last_line_of_metrics_is_dropped_with_a_warning_and_the_run_resumes(metrics_run, capsys):
    """A process killed while it wrote its last line (no newline after it): the resume drops that line with a
    warning, continues, and logs its steps after the kept ones. Fails on the code before: a JSONDecodeError
    traceback on every resume until the file was mended by hand."""
    run, lines = metrics_run
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 3, "train_lo')
    train(config(*TINY, "train.resume=true", "train.max_steps=3"), run)
    assert "its last line is cut short (line 3); dropped" in capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


@pytest.mark.parametrize(
    "damage",
    [
        lambda lines: [lines[0], '{"step": 2, "train_lo', *lines[1:]],  # torn, then written after
        lambda lines: [lines[0], "[1, 2]", *lines[1:]],  # JSON, not a logged step
        lambda lines: [lines[0], '{"train_loss": 4.0}', *lines[1:]],  # a step missing
        lambda lines: [lines[0], '{"step": "2"}', *lines[1:]],  # a step of another type
        lambda lines: [RANDOM.decode("latin-1")],  # random bytes, newlines among them
    ],
    ids=["torn-in-the-middle", "not-an-object", "no-step", "step-a-string", "random-bytes"],
)
def test_a_damaged_metrics_log_stops_a_resume_in_one_line(damage, metrics_run, tmp_path, capsys):
    """Anything but a torn last line is not a log to continue: one line naming the file and the line, nothing
    changed (the checkpoint, the log). Fails on the code before: a JSONDecodeError or KeyError traceback."""
    run, lines = metrics_run
    (run / "metrics.jsonl").write_text("\n".join(damage(lines)) + "\n")
    before = snapshot(run)
    line = refused(resume(run, tmp_path), capsys)
    assert f"{run / 'metrics.jsonl'} line " in line and "is not a logged step" in line
    assert snapshot(run) == before


def edit_json(change):
    """A damage that loads a JSON file, changes the value in place, and writes it back."""

    def damage(path):
        value = json.loads(path.read_text())
        change(value)
        path.write_text(json.dumps(value))

    return damage


def cut(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def resealed(change):
    """A damage to a prepared file made as if it had been prepared so: meta.json records the file as it now is."""

    def damage(path):
        from data import loader

        edit_json(change)(path)
        loader.seal(path.parent)

    return damage


BOTH = ("train", "eval")
# a damage to the prepared corpus -> (the file, what it does, the readers that read it, what the line says)
CORPUS = {
    "meta.json cut short": ("meta.json", cut, BOTH, "meta.json cannot be read"),
    "meta.json empty": ("meta.json", lambda p: p.write_text(""), BOTH, "meta.json cannot be read"),
    "meta.json random bytes": ("meta.json", lambda p: p.write_bytes(RANDOM), BOTH, "meta.json cannot be read"),
    "meta.json without splits": ("meta.json", edit_json(lambda m: m.pop("splits")), BOTH, "meta.json has no splits"),
    "meta.json vocab_size a string": (
        "meta.json", edit_json(lambda m: m.update(vocab_size="4096")), BOTH, "meta.json holds vocab_size as str"
    ),
    "meta.json shards not a list": (
        "meta.json", edit_json(lambda m: m["splits"]["val"].update(shards={})), BOTH, "meta.json holds splits.val.sh"
    ),
    "meta.json dtype float32": (
        "meta.json", edit_json(lambda m: m.update(dtype="float32")), BOTH, "meta.json holds dtype 'float32', not a"
    ),
    "meta.json without the val split": (
        "meta.json", edit_json(lambda m: m["splits"].pop("val")), BOTH, "meta.json has no val split"
    ),
    "tokenizer.json cut short": ("tokenizer.json", cut, BOTH, "tokenizer.json holds"),
    "tokenizer.json without ranks": (
        "tokenizer.json", resealed(lambda t: t.pop("ranks")), BOTH, "tokenizer.json has no ranks"
    ),
    "train shard emptied": ("train_000.bin", lambda p: p.write_bytes(b""), ("train",), "train_000.bin holds 0 bytes"),
    "val documents cut short": ("val_docs.npy", cut, BOTH, "val_docs.npy holds"),
}  # fmt: skip
CORPUS_CASES = [(damage, reader) for damage, (_, _, readers, _) in CORPUS.items() for reader in readers]


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory):
    """A small text corpus, prepared, and a tiny run trained on it (its checkpoint names the prepared folder)."""
    from test_faults import small_corpus

    base = tmp_path_factory.mktemp("corpus")
    folder, options = small_corpus(base)
    train(config(*TINY, *options, "train.max_steps=2"), base / "run")
    shutil.copytree(folder, base / "pristine")
    return folder, options, base / "run", base / "pristine"


@pytest.mark.parametrize("damage,reader", CORPUS_CASES, ids=[f"{d}-{r}" for d, r in CORPUS_CASES])
def test_a_damaged_prepared_corpus_is_one_line_and_changes_nothing(damage, reader, corpus_run, tmp_path, capsys):
    """22 cases: a prepared folder's meta.json, tokenizer.json, shards and document starts, damaged, read by a new
    training run and by eval.py (the checkpoint's held-out split). Fails on the code before: a KeyError or TypeError
    traceback for a meta.json that is JSON but lacks a key, a tokenizer.json that is no tokenizer, a missing split."""
    folder, options, run, pristine = corpus_run
    name, change, _, words = CORPUS[damage]
    shutil.rmtree(folder)
    shutil.copytree(pristine, folder)
    change(folder / name)
    before = snapshot(folder), snapshot(run)
    if reader == "train":
        fn = lambda: train(config(*TINY, *options, "train.max_steps=1"), tmp_path / "new")  # noqa: E731
    else:
        fn = evaluate(run, tmp_path)
    line = refused(fn, capsys)
    assert f"the prepared data at {folder} is damaged: {words}" in line and "rebuild it: rm -r" in line, line
    assert (snapshot(folder), snapshot(run)) == before and not (tmp_path / "new" / "ckpt.pt").exists()


def study_folder(root):
    """A study as runs/study.sh leaves it: two runs' length.json, a stream.json and a passkey.json."""
    from test_compare import fake_run

    study = root / "study"
    for name, shift in (("rope-s1", 0.0), ("alibi-s1", 0.5)):
        (study / name / "eval").mkdir(parents=True)
        (study / name / "eval" / "length.json").write_text(json.dumps(fake_run(name[:-3], 1, shift)))
    dense = {"nll": [4.0], "ci": [[50.0, 60.0]], "mean": {"ppl": 54.6, "ci": [50.0, 60.0]}}
    stream = {"checkpoint": "rope-s1/ckpt.pt", "scheme": "rope", "methods": {"dense": dense}, "block": 64}
    stream |= {"stream_tokens": 64, "train_length": 32, "works": []}
    (study / "rope-s1" / "eval" / "stream.json").write_text(json.dumps(stream))
    passkey = {"scheme": "rope", "results": [], "train_length": 32, "lengths": [], "depths": [], "trials": 1}
    (study / "rope-s1" / "eval" / "passkey.json").write_text(json.dumps(passkey))
    return study


JSON_DAMAGE = {  # what each does to a result file, and what the line says
    "cut short": (cut, "is cut short or not JSON"),
    "empty": (lambda p: p.write_text(""), "is empty"),
    "random bytes": (lambda p: p.write_bytes(RANDOM), "cannot be read"),
    "a key missing": (edit_json(lambda v: v.pop("scheme")), "has no scheme"),
    "a key of another type": (edit_json(lambda v: v.update(scheme=3)), "holds scheme as int where str"),
}
RESULT_FILES = ("rope-s1/eval/length.json", "rope-s1/eval/stream.json", "rope-s1/eval/passkey.json")
RESULT_CASES = [(damage, file) for damage in JSON_DAMAGE for file in RESULT_FILES]


@pytest.mark.parametrize("damage,file", RESULT_CASES, ids=[f"{d}-{f.split('/')[-1]}" for d, f in RESULT_CASES])
def test_a_damaged_result_stops_the_study_report_in_one_line(damage, file, tmp_path, capsys):
    """15 cases: a study's length, stream and passkey results, damaged, read by python -m evaluation.study: one line
    naming the file and the command that writes it again, and no report written. Fails on the code before: a
    JSONDecodeError or KeyError traceback."""
    from evaluation import study as report

    study = study_folder(tmp_path)
    change, words = JSON_DAMAGE[damage]
    change(study / file)
    before = snapshot(study)
    line = refused(lambda: report.main([str(study)]), capsys)
    assert f"{study / file} is not a {file.split('/')[-1][:-5]} result: it {words}" in line, line
    assert "delete it and evaluate again (python eval.py checkpoint=" in line
    assert snapshot(study) == before


@pytest.mark.parametrize("damage", list(JSON_DAMAGE))
def test_a_damaged_task_result_stops_the_battery_report_in_one_line(damage, tmp_path, capsys):
    """5 cases: a run's eval/tasks.json, damaged, read by python -m evaluation.tasks (runs/tasks.sh's report).
    Fails on the code before: a JSONDecodeError or KeyError traceback."""
    from test_tasks_eval import fake_result

    from evaluation import tasks

    for scheme in ("rope", "alibi"):
        (tmp_path / "copy" / f"{scheme}-s1" / "eval").mkdir(parents=True)
        result = json.dumps(fake_result(scheme, 1, [1, 0]))
        (tmp_path / "copy" / f"{scheme}-s1" / "eval" / "tasks.json").write_text(result)
    path = tmp_path / "copy" / "rope-s1" / "eval" / "tasks.json"
    JSON_DAMAGE[damage][0](path)
    line = refused(lambda: tasks.write_report(tmp_path), capsys)
    assert f"{path} is not a tasks result: it {JSON_DAMAGE[damage][1]}" in line
    assert not (tmp_path / "REPORT.md").exists() and not (tmp_path / "eval").exists()


LONGROPE = {  # JSON_DAMAGE's, on the key a LongRoPE record is for, and a factor that is no number
    **{d: JSON_DAMAGE[d] for d in ("cut short", "empty", "random bytes")},
    "a key missing": (edit_json(lambda v: v.pop("factors")), "has no factors"),
    "a key of another type": (edit_json(lambda v: v.update(factors=3)), "holds factors as int where list"),
    "a factor not a number": (edit_json(lambda v: v.update(factors=[1.0, "2"])), "factors that are not positive"),
}


@pytest.mark.parametrize("damage", list(LONGROPE))
def test_a_damaged_longrope_record_is_one_line(damage, tmp_path, capsys):
    """6 cases: a LongRoPE factors file (python -m evaluation.longrope_search writes it, eval.py and sample.py read
    it), damaged. Fails on the code before for a factor that is not a number (accepted, then a TypeError)."""
    from evaluation import longrope

    record = {"factors": [1.0, 2.0], "start_tokens": 0, "attn_scale": 1.1, "original_length": 32, "factor": 2.0}
    path = longrope.save(tmp_path, record)
    change, words = LONGROPE[damage]
    change(path)
    line = refused(lambda: longrope.load(tmp_path, 2.0, 32), capsys)
    assert str(path) in line and words in line and "make it again with: python -m evaluation.longrope_search" in line


@pytest.mark.parametrize("damage", ["cut short", "empty", "random bytes", "a key of another type"])
def test_a_damaged_picture_index_is_one_line(damage, tmp_path, capsys):
    """4 cases: viz.py's index.json (its sections, which a later viz.py into the same folder keeps), damaged."""
    from gallery.draw import write_index

    write_index(tmp_path, "python viz.py", [("rope", "init", "rope", [("bias", "rope_bias.png", None)])])
    path = tmp_path / "index.json"
    if damage == "a key of another type":
        edit_json(lambda v: v["rope"].update(rows=3))(path)
    else:
        JSON_DAMAGE[damage][0](path)
    before = snapshot(tmp_path)
    line = refused(lambda: write_index(tmp_path, "python viz.py", []), capsys)
    assert str(path) in line and "delete it (the next viz.py lists its own pictures)" in line
    assert snapshot(tmp_path) == before
