"""Metrics to out_dir/metrics.jsonl (one JSON object per logged step) and wandb, and the step lines train.py prints.

python train.py logger.wandb=false          (jsonl only)
python train.py train.resume=true           (metrics.jsonl cut at the checkpoint's step)
wandb is online when an API key is configured, else offline: it never waits on a login prompt.
"""

import json
import netrc
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from utils.errors import UserError
from utils.files import write_text


def has_key() -> bool:
    """Whether a wandb API key is set: WANDB_API_KEY, or a netrc entry."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    # `wandb login`'s netrc host, and WANDB_BASE_URL's
    hosts = {os.environ.get("WANDB_BASE_URL", "").split("//")[-1].rstrip("/"), "api.wandb.ai"} - {""}
    try:
        entries = netrc.netrc()
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return any(entries.authenticators(host) for host in hosts)


def check_mode(requested: str | None) -> str:
    """wandb's mode: logger.mode, else WANDB_MODE, else online with an API key and offline without; online with no
    API key is refused here (wandb would prompt, or fail later)."""
    mode = requested if requested and requested != "auto" else os.environ.get("WANDB_MODE")
    mode = mode or ("online" if has_key() else "offline")
    if mode == "online" and not has_key():
        raise UserError(
            f"logger.mode={requested or 'auto'} logs online, and no wandb API key is set (WANDB_API_KEY, or wandb "
            f"login); run wandb login, or pass logger.mode=offline (or logger.wandb=false)"
        )
    return mode


def start_wandb(project: str, out_dir, config: dict, mode=None, group=None, name=None, run_id=None, **kwargs):
    """A wandb run, or None when disabled; wandb's refusals are one line naming logger.mode."""
    requested, mode = mode or "auto", check_mode(mode)
    if mode == "disabled":
        return None
    os.environ["WANDB_MODE"] = mode
    import wandb

    run = dict(project=project, group=group, name=name, config=config, dir=str(out_dir), mode=mode, id=run_id)
    try:
        return wandb.init(**run, resume="allow" if run_id else None, settings=wandb.Settings(silent=True), **kwargs)
    except wandb.errors.Error as e:  # a refused key, or no network
        why = " ".join(str(e).split())[:200]
        raise UserError(
            f"logger.mode={requested} could not start wandb {mode} ({type(e).__name__}: {why}); check the key "
            f"(wandb login --relogin) and the network, or pass logger.mode=offline"
        ) from None


def read_log(path) -> list[dict]:
    """Rows of metrics.jsonl; a last line cut short (killed mid-write) is dropped with a warning."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    lines, rows = text.splitlines(), []
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            if n == len(lines) and not text.endswith("\n"):
                print(f"warning: {path}: its last line is cut short (line {n}); dropped", file=sys.stderr, flush=True)
                break
            row = False
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        elif row is not None:
            raise UserError(
                f"{path} line {n} is not a logged step (a JSON object with a step); delete that line, or move the "
                f"file away to start the log afresh"
            )
    return rows


class Logger:
    def __init__(self, out_dir, wandb_run=None, resume_step: int | None = None):
        self.path = Path(out_dir) / "metrics.jsonl"
        if resume_step is not None and self.path.exists():  # drop steps logged after the checkpoint
            kept = [row for row in read_log(self.path) if row["step"] <= resume_step]
            write_text(self.path, "".join(json.dumps(row) + "\n" for row in kept))
        self.file = open(self.path, "a" if resume_step is not None else "w")
        self.wandb = wandb_run

    def log(self, metrics: dict):
        self.file.write(json.dumps(metrics) + "\n")
        self.file.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in metrics.items() if k != "step"}, step=metrics["step"])

    def close(self):
        self.file.close()
        if self.wandb is not None:
            self.wandb.finish()


class Meter:
    """Speed between logs, evaluation left out: tokens/s, model FLOP/s, MFU against the bf16 datasheet peak."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak: float, step: int):
        self.tokens_per_step, self.flops_per_token, self.peak = tokens_per_step, flops_per_token, peak
        self.start, self.step = time.time(), step

    @contextmanager
    def paused(self):
        t = time.time()
        yield
        self.start += time.time() - t

    def read(self, step: int) -> dict:
        tokens_per_sec = round((step - self.step) * self.tokens_per_step / (time.time() - self.start), 1)
        flops = tokens_per_sec * self.flops_per_token  # over all processes
        self.start, self.step = time.time(), step
        mfu = round(flops / self.peak, 4) if self.peak else None
        return {"tokens_per_sec": tokens_per_sec, "tflops_per_sec": float(f"{flops / 1e12:.4g}"), "mfu": mfu}


def metrics(state, meter: Meter, elapsed: float, measured: dict | None, seq_len: int) -> dict:
    """A logged step's metrics, with val loss and probes at an evaluation. tokens: the rows read so far (the data
    position, right after a resume with another batch size or process count) times their length."""
    m = {"step": state.step, "train_loss": state.train_loss, "lr": state.lr, "grad_norm": state.grad_norm}
    m |= {**meter.read(state.step), "tokens": state.rows * seq_len, "elapsed_s": round(elapsed, 2)}
    if measured is not None:
        m.update(val_loss=state.val_loss, **measured)
    return m


DIGITS = {"train_loss": 5, "val_loss": 5, "grad_norm": 4}  # in metrics.jsonl; printed from the full value


def log(logger: Logger, m: dict, max_steps: int, probed: str = "", eta: float | None = None):
    """Log m and print its progress line (probed: what the probes show; eta: seconds left)."""
    logger.log({k: round(v, DIGITS[k]) if k in DIGITS else v for k, v in m.items()})
    val = f" val {m['val_loss']:.4f}" if "val_loss" in m else ""
    probed = f" {probed}" if probed else ""
    speed = f"lr {m['lr']:.2e} gnorm {m['grad_norm']:.3f} {m['tokens_per_sec']:.0f} tok/s"
    times = f"elapsed {clock(m['elapsed_s'])}" + (f" eta {clock(eta)}" if eta is not None else "")
    print(f"step {m['step']}/{max_steps} loss {m['train_loss']:.4f}{val}{probed} {speed} {times}")


def wandb_where(run) -> str:
    """Where a wandb run's files and page are (or how to sync it); empty without wandb."""
    if run is None:
        return ""
    folder = Path(run.dir).parent  # <out_dir>/wandb/<mode>-run-<time>-<id>
    return (
        f"; wandb {folder} (offline: wandb sync {folder})" if run.offline else f"; wandb {run.url}, files in {folder}"
    )


def clock(seconds: float) -> str:
    """h:mm:ss, or m:ss under an hour."""
    m, sec = divmod(round(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}" if m >= 60 else f"{m}:{sec:02d}"
