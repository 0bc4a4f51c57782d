"""Faults lose nothing: a process killed while it saves, a full disk, two runs in one folder, damaged prepared data and
a run that diverges without a NaN each end in a loadable checkpoint and at most one line; a run says where it stands.

python -m pytest -q tests/test_faults.py
(SIGTERM and resume on the same loss curve: tests/test_train.py, which also checks the lock between two processes.)
"""

import errno
import fcntl
import io
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import ROOT, TINY, config, run

from data import loader, tokenizer
from data.loader import TokenSplit
from data.prepare import prepare
from train import LOST_STEPS, lost, train
from utils import checkpoint
from utils.errors import UserError
from utils.logger import clock

WRITER = """
import sys, torch
from utils import checkpoint
for i in range(1, 10**6):
    checkpoint.save(sys.argv[1], {"model": {"w": torch.full((2**22,), float(i))}, "step": i})  # 16 MiB
    print(i, flush=True)
"""


def temps(folder):
    return sorted(p.name for p in folder.glob(".ckpt.pt.tmp*"))


def test_kill_9_while_saving_leaves_a_loadable_checkpoint_and_the_next_save_removes_its_temp(tmp_path):
    """A process that saves 16 MiB checkpoints in a loop is killed with SIGKILL at random moments (writing and
    syncing take most of each turn of its loop, so most kills land inside a save). Every time, ckpt.pt loads as a
    whole state, the last one saved or the one after it, and the next save removes the temp file the killed one left.
    Checked to fail without the temp-then-rename write (torch.save straight to ckpt.pt: a torn archive on
    load), and on the code before stale temp files were removed (a kill inside a write left its temp file for good)."""
    path, rng, left_behind, inside_a_save = tmp_path / "ckpt.pt", random.Random(0), [], 0
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()  # one whole save done: a checkpoint exists from here on
        assert not set(left_behind) & set(temps(tmp_path))  # that save removed what the last kill left
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        printed = [1, *map(int, proc.stdout.read().split())]  # the saves that finished
        proc.stdout.close()
        ckpt = torch.load(path, weights_only=True)
        assert ckpt["step"] in (printed[-1], printed[-1] + 1)  # or killed after a rename, before its print
        w = ckpt["model"]["w"]
        assert w.numel() == 2**22 and bool((w == ckpt["step"]).all())
        left_behind = temps(tmp_path)
        inside_a_save += bool(left_behind)
    assert inside_a_save  # at least one kill landed inside a write (five chances)
    checkpoint.save(path, {"model": {"w": torch.zeros(1)}, "step": 0})
    assert temps(tmp_path) == []


def test_only_stale_temp_files_of_this_checkpoint_are_removed(tmp_path):
    """A temp file is removed when it is ours (.ckpt.pt.tmp<pid>) and its writer is gone; a live writer's, another
    checkpoint's and any other file stay. Fails on the code before stale temp files were removed."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = [f".ckpt.pt.tmp{done.pid}", f".ckpt.pt.tmp{live.pid}", f".other.pt.tmp{done.pid}", "notes.tmp1"]
        for name in names:
            (tmp_path / name).write_bytes(b"x" * 100)
        checkpoint.save(tmp_path / "ckpt.pt", {"model": {"w": torch.ones(2)}})
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ckpt.pt", *names[1:]])
    finally:
        live.kill()
        live.wait()


class FullDisk(io.FileIO):
    """A file on a disk that fills up after `room` bytes: a write past it raises ENOSPC, as write(2) does."""

    room = 1 << 16

    def write(self, b):
        if self.tell() + len(b) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(b)


def test_a_full_disk_raises_one_os_error_and_keeps_the_checkpoint(tmp_path, monkeypatch):
    """ENOSPC midway through a checkpoint: one OSError naming the checkpoint, nothing chained to it (torch's own
    "unexpected pos" RuntimeError, raised while it closes the half-written archive, was the second traceback), the
    previous checkpoint as it was and no temp file. Fails on the code before: the RuntimeError escaped, with the
    OSError as its context."""
    path = tmp_path / "ckpt.pt"
    checkpoint.save(path, {"model": {"w": torch.ones(2**18)}, "step": 1})
    before = path.read_bytes()
    monkeypatch.setattr(checkpoint, "open", lambda p, mode: io.BufferedWriter(FullDisk(p, mode)), raising=False)
    with pytest.raises(OSError) as raised:
        checkpoint.save(path, {"model": {"w": torch.zeros(2**18)}, "step": 2})
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert raised.value.__suppress_context__ and raised.value.__cause__ is None
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["ckpt.pt"]


FULL_DISK_HOOK = """
# Loaded at interpreter start only where the test puts this folder on PYTHONPATH: checkpoint temp files fill the disk.
import builtins, errno, io, os

