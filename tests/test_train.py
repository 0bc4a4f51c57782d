"""train.py as users run it: every scheme learns, runs resume exactly, bad input gets one clear line."""

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, SCHEMES, TINY, checkpoint_state, config, random_model, run

from train import eval_mode, grad_scaler, train
from utils import checkpoint, runtime
from utils.errors import UserError


def metrics(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", SCHEMES)
def test_every_scheme_lowers_the_loss(name, tmp_path, shakespeare_dir):
    cfg = config(*TINY, f"positional={name}", "train.max_steps=30", "train.warmup_steps=5", "train.eval_interval=30")
    summary = train(cfg, tmp_path)
    rows = metrics(tmp_path)
    assert rows[0]["train_loss"] > 7.5  # ln(4096) = 8.3 at the start
    assert summary["val_loss"] < rows[0]["train_loss"] - 1.0 and rows[-1]["train_loss"] < rows[0]["train_loss"] - 1.0
    assert {"step", "train_loss", "lr", "tokens_per_sec", "grad_norm"} <= rows[0].keys() and "val_loss" in rows[-1]
    assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in rows)
    # FLOPs/s = tokens/s x the model's FLOPs per token; no datasheet peak on the CPU, so no MFU
    assert all(r["tflops_per_sec"] > 0 and r["mfu"] is None for r in rows)
    ratio = rows[-1]["tflops_per_sec"] * 1e12 / rows[-1]["tokens_per_sec"]
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    model = checkpoint.build_model(ckpt["model_config"])
    assert ratio == pytest.approx(model.flops_per_token(32), rel=1e-2)
    assert ckpt["step"] == 30 and ckpt["config"]["positional"]["name"] == name
    # the default optimizer: Muon for the block matrices and AdamW for the rest, two states
    assert ckpt["tokenizer"]["kind"] == "bpe" and len(ckpt["optimizer"]) == 2 and ckpt["rows"] == 30 * 8


@pytest.mark.parametrize(
    "scheme", [["positional=sink"], ["positional=sink", "positional.n_sink=2"], ["positional=learned"]]
)
def test_end_of_run_sample_fits_its_cache(scheme, tmp_path, shakespeare_dir, capsys):
    """The sample printed at the end has room for every learned sink token, and stops at a learned table's end."""
    sample_tokens = 40 if "positional=learned" in scheme else 5  # more than the 32-position table
    assert train(config(*TINY, *scheme, "train.max_steps=2", f"train.sample_tokens={sample_tokens}"), tmp_path)
    assert "--- sample ---" in capsys.readouterr().out


def test_a_run_stopped_between_evaluations_reports_the_saved_weights_validation_loss(tmp_path, shakespeare_dir, capsys):
    """train.time_limit_min=0 stops after step 1, where train.eval_interval=4 measures nothing: the checkpoint and the
    closing line give the validation loss of the weights saved at step 1, as a run that evaluated there gives it
    (they gave the last evaluation's, or none)."""
    stop = [*TINY, "train.max_steps=8", "train.time_limit_min=0", "train.sample_tokens=0"]
    train(config(*stop, "train.eval_interval=1"), tmp_path / "evaluated")
    capsys.readouterr()
    summary = train(config(*stop, "train.eval_interval=4"), tmp_path / "stopped")
    want = torch.load(tmp_path / "evaluated" / "ckpt.pt", weights_only=True)["val_loss"]
    got = torch.load(tmp_path / "stopped" / "ckpt.pt", weights_only=True)["val_loss"]
    assert got is not None and got == pytest.approx(want, abs=1e-6) and summary["val_loss"] == got
    assert f"val loss {got:.4f} (ppl {math.exp(got):.1f}) at step 1," in capsys.readouterr().out
    assert metrics(tmp_path / "stopped")[-1]["val_loss"] == pytest.approx(got, abs=1e-5)  # logged as it is saved


def test_a_resume_keeps_the_data_position_the_val_loss_and_the_wandb_id(tmp_path, shakespeare_dir, capsys):
    """metrics.jsonl's tokens count the rows read, also after a resume with another batch size; a run resumed at its
    last step reports its saved validation loss; a resume that logs without wandb keeps the run's wandb id for a later
    one that logs with it."""
    out = tmp_path / "run"
    train(config(*TINY, "train.max_steps=4", "train.time_limit_min=0", "train.log_interval=1"), out)  # stops at 1
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "wandb_id": "abc123"}, out / "ckpt.pt")
    summary = train(
        config(*TINY, "train.max_steps=4", "train.batch_size=4", "train.resume=true", "train.log_interval=1"), out
    )
    assert [m["tokens"] for m in metrics(out)] == [8 * 32, 8 * 32 + 4 * 32, 8 * 32 + 8 * 32, 8 * 32 + 12 * 32]
    assert torch.load(out / "ckpt.pt", weights_only=True)["wandb_id"] == "abc123"
    capsys.readouterr()
    again = train(config(*TINY, "train.max_steps=4", "train.batch_size=4", "train.resume=true"), out)
    assert again["val_loss"] == pytest.approx(summary["val_loss"]) and "val loss " in capsys.readouterr().out


def test_muon_trains(tmp_path, shakespeare_dir):
    cfg = config(*TINY, "optim=muon", "train.max_steps=30", "train.warmup_steps=5", "train.eval_interval=30")
    summary = train(cfg, tmp_path)
    assert summary["val_loss"] < metrics(tmp_path)[0]["train_loss"] - 1.0
    assert len(torch.load(tmp_path / "ckpt.pt", weights_only=True)["optimizer"]) == 2


class RandomRows:
    """Stands in for a RowSampler: random token rows."""

    def batch(self, start, n, device):
        g = torch.Generator().manual_seed(start)
        x = torch.randint(0, 97, (n, 17), generator=g)
        return x[:, :-1].to(device), x[:, 1:].to(device)

    def positions(self, start, n, device):
        return None  # text: positions 0..T-1, as a RowSampler gives them


def test_each_compiled_run_of_an_in_process_sweep_compiles_afresh(monkeypatch, tmp_path, shakespeare_dir):
    """`python train.py -m positional=...` runs its jobs in one process, and torch.compile's recompile limit is per
    code object, shared by every model instance: a later scheme's graphs pass it unless each run starts from a fresh
    cache, and then run eagerly (or fail, as the tests ask). Here the limit is 2, a run's training and no-grad
    evaluation graphs, so the second scheme passes it at once; Dynamo's eager backend keeps the compiles fast."""
    from torch._dynamo.utils import counters

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, backend="eager", **kw))
    with torch._dynamo.config.patch(recompile_limit=2):
        for name in ("rope", "alibi"):
            counters.clear()
            train(config(*TINY, "train.max_steps=1", "compile=true", f"positional={name}"), tmp_path / name)
            assert counters["stats"]["unique_graphs"] > 0, f"{name} compiled nothing"


def test_fp16_scales_the_loss_so_small_gradients_survive():
    """Under fp16 autocast the backward matmuls run in fp16, where gradients below 6e-8 flush to zero: a small
    loss then trains nothing. train.py's GradScaler scales the loss up first and the gradients back down."""
    from types import SimpleNamespace

    from train import train_step

    rt = runtime.Runtime(torch.device("cpu"), torch.float16)
    tr = SimpleNamespace(batch_size=2, grad_clip=1.0, parallel="ddp")

    def moved(scaler) -> bool:
        model = random_model("rope").train()
        before = [p.detach().clone() for p in model.parameters()]
        opts = [torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)]
        small_loss = lambda x, y, pos=None: model(x, y, pos=pos) * 1e-7  # gradients ~1e-9: below fp16 subnormals
        loss, _ = train_step(small_loss, model, opts, RandomRows(), 0, 1, tr, rt, scaler)
        assert math.isfinite(loss)
        return any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))

    assert not moved(torch.amp.GradScaler("cpu", enabled=False))  # the defect: fp16 without a scaler
    scaler = grad_scaler(rt)
    assert scaler.is_enabled() and moved(scaler)


def test_train_step_returns_the_gradient_norm_before_clipping():
    from types import SimpleNamespace

    from train import train_step

    rt = runtime.Runtime(torch.device("cpu"), torch.float32)
    model, rows = random_model("rope").train(), RandomRows()
    model(*rows.batch(0, 2, "cpu")).backward()
    want = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    model.zero_grad()
    opts = [torch.optim.SGD(model.parameters(), lr=0.0)]
    tr = SimpleNamespace(batch_size=2, grad_clip=1e-3, parallel="ddp")
    loss, norm = train_step(model, model, opts, rows, 0, 1, tr, rt, grad_scaler(rt))
    assert want > 1e-3 and norm == pytest.approx(want, rel=1e-4)