_open = builtins.open


class FullDisk(io.FileIO):
    def write(self, b):
        if self.tell() + len(b) > int(os.environ["FULL_DISK_AFTER_BYTES"]):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(b)


def open(file, mode="r", *args, **kwargs):
    if ".ckpt.pt.tmp" in str(file) and "w" in mode:
        return io.BufferedWriter(FullDisk(file, "wb"))
    return _open(file, mode, *args, **kwargs)


if os.environ.get("FULL_DISK_AFTER_BYTES"):
    builtins.open = open
"""


def test_a_full_disk_ends_the_run_in_one_line_and_the_printed_command_resumes(tmp_path, shakespeare_dir):
    """train.py on a disk that fills while it saves: exit 2 and one line that names the checkpoint kept (step 2) and
    the command that resumes; the checkpoint is as it was and no temp file is left. That command, run once there is
    room, continues from step 2. Fails on the code before: two chained tracebacks (OSError, then torch's
    RuntimeError) and exit 1."""
    out, hook = tmp_path / "run", tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(FULL_DISK_HOOK))
    run("train.py", *TINY, "train.max_steps=2", f"out_dir={out}", check=True)
    before = (out / "ckpt.pt").read_bytes()
    env = {
        "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
        "FULL_DISK_AFTER_BYTES": "65536",
    }
    proc = run("train.py", *TINY, "train.max_steps=4", "train.resume=true", f"out_dir={out}", env=env)
    line = one_line_error(proc, "No space left on device", f"the last good checkpoint (step 2) is kept in {out}")
    assert (out / "ckpt.pt").read_bytes() == before and temps(out) == []
    command = shlex.split(line.split("then resume: ")[1])
    assert command[:2] == ["python", "train.py"] and command[-2:] == ["train.resume=true", f"out_dir={out}"]
    run(*command[1:], check=True)
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 4


def one_line_error(proc, *needles) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_second_run_into_a_locked_out_dir_is_refused(tmp_path, shakespeare_dir):
    """While another process holds out_dir's lock (here the test itself), train() stops before it writes anything,
    naming the holder's pid. The lock is released when a run ends, by an error too, and leaves no file. Fails on
    the code before: both runs wrote into the same folder."""
    cfg = [*TINY, "train.max_steps=1"]
    with open(tmp_path / ".lock", "w") as held:  # as a run holds it: an exclusive flock, its pid inside
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write(f"{os.getpid()}\n")
        held.flush()
        with pytest.raises(UserError, match=rf"out_dir={tmp_path} is in use by another run \(pid {os.getpid()}\); "):
            train(config(*cfg), tmp_path)
        assert sorted(os.listdir(tmp_path)) == [".lock"]
    os.unlink(tmp_path / ".lock")
    with pytest.raises(UserError, match="holds no ckpt.pt"):  # an error after the lock was taken
        train(config(*cfg, "train.resume=true"), tmp_path)
    train(config(*cfg), tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "metrics.jsonl"]


def small_corpus(tmp_path):
    """A text corpus prepared into tmp_path/cache (a fresh folder, whatever the cache of the repo holds)."""
    (tmp_path / "texts").mkdir()
    for i in range(5):
        (tmp_path / "texts" / f"{i}.txt").write_text(f"Line {i} of a small corpus with some words.\n" * 400)
    options = [f"data.path={tmp_path / 'texts'}", f"data.cache_dir={tmp_path / 'cache'}", "data.val_fraction=0.2"]
    options += ["tokenizer.vocab_size=300"]
    cfg = config(*TINY, "data=text", *options)
    from omegaconf import OmegaConf

    folder = prepare(OmegaConf.to_container(cfg.data, resolve=True), OmegaConf.to_container(cfg.tokenizer), log=None)
    return folder, ["data=text", *options]


def test_damaged_prepared_data_is_refused_in_one_line(tmp_path):
    """A shard cut short by a whole number of tokens, a shard rewritten in place at the same size, a truncated
    tokenizer.json: each is refused with the folder and the command that rebuilds it, never read as tokens. Fails on
    the code before: the shorter shard trained silently on part of the data, the rewritten one on other tokens, and
    the tokenizer stopped in a JSONDecodeError traceback."""
    folder, options = small_corpus(tmp_path)
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)

    def refused(*needles, open_split="train"):
        with pytest.raises(UserError) as raised:
            TokenSplit(folder, open_split) if open_split else tokenizer.read_spec(folder)
        for needle in (str(folder), f"rm -r {folder}", *needles):
            assert needle in str(raised.value)
        shutil.rmtree(folder)
        shutil.copytree(pristine, folder)

    shard = folder / "train_000.bin"
    shard.write_bytes(shard.read_bytes()[:-2000])  # 1000 uint16 tokens fewer: an even size
    one_line_error(run("train.py", *TINY, *options, f"out_dir={tmp_path / 'out'}"), "train_000.bin holds", "rm -r")
    refused("train_000.bin holds")
    val = folder / "val_000.bin"
    data = bytearray(val.read_bytes())
    data[100:104] = b"\x01\x00\x02\x00"
    val.write_bytes(bytes(data))
    refused("val_000.bin changed since it was prepared", open_split="val")
    spec = folder / "tokenizer.json"
    spec.write_text(spec.read_text()[:-100])
    refused("tokenizer.json holds", open_split=None)
    spec.write_text(spec.read_text() + " ")  # a byte more: the size says so before JSON is read
    refused("tokenizer.json holds", open_split=None)
    meta = json.loads((folder / "meta.json").read_text())  # what the checks read: every file but meta.json itself
    assert set(meta["files"]) == {p.name for p in folder.iterdir()} - {"meta.json"}
    assert TokenSplit(folder, "train").n_tokens == meta["splits"]["train"]["n_tokens"]


def test_a_shard_is_hashed_once_per_process_and_only_when_its_mtime_moved(tmp_path, monkeypatch):
    """The cost of the check: opening a split stats its files; a file whose mtime differs from meta.json's is hashed,
    once per process and version of the file. A folder prepared before sizes and checksums were recorded has its
    shards' sizes checked against their token counts."""
    folder, _ = small_corpus(tmp_path)
    hashed, original = [], loader.sha256
    monkeypatch.setattr(loader, "sha256", lambda p: hashed.append(p.name) or original(p))
    for _ in range(3):
        TokenSplit(folder, "train")
    assert hashed == []
    os.utime(folder / "train_000.bin")  # touched, not changed: hashed once, then trusted in this process
    for _ in range(3):
        TokenSplit(folder, "train")
    assert hashed == ["train_000.bin"]
    meta = json.loads((folder / "meta.json").read_text())
    del meta["files"]  # as prepared before the record was kept
    (folder / "meta.json").write_text(json.dumps(meta))
    shard = folder / "val_000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(UserError, match=r"val_000.bin holds [\d,]+ bytes where meta.json records [\d,]+ tokens"):
        TokenSplit(folder, "val")


def test_lost_is_a_loss_no_better_than_a_uniform_guess_past_warmup():
    ln_v = math.log(4096)
    assert lost(ln_v, 4096, 5, 4) and lost(ln_v - 5e-4, 4096, 5, 4) and lost(25.0, 4096, 5, 4)
    assert not lost(ln_v - 2e-3, 4096, 5, 4) and not lost(7.0, 4096, 5, 4)
    assert not lost(ln_v, 4096, 4, 4) and not lost(25.0, 4096, 1, 4)  # warmup starts at ln V: not judged


def test_a_run_pinned_at_ln_v_stops_before_it_saves(tmp_path, shakespeare_dir):
    """AdamW at lr=1e3 on model=tiny pins the loss at ln(4096) with a gradient norm of exactly 0 and no NaN for a
    while: LOST_STEPS such steps in a row stop the run, which says that no checkpoint was written (none was: the first
    save would be the last step's). Fails on the code before: the run went on, to a NaN whose message said that a last
    good checkpoint was kept, where none existed."""
    cfg = config(*TINY, "optim=adamw", "optim.lr=1e3", "train.warmup_steps=1", "train.max_steps=40")
    with pytest.raises(UserError) as raised:
        train(cfg, tmp_path)
    message = str(raised.value)
    assert f"{LOST_STEPS} steps in a row no better than a uniform guess (ln(4096) = 8.3178)" in message
    assert "gradient norm 0," in message and "no checkpoint was written yet" in message
    assert not (tmp_path / "ckpt.pt").exists()