def test_fp16_run_saves_and_resumes_its_scaler(tmp_path, shakespeare_dir):
    cfg = config(*TINY, "dtype=fp16", "train.max_steps=3", "train.warmup_steps=1")
    assert math.isfinite(train(cfg, tmp_path)["train_loss"])
    scale = torch.load(tmp_path / "ckpt.pt", weights_only=True)["scaler"]["scale"]
    assert scale > 0
    summary = train(config(*TINY, "dtype=fp16", "train.max_steps=4", "train.resume=true"), tmp_path)
    assert summary["step"] == 4 and math.isfinite(summary["train_loss"])
    assert not grad_scaler(runtime.Runtime(torch.device("cpu"), torch.float32)).is_enabled()


def start_training(out_dir, *extra):
    args = [sys.executable, "train.py", *TINY, "train.max_steps=40", f"out_dir={out_dir}", *extra]
    return subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_sigterm_saves_and_resume_continues_the_same_loss_curve(tmp_path, shakespeare_dir):
    """A run stopped by SIGTERM saves, says where its checkpoint is and prints the command that resumes it; that
    command continues the same loss curve. While the run holds its out_dir, a second run into it is refused with the
    holder's pid. (The closing lines and the lock fail on the code before: neither existed.)"""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    run("train.py", *TINY, "train.max_steps=40", f"out_dir={straight}", check=True)
    proc = start_training(stopped)
    for line in proc.stdout:  # let it run a few steps, then ask it to stop as a scheduler would
        if line.startswith("step 5/"):
            proc.send_signal(signal.SIGSTOP)  # held still while a second run tries the same out_dir
            second = run("train.py", *TINY, "train.max_steps=40", f"out_dir={stopped}", "train.overwrite=true")
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            break
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    one_line_error(second, f"out_dir={stopped} is in use by another run (pid {proc.pid}); ")
    saved = torch.load(stopped / "ckpt.pt", weights_only=True)["step"]
    assert 5 <= saved < 40 and "SIGTERM: saving a checkpoint" in out
    assert f"metrics {stopped}/metrics.jsonl; checkpoint {stopped}/ckpt.pt (step {saved})\n" in out
    said = out.strip().splitlines()[-1]
    assert said.startswith(f"stopped by SIGTERM at step {saved}/40, as asked (exit status 0); resume: python train.py ")
    command = shlex.split(said.split("resume: ")[1])
    assert command[-2:] == ["train.resume=true", f"out_dir={stopped}"] and not (stopped / ".lock").exists()
    run(*command[1:], check=True)
    a, b = metrics(straight), metrics(stopped)
    assert [m["step"] for m in b] == list(range(1, 41))  # nothing logged twice after the resume
    for x, y in zip(a, b, strict=True):
        assert x["train_loss"] == pytest.approx(y["train_loss"], abs=1e-5), x["step"]


def test_sink_options_train_save_and_resume_on_the_same_loss_curve(tmp_path, shakespeare_dir):
    """model.qk_norm=learned, model.sink_logit=true and data.bos_aligned=true: the gains and sink logits learn and
    are saved, and a resumed run reads the same BOS-aligned rows, so it continues the same loss curve."""
    opts = [*TINY, "model.qk_norm=learned", "model.sink_logit=true", "data.bos_aligned=true"]
    opts += ["train.schedule=constant", "train.warmup_steps=1", "train.eval_interval=100"]
    train(config(*opts, "train.max_steps=6"), tmp_path / "straight")
    train(config(*opts, "train.max_steps=3"), tmp_path / "stopped")
    train(config(*opts, "train.max_steps=6", "train.resume=true"), tmp_path / "stopped")
    a, b = metrics(tmp_path / "straight"), metrics(tmp_path / "stopped")
    assert [m["step"] for m in b] == list(range(1, 7))
    for x, y in zip(a, b, strict=True):
        assert x["train_loss"] == pytest.approx(y["train_loss"], abs=1e-5), x["step"]
    state = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=True)["model"]
    assert not torch.equal(state["blocks.0.attn.q_gain"], torch.ones(4, 8))
    assert not torch.equal(state["blocks.1.attn.sink"], torch.zeros(4))