def test_a_diverged_resume_keeps_the_last_good_checkpoint(tmp_path, shakespeare_dir):
    """A good run to step 3, resumed at lr=1e3 with a save every step: the weights of step 4 score worse than a uniform
    guess on the validation rows, so they are not saved; exit 2, one line, the step-3 checkpoint as it was. Fails on
    the code before: the run exited 0 with a checkpoint pinned at ln(4096) written over the good one."""
    opts = [*TINY, "optim=adamw", "train.warmup_steps=1"]
    train(config(*opts, "train.max_steps=3"), tmp_path)
    before = (tmp_path / "ckpt.pt").read_bytes()
    proc = run(
        "train.py",
        *opts,
        "optim.lr=1e3",
        "train.max_steps=12",
        "train.ckpt_interval=1",
        "train.resume=true",
        f"out_dir={tmp_path}",
    )
    one_line_error(proc, "validation loss", "no better than a uniform guess", "last good checkpoint (step 3)")
    assert (tmp_path / "ckpt.pt").read_bytes() == before


def test_progress_lines_show_elapsed_time_and_eta_and_the_end_says_where_and_what_next(
    tmp_path, shakespeare_dir, capsys
):
    """Every progress line ends with the time since the start and the time left at the pace so far; the closing lines
    name metrics.jsonl and the checkpoint and give the command that evaluates it. Fails on the code before (no
    times, and only the checkpoint named)."""
    train(config(*TINY, "train.max_steps=3"), tmp_path)
    lines = capsys.readouterr().out.splitlines()
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert len(steps) == 3 and all(re.search(r" tok/s elapsed \d+:\d\d eta \d+:\d\d$", ln) for ln in steps)
    assert steps[-1].endswith(" eta 0:00")
    assert lines[-2:] == [
        f"metrics {tmp_path}/metrics.jsonl; checkpoint {tmp_path}/ckpt.pt (step 3)",
        f"next: python eval.py checkpoint={tmp_path}",
    ]
    assert [clock(s) for s in (0, 59.6, 61, 3599, 3600, 90061)] == [
        "0:00",
        "1:00",
        "1:01",
        "59:59",
        "1:00:00",
        "25:01:01",
    ]


def start(*args, env=None) -> subprocess.Popen:
    """python <args> from the repo, its stdout and stderr apart, line by line."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env
    )


def signal_after(proc, needle: str, sig, timeout: float = 300) -> tuple[str, str]:
    """Send sig once a line of proc's stdout holds needle; (its whole stdout, its stderr) once it ends."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=timeout)
    return "".join(seen) + out, err


def test_sigterm_stops_a_sweep_after_its_job_saves(tmp_path, shakespeare_dir):
    """SIGTERM while job 0 of three trains: job 0 saves and says how to resume, and jobs 1 and 2 never start; exit 0,
    a stop that was asked for. Fails on the code before: Hydra started job 1 and trained it, and job 2, to the end."""
    sweep = tmp_path / "sweep"
    proc = start("train.py", "-m", "seed=1,2,3", *TINY, "train.max_steps=300", f"hydra.sweep.dir={sweep}")
    out, err = signal_after(proc, "step 3/300", signal.SIGTERM)
    assert proc.returncode == 0, err[-2000:]
    assert "stopped by SIGTERM at step" in out and (sweep / "0-rope" / "ckpt.pt").exists()
    assert sorted(p.parent.name for p in sweep.glob("*/ckpt.pt")) == ["0-rope"]
    assert "stopped by SIGTERM: job 2 (seed=2 " in err and "and the later ones were not started" in err


def text_corpus(folder, megabytes: int):
    """Random words over megabytes of text in 4 files: enough that preparing it (a BPE, then tokenizing) takes a
    few seconds."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 9))) for _ in range(20000)]
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(megabytes * 40000)))


def test_sigterm_while_the_data_is_prepared_stops_at_once_and_leaves_no_half_dataset(tmp_path):
    """SIGTERM while train.py prepares a corpus: nothing to save, so it stops at once with the shell's status for
    the signal (143), says so, and leaves no dataset folder, whole or half-built, and no run folder content. Fails on
    the code before: it printed "saving a checkpoint and stopping", prepared the corpus and trained on (SIGKILL was
    the only way out)."""
    text_corpus(tmp_path / "texts", 2)
    cache, out = tmp_path / "cache", tmp_path / "run"
    options = [f"data.path={tmp_path / 'texts'}", f"data.cache_dir={cache}", "train.max_steps=2", f"out_dir={out}"]
    proc = start("train.py", *TINY, "data=text", *options)
    said, err = signal_after(proc, "preparing text", signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, said + err
    assert "SIGTERM: stopping before the first step, with nothing to save" in said and "step 1/" not in said
    assert [p.name for p in cache.rglob("*") if p.is_file()] == [] and not (out / "ckpt.pt").exists()


RUSTBPE_STOPPED = """
import logging, sys
from data import tokenizer
from utils.runtime import Stopped
real, calls = logging.getLogger, []
def get_logger(name=None):
    if sys._getframe(1).f_code is tokenizer.train_bpe.__code__:  # train_bpe's own line, or rustbpe within it
        calls.append(name)
        if len(calls) > 1:  # the first is train_bpe's own, before rustbpe starts
            raise Stopped("SIGTERM")
    return real(name)
logging.getLogger = get_logger
try:
    tokenizer.train_bpe(iter(["to be or not to be"] * 50), 300, 10**6)
except BaseException as e:
    print(type(e).__name__, getattr(e, "code", None))
print("calls", len(calls))
"""


def test_a_signal_handled_as_rustbpe_starts_training_raises_its_own_stop():
    """rustbpe asks Python's logging for its logger as it first trains in a process; a SIGTERM handled at that moment
    raised Stopped inside that call, and rustbpe left it pending. Here (in a fresh process, as rustbpe asks once) the
    handler's Stopped is raised in that same call: train_bpe raises it, so train.py exits 143. Fails on the code
    before: a SystemError, exit 1 and a traceback."""
    done = subprocess.run([sys.executable, "-c", RUSTBPE_STOPPED], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    if done.stdout.split()[-1] == "1":
        pytest.skip("this rustbpe no longer calls Python's logging as it trains")
    assert done.stdout.splitlines()[0] == f"Stopped {128 + signal.SIGTERM}", done.stdout


def test_ctrl_c_in_a_sweep_evaluation_keeps_the_runs_done(tmp_path, shakespeare_dir):
    """Ctrl-C while eval.py scores the second of two runs: exit 130 and one line on stderr; the first run keeps its
    results, the second has none (nothing half-written). Fails on the code before: a KeyboardInterrupt traceback."""
    for i in range(2):
        train(config(*TINY, "train.max_steps=2", f"seed={i}"), tmp_path / "sweep" / f"{i}-rope")
    proc = start("eval.py", f"sweep_dir={tmp_path / 'sweep'}", "logger.wandb=false", "eval.tokens=16384")
    out, err = signal_after(proc, f"evaluating {tmp_path / 'sweep' / '1-rope'}", signal.SIGINT)
    assert proc.returncode == 128 + signal.SIGINT, out + err
    assert err.strip().splitlines() == [
        "stopped by SIGINT: the runs evaluated before it (1 of 2) keep their results; the evaluation under way wrote "
        "nothing; run the command again"
    ]
    assert (tmp_path / "sweep" / "0-rope" / "eval" / "length.json").exists()
    assert [p.name for p in (tmp_path / "sweep" / "1-rope" / "eval").iterdir()] == []


FULL_DISK_AT = """
# Loaded at interpreter start only where the test puts this folder on PYTHONPATH: a write to a file whose name holds
# FULL_DISK_AT fills the disk after 4 KiB.
import builtins, errno, io, os