def test_diverging_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, shakespeare_dir):
    proc = run(
        "train.py",
        *TINY,
        "optim=adamw",  # every parameter at this lr; Muon's would only move the matrices, which the softcap bounds
        "optim.lr=1e30",
        "train.warmup_steps=1",
        "train.ckpt_interval=1",
        "train.max_steps=50",
        f"out_dir={tmp_path}",
    )
    assert proc.returncode == 2
    one_line_error(proc, "last good checkpoint")
    failed_at = int(proc.stderr.split(" at step ")[1].split(";")[0])
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)  # it must exist: saved before the loss went bad
    assert ckpt["step"] < failed_at and all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_resume_takes_a_new_lr(trained, tmp_path):
    """The advice of a diverged run, 'lower optim.lr', works: a resumed run uses this run's optim.lr, not the
    checkpoint's (the optimizer's moments come from the checkpoint, its hyperparameters from the config)."""
    shutil.copy(trained / "ckpt.pt", tmp_path / "ckpt.pt")
    train(config(*TINY, "optim.lr=1e-3", "train.max_steps=8", "train.warmup_steps=8", "train.resume=true"), tmp_path)
    assert metrics(tmp_path)[-1]["lr"] == pytest.approx(1e-3 * 8 / 8)  # the last step of an 8-step warmup


def test_diverging_resume_leaves_the_checkpoint_as_it_was(trained, tmp_path):
    """A run that diverges before its next save must neither rewrite nor remove the checkpoint it started from."""
    shutil.copy(trained / "ckpt.pt", tmp_path / "ckpt.pt")
    before = (tmp_path / "ckpt.pt").read_bytes()
    proc = run(
        "train.py",
        *TINY,
        "optim.lr=1e30",
        "train.max_steps=50",
        "train.ckpt_interval=1000",
        "train.resume=true",
        f"out_dir={tmp_path}",
    )
    assert proc.returncode == 2
    one_line_error(proc, "last good checkpoint", str(tmp_path))
    assert (tmp_path / "ckpt.pt").read_bytes() == before


def one_line_error(proc, *needles):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["data=text", "data.path=/no/such/file.txt"], ["matches no files"]),
        (["data=text"], ["data.path"]),
        (["positional=learned", "positional.max_positions=16"], ["covers 16 positions", "relative scheme"]),
        (["model.n_head=5"], ["does not divide model.d_model"]),
        (["model.n_kv_head=3"], ["does not divide model.n_head"]),
        (["train.total_batch_size=1000"], ["not a multiple"]),
        (["device=cuda"], ["no CUDA GPU"]),
    ],
)
def test_bad_input_gets_one_clear_line(overrides, needles, tmp_path):
    one_line_error(run("train.py", *TINY, f"out_dir={tmp_path}", *overrides), *needles)
    assert not (tmp_path / "ckpt.pt").exists()


def test_non_utf8_text(tmp_path):
    (tmp_path / "a.txt").write_bytes("na\u00efve".encode("latin-1"))
    proc = run(
        "train.py",
        *TINY,
        f"out_dir={tmp_path / 'out'}",
        "data=text",
        f"data.path={tmp_path}/a.txt",
        f"data.cache_dir={tmp_path / 'cache'}",
    )
    one_line_error(proc, "is not UTF-8")


def test_unknown_scheme_and_option_list_the_choices(tmp_path):
    proc = run("train.py", "positional=xpoz", f"out_dir={tmp_path}")
    assert proc.returncode == 2 and "positional=xpoz is not one of" in proc.stderr
    assert all(name in proc.stderr for name in ["alibi", "learned", "nope", "rope", "sink", "sinusoidal"])
    proc = run("train.py", "train.max_stepz=3", f"out_dir={tmp_path}")
    assert proc.returncode == 2 and "train.max_stepz is not an option of train" in proc.stderr
    assert "(train.max_steps?)" in proc.stderr  # the nearest key, not a + that would add one the run ignores


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    train(config(*TINY, "train.max_steps=3"), out)
    return out


def test_resume_refuses_another_row_order(trained, tmp_path):
    """data.bos_aligned picks other training rows: resuming with it flipped would silently read other data."""
    shutil.copy(trained / "ckpt.pt", tmp_path / "ckpt.pt")
    one_line_error(
        run("train.py", *TINY, f"out_dir={tmp_path}", "train.resume=true", "data.bos_aligned=true"),
        "data.bos_aligned=true does not match this run's checkpoint",
        "resume with data.bos_aligned=false",
    )


def test_resume_refuses_other_documents(trained, tmp_path):
    """A run resumed with other data settings (data.tasks, the held-out plays) would go on training on other documents:
    refused, naming the setting and the value the checkpoint was trained with."""
    ckpt = torch.load(trained / "ckpt.pt", weights_only=True)
    ckpt["data"]["val_works"] = 3  # as if trained with data.val_works=3
    torch.save(ckpt, tmp_path / "ckpt.pt")
    refusal = r"data.val_works=\[hamlet, .*\] does not match .* trained with 3; resume with data.val_works=3"
    with pytest.raises(UserError, match=refusal):
        train(config(*TINY, "train.max_steps=4", "train.resume=true"), tmp_path)


def test_a_checkpoint_from_before_the_attention_options_resumes(trained, tmp_path):
    """Checkpoints written before model.qk_norm, model.sink_logit and data.bos_aligned existed were trained with
    their defaults, and resume."""
    ckpt = torch.load(trained / "ckpt.pt", weights_only=True)
    del ckpt["bos_aligned"], ckpt["model_config"]["qk_norm"], ckpt["model_config"]["sink_logit"], ckpt["data"]
    torch.save(ckpt, tmp_path / "ckpt.pt")
    train(config(*TINY, "train.max_steps=4", "train.resume=true"), tmp_path)
    assert metrics(tmp_path)[-1]["step"] == 4


def test_existing_checkpoint_is_never_overwritten_by_accident(trained):
    before = (trained / "ckpt.pt").read_bytes()
    one_line_error(run("train.py", *TINY, f"out_dir={trained}"), "train.resume=true", "train.overwrite=true")
    one_line_error(
        run("train.py", *TINY, f"out_dir={trained}", "train.resume=true", "model.d_model=64"),
        "model.d_model=64 does not match this run's checkpoint",
        "trained with 32; resume with model.d_model=32",
    )
    assert (trained / "ckpt.pt").read_bytes() == before


def test_corrupt_checkpoint_on_resume(tmp_path):
    (tmp_path / "ckpt.pt").write_bytes(b"PK\x03\x04 not really a checkpoint")
    proc = run("train.py", *TINY, f"out_dir={tmp_path}", "train.resume=true")
    one_line_error(proc, "corrupt or truncated")
    assert (tmp_path / "ckpt.pt").read_bytes() == b"PK\x03\x04 not really a checkpoint"


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    from utils import checkpoint

    checkpoint.save(tmp_path / "ckpt.pt", {"model": {"w": torch.ones(2)}})
    good = (tmp_path / "ckpt.pt").read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path / "ckpt.pt", {"model": {"w": torch.zeros(2)}})
    assert (tmp_path / "ckpt.pt").read_bytes() == good and os.listdir(tmp_path) == ["ckpt.pt"]


def test_eval_and_sample_read_only_the_weights(tmp_path):
    """checkpoint.load_model (eval.py, sample.py) maps the file: the optimizer state is never read from disk.
    Bytes read through system calls (rchar) show it; a full load, for contrast, reads them all."""
    from pathlib import Path

    from utils import checkpoint

    proc_io = Path("/proc/self/io")
    if not proc_io.exists():
        pytest.skip("needs Linux's /proc/self/io")

    def bytes_read():
        return int(re.search(r"rchar: (\d+)", proc_io.read_text()).group(1))

    model = random_model("rope")
    moments = torch.ones(2**23)  # 32 MiB of optimizer state
    checkpoint.save(tmp_path / "ckpt.pt", checkpoint_state(model, optimizer=[{"state": {0: {"exp_avg": moments}}}]))
    before = bytes_read()
    loaded, ckpt = checkpoint.load_model(tmp_path)
    assert bytes_read() - before < 2**22  # well under the 32 MiB of moments
    for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    before = bytes_read()
    assert torch.equal(checkpoint.load(tmp_path)["optimizer"][0]["state"][0]["exp_avg"], moments)
    assert bytes_read() - before > 2**25


def test_wandb_runs_offline_without_a_key(tmp_path, shakespeare_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path)  # no ~/.netrc, no cached login
    args = [sys.executable, "train.py", *TINY, "train.max_steps=3", "logger.wandb=true", f"out_dir={tmp_path / 'run'}"]
    t0 = time.time()
    proc = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "an offline wandb run with its data file"
    assert f"; wandb {runs[0]} (offline: wandb sync {runs[0]})\n" in proc.stdout  # the closing lines say where
    assert time.time() - t0 < 200


def test_ddp_two_processes_end_with_identical_weights(tmp_path, shakespeare_dir):
    proc = run(
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_port=29517",
        "train.py",
        *TINY,
        "train.max_steps=6",
        f"out_dir={tmp_path}",
        timeout=300,
        check=True,
    )
    assert "weights identical on 2 ranks" in proc.stdout
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["rows"] == 6 * 2 * 8  # each rank read its own batch of 8 every step