_open = builtins.open


class FullDisk(io.FileIO):
    def write(self, b):
        if self.tell() + len(b) > 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(b)


def open(file, mode="r", *args, **kwargs):
    if os.environ["FULL_DISK_AT"] in str(file) and "w" in mode:
        return io.BufferedWriter(FullDisk(file, "wb"))
    return _open(file, mode, *args, **kwargs)


builtins.open = open
"""


def test_a_full_disk_while_eval_draws_its_plot_is_one_line_and_leaves_no_torn_file(tiny_checkpoint, tmp_path):
    """The disk fills while eval.py writes length.png: exit 2, one line naming length.png and what to do; no length.png
    cut short and no length.json beside it (the JSON is written last), and no temp file. Fails on the code before:
    a complete length.json beside a length.png cut short, and a traceback."""
    run_dir, hook = tmp_path / "run", tmp_path / "hook"
    shutil.copytree(tiny_checkpoint, run_dir)
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(FULL_DISK_AT))
    env = {"PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]), "FULL_DISK_AT": "length.png"}
    proc = run("eval.py", f"checkpoint={run_dir}", "logger.wandb=false", "eval.lengths=[32]", env=env)
    one_line_error(proc, f"cannot write {run_dir}/eval/length.png (No space left on device); free some space there")
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == []


def test_an_output_folder_that_cannot_be_written_fails_before_any_scoring(tiny_checkpoint, tmp_path):
    """A run whose eval/ cannot be made (a file stands there): one line naming it, before a single cell is scored.
    Fails on the code before: every cell was scored first, then a FileExistsError traceback."""
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_checkpoint, run_dir)
    (run_dir / "eval").write_text("notes")
    proc = run("eval.py", f"checkpoint={run_dir}", "logger.wandb=false", "eval.lengths=[32]")
    one_line_error(proc, f"checkpoint: cannot write {run_dir}/eval", "pass another checkpoint")
    assert "ppl" not in proc.stdout and (run_dir / "eval").read_text() == "notes"


def test_an_evaluation_that_repeats_the_numbers_keeps_no_earlier_copy(tmp_path):
    """Only another result is kept in eval/earlier/: the same numbers in another time and memory are not."""
    from evaluation.report import write_result

    row = {"length": 32, "ppl": 40.0, "seconds": 1.0, "peak_memory_mb": 100.0}
    write_result(tmp_path, "length", {"seconds": 3.0, "results": [row]})
    write_result(tmp_path, "length", {"seconds": 4.0, "results": [{**row, "seconds": 2.0, "peak_memory_mb": 9.0}]})
    assert not (tmp_path / "earlier").exists()
    write_result(tmp_path, "length", {"seconds": 4.0, "results": [{**row, "ppl": 41.0}]})
    assert [p.suffix for p in (tmp_path / "earlier").iterdir()] == [".json"]


def test_a_second_evaluation_keeps_the_first_result(tiny_checkpoint, tmp_path):
    """eval.py at other lengths over a run already evaluated: the new result takes the names, the first one's files
    stay in eval/earlier/, and the output says where. Fails on the code before: the first result was replaced."""
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_checkpoint, run_dir)
    small = ["logger.wandb=false", "eval.tokens=2048", "eval.sliding=false"]
    run("eval.py", f"checkpoint={run_dir}", *small, "eval.lengths=[32]", check=True)
    first = (run_dir / "eval" / "length.json").read_text()
    proc = run("eval.py", f"checkpoint={run_dir}", *small, "eval.lengths=[16,32]", check=True)
    kept = sorted((run_dir / "eval" / "earlier").iterdir())
    assert [p.suffix for p in kept] == [".json", ".png"] and kept[0].read_text() == first
    assert json.loads((run_dir / "eval" / "length.json").read_text())["lengths"] == [16, 32]
    assert f"the earlier result is kept as {run_dir}/eval/earlier/length-" in proc.stdout