def test_sweep_runs_every_scheme_in_its_own_dir(tmp_path, shakespeare_dir):
    proc = run(
        "train.py",
        "-m",
        "positional=learned,sinusoidal,alibi,rope,nope,sink",
        *TINY,
        "train.max_steps=2",
        f"hydra.sweep.dir={tmp_path}",
        timeout=600,
        check=True,
    )
    dirs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert dirs == ["0-learned", "1-sinusoidal", "2-alibi", "3-rope", "4-nope", "5-sink"], proc.stdout[-500:]
    for d in dirs:
        assert (tmp_path / d / "ckpt.pt").exists() and len(metrics(tmp_path / d)) == 2
        assert f"next: python eval.py checkpoint={tmp_path / d}\n" in proc.stdout
    said = proc.stdout.strip().splitlines()[-1]  # the sweep's end: where it is and what compares its runs
    assert said == f"sweep: 6 runs in {tmp_path}; compare them: python eval.py sweep_dir={tmp_path}"


def test_default_out_dir_is_out_scheme(tmp_path, shakespeare_dir):
    """Without out_dir a run lands in ./out/<scheme>, a sweep in multirun/<time>/<n>-<scheme>."""
    script = str(ROOT / "train.py")
    proc = subprocess.run(
        [sys.executable, script, *TINY, "positional=alibi", "train.max_steps=2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "alibi" / "ckpt.pt").exists() and (tmp_path / "out" / "alibi" / "metrics.jsonl").exists()
    assert torch.load(tmp_path / "out" / "alibi" / "ckpt.pt", weights_only=True)["config"]["out_dir"].endswith(
        "/out/alibi"
    )
    proc = subprocess.run(
        [sys.executable, script, "-m", "positional=rope,nope", *TINY, "train.max_steps=2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "multirun").glob("*/*") if (p / "ckpt.pt").exists()) == [
        "0-rope",
        "1-nope",
    ]


def test_prepare_ahead_of_time(tmp_path):
    (tmp_path / "a.txt").write_text("Some text to prepare.\n" * 200)
    proc = run(
        "-m",
        "data.prepare",
        "data=text",
        f"data.path={tmp_path}/a.txt",
        f"data.cache_dir={tmp_path}/c",
        "tokenizer.vocab_size=300",
        check=True,
    )
    assert (
        len(list((tmp_path / "c").glob("text-*/bpe300/meta.json"))) == 1
        and "bpe300" in proc.stdout.strip().splitlines()[-1]
    )


def test_fsdp_matches_ddp_and_resumes(tmp_path, shakespeare_dir):
    """FSDP2 shards parameters, gradients and optimizer state, yet trains the same model as DDP; its checkpoint
    holds whole weights and resumes on the same loss curve. 3 validation batches over 2 ranks: no deadlock."""
    launch = [
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_port=29518",
        "train.py",
        *TINY,
        "optim=adamw",  # Muon orthogonalizes whole matrices, which FSDP shards (refused below)
        "train.max_steps=6",
        "train.eval_interval=3",
        "train.eval_batches=3",
    ]
    run(*launch, f"out_dir={tmp_path / 'ddp'}", timeout=300, check=True)
    run(*launch, "train.parallel=fsdp", f"out_dir={tmp_path / 'fsdp'}", timeout=300, check=True)
    ddp = torch.load(tmp_path / "ddp" / "ckpt.pt", weights_only=True)
    fsdp = torch.load(tmp_path / "fsdp" / "ckpt.pt", weights_only=True)
    assert fsdp["optimizer_format"] == "fsdp" and ddp["model"].keys() == fsdp["model"].keys()
    for name, w in ddp["model"].items():
        assert torch.allclose(w, fsdp["model"][name], atol=1e-4), name
    stopped = tmp_path / "stopped"  # a time limit of 0 minutes stops (and saves) after the first step
    run(*launch, "train.parallel=fsdp", "train.time_limit_min=0", f"out_dir={stopped}", timeout=300, check=True)
    assert torch.load(stopped / "ckpt.pt", weights_only=True)["step"] == 1
    run(*launch, "train.parallel=fsdp", f"out_dir={stopped}", "train.resume=true", timeout=300, check=True)
    a, b = metrics(tmp_path / "fsdp"), metrics(stopped)
    assert [m["step"] for m in b] == [m["step"] for m in a]
    for x, y in zip(a, b, strict=True):  # the stopped run also measured its step 1, the step it saved
        assert x["train_loss"] == pytest.approx(y["train_loss"], abs=1e-4)
        assert "val_loss" not in x or x["val_loss"] == pytest.approx(y["val_loss"], abs=1e-4)
    assert "val_loss" in b[0] and "val_loss" not in a[0]
    proc = run("train.py", *TINY, "train.parallel=fsdp", "optim=muon", f"out_dir={tmp_path / 'x'}")
    assert proc.returncode == 2 and "use train.parallel=ddp" in proc.stderr


def test_total_batch_size_is_the_same_step_on_one_or_two_processes(tmp_path, shakespeare_dir):
    """train.total_batch_size fixes the global batch: one process accumulates two micro-batches where two
    processes take one each, over the same rows, so both end with the same weights."""
    fixed = ["train.total_batch_size=512", "train.max_steps=3"]  # 2 x 8 sequences x 32 tokens
    one = run("train.py", *TINY, *fixed, f"out_dir={tmp_path / 'one'}", check=True)
    two = run(
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_port=29519",
        "train.py",
        *TINY,
        *fixed,
        f"out_dir={tmp_path / 'two'}",
        timeout=300,
        check=True,
    )
    assert "2 x 8 x 1 sequences per step" in one.stdout and "1 x 8 x 2 sequences per step" in two.stdout
    a = torch.load(tmp_path / "one" / "ckpt.pt", weights_only=True)
    b = torch.load(tmp_path / "two" / "ckpt.pt", weights_only=True)
    assert a["rows"] == b["rows"] == 3 * 16
    for name, w in a["model"].items():
        assert torch.allclose(w, b["model"][name], atol=1e-4), name


def test_gpt2_tokenizer_offline_fails_fast(tmp_path):
    import socket

    try:
        socket.create_connection(("openaipublic.blob.core.windows.net", 443), timeout=3).close()
        pytest.skip("the network is reachable here, so tiktoken would download its files")
    except OSError:
        pass
    t0 = time.time()
    proc = run("train.py", *TINY, "tokenizer=gpt2", f"out_dir={tmp_path}", env={"TIKTOKEN_CACHE_DIR": str(tmp_path)})
    one_line_error(proc, "tokenizer=gpt2 needs tiktoken's files")
    assert time.time() - t0 < 60


def test_sink_preset_logs_the_saved_models_first_token_attention(tmp_path, shakespeare_dir):
    """experiment=sinks sets its recipe over the defaults, and train.sink_metric logs, at each eval, what
    evaluation/sink_mass.py measures on the same held-out rows with the model as saved at that step."""
    from data.loader import RowSampler, TokenSplit
    from evaluation.sink_mass import rows_first_token_attention

    cfg = config("experiment=sinks", *TINY, "train.max_steps=3", "train.eval_interval=3", "train.warmup_steps=1")
    assert cfg.positional.name == "sink" and cfg.model.qk_norm == "none" and cfg.data.bos_aligned
    train(cfg, tmp_path)
    logged = metrics(tmp_path)[-1]
    model, _ = checkpoint.load_model(tmp_path, torch.device("cpu"))
    split = TokenSplit(shakespeare_dir, "val")
    x, _ = RowSampler(split, 32, 0, bos_aligned=True).batch(0, 16)  # rows that open as the training rows did
    assert (x[:, 0] == split.bos).all()
    want = rows_first_token_attention(model.eval(), x)
    assert logged["first_token_max"] == want["max_head"] and logged["sink_share"] == want["sink_share_all"]
    assert logged["first_token_uniform"] == want["uniform"] and len(want["max_head"]) == 2
    assert "nothing_max" not in logged  # no nothing slot in this model


def test_sink_metric_logs_the_nothing_slots_share(tmp_path, shakespeare_dir, capsys):
    """With model.sink_logit=true, train.sink_metric also logs each layer's largest share of attention spent on
    nothing, from the same rows as the first-token share."""
    from data.loader import RowSampler, TokenSplit
    from evaluation.sink_mass import nothing_cost, rows_first_token_attention

    cfg = config(
        "positional=rope",
        "model.sink_logit=true",
        "train.sink_metric=true",
        *TINY,
        "train.max_steps=3",
        "train.eval_interval=3",
        "train.warmup_steps=1",
    )
    train(cfg, tmp_path)
    logged = metrics(tmp_path)[-1]
    model, _ = checkpoint.load_model(tmp_path, torch.device("cpu"))
    x, y = RowSampler(TokenSplit(shakespeare_dir, "val"), 32, 0).batch(0, 16)
    want = rows_first_token_attention(model.eval(), x)
    assert logged["nothing_max"] == want["nothing_max_head"] and logged["nothing_share"] == want["nothing_share_all"]
    assert logged["nothing_cost"] == round(nothing_cost(model, x, y), 5)
    assert all(0 < m < 1 for m in logged["nothing_max"])
    summary = (  # what the progress line shows of them, between the losses and the learning rate
        f"sink heads {logged['sink_share']:.2f} first-token max {max(logged['first_token_max']):.3f} "
        f"nothing max {max(logged['nothing_max']):.3f} cost {logged['nothing_cost']:.4f} lr "
    )
    assert re.search(rf"\nstep 3/3 loss [\d.]+ val [\d.]+ {re.escape(summary)}", capsys.readouterr().out)


def test_a_probe_attached_from_outside_logs_at_each_evaluation(tmp_path, shakespeare_dir, capsys):
    """train(probes=[...]): a probe gets the model and held-out rows at each evaluation, and what it returns goes
    into metrics.jsonl beside the validation loss and onto the progress line."""
    from data.loader import RowSampler, TokenSplit

    @torch.no_grad()
    def held_out_loss(model, rows, rt):
        x, y = rows.batch(0, 4, rt.device)
        return {"probe_loss": round(model(x, y).item(), 5)}

    cfg = config(*TINY, "train.max_steps=4", "train.eval_interval=2", "train.warmup_steps=1")
    train(cfg, tmp_path, probes=[held_out_loss])
    logged = metrics(tmp_path)
    assert [m["step"] for m in logged] == [1, 2, 3, 4]
    assert [m["step"] for m in logged if "probe_loss" in m] == [m["step"] for m in logged if "val_loss" in m] == [2, 4]
    model, _ = checkpoint.load_model(tmp_path)  # the model as saved at step 4, on the same held-out rows
    x, y = RowSampler(TokenSplit(shakespeare_dir, "val"), 32, 0).batch(0, 4)
    assert logged[-1]["probe_loss"] == pytest.approx(model(x, y).item(), abs=1e-5)
    assert re.search(rf" val [\d.]+ probe_loss {logged[-1]['probe_loss']:.4g} lr ", capsys.readouterr().out)


def test_the_final_sample_is_decoded_from_the_last_saved_weights(tmp_path, shakespeare_dir, capsys):
    """The checkpoint holds the weights of the last step, and the sample printed at the end is theirs, not an
    earlier save's: a probe records the model at every evaluation, and the last two steps' weights sample apart."""
    from train import print_sample

    seen = []

    def record(model, rows, rt):
        seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return {}

    opts = ["train.max_steps=3", "train.eval_interval=1", "train.ckpt_interval=2", "train.warmup_steps=1"]
    opts += ["train.sample_tokens=24"]  # a save at step 2, then the last one at step 3
    train(config(*TINY, *opts), tmp_path, probes=[record])
    printed = sample_text(capsys.readouterr().out)
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == len(seen) == 3 and ckpt["model"].keys() == seen[-1].keys()
    assert all(torch.equal(ckpt["model"][k], w) for k, w in seen[-1].items())

    def sample(state) -> str:
        model = checkpoint.build_model(ckpt["model_config"])
        model.load_state_dict(state)
        print_sample(model.eval(), ckpt["tokenizer"], 24, runtime.Runtime(torch.device("cpu"), torch.float32))
        return sample_text(capsys.readouterr().out)

    assert printed == sample(seen[-1]) != sample(seen[-2])


def sample_text(out: str) -> str:
    """The text between the sample's opening and closing rules (the closing lines of a run follow it)."""
    return out.split("--- sample ---\n")[1].split("\n--------------\n")[0]


@pytest.mark.parametrize("data", ["shakespeare", "text", "fineweb_edu", "grids", "passkey", "tasks"])
def test_the_next_command_scores_a_run_in_its_data_s_own_eval_mode(data):
    """A run's closing line (and a sweep's) names eval.py's mode for its data: each generated source its own (the
    source's class says which), the corpora none, perplexity by length."""
    cfg = config(f"data={data}", "out_dir=x")
    own = {"grids": ["eval.mode=grids"], "passkey": ["eval.mode=passkey"], "tasks": ["eval.mode=tasks"]}
    assert eval_mode(cfg.data) == own.get(data, [])
