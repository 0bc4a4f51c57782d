"""Metrics to out_dir/metrics.jsonl (one JSON object per logged step) and to wandb.

python train.py logger.wandb=false          (jsonl only)
python train.py train.resume=true           (metrics.jsonl read back by read_log, cut at the checkpoint's step)
wandb is online when an API key is configured (WANDB_API_KEY or a netrc entry), otherwise offline; it never
waits on a login prompt. logger.mode=online|offline|disabled forces a mode; online without a key, or with a key
wandb refuses, or with no network, stops the run in one line naming logger.mode, before any step.
"""

import json
import netrc
import os
import sys
from pathlib import Path

from utils.errors import UserError
from utils.files import write_text

WANDB_HOSTS = ("api.wandb.ai",)  # where `wandb login` keeps its key, besides WANDB_BASE_URL's host


def has_key() -> bool:
    """Whether a wandb API key is configured: WANDB_API_KEY, or a netrc entry for the wandb host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    hosts = {os.environ.get("WANDB_BASE_URL", "").split("//")[-1].rstrip("/"), *WANDB_HOSTS} - {""}
    try:
        entries = netrc.netrc()
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return any(entries.authenticators(host) for host in hosts)


def wandb_mode(requested: str | None) -> str:
    if requested and requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if has_key() else "offline"


def check_mode(requested: str | None) -> str:
    """The mode wandb will run in; online with no API key is refused here (wandb would prompt, or fail later)."""
    mode = wandb_mode(requested)
    if mode == "online" and not has_key():
        raise UserError(
            f"logger.mode={requested or 'auto'} logs online, and no wandb API key is set (WANDB_API_KEY, or wandb "
            f"login); run wandb login, or pass logger.mode=offline (or logger.wandb=false)"
        )
    return mode


def start_wandb(project: str, out_dir, config: dict, mode=None, group=None, name=None, run_id=None, **kwargs):
    """A wandb run, or None when disabled. The mode is settled before wandb starts, so nothing prompts; wandb's
    refusals (no key, a wrong key, no network) are one line naming logger.mode."""
    requested, mode = mode or "auto", check_mode(mode)
    if mode == "disabled":
        return None
    os.environ["WANDB_MODE"] = mode
    import wandb

    try:
        return wandb.init(
            project=project,
            group=group,
            name=name,
            config=config,
            dir=str(out_dir),
            mode=mode,
            id=run_id,
            resume="allow" if run_id else None,
            settings=wandb.Settings(silent=True),
            **kwargs,
        )
    except wandb.errors.Error as e:  # a key wandb refuses, or a server it cannot reach
        why = " ".join(str(e).split())[:200]
        raise UserError(
            f"logger.mode={requested} could not start wandb {mode} ({type(e).__name__}: {why}); check the key "
            f"(wandb login --relogin) and the network, or pass logger.mode=offline"
        ) from None


def read_log(path) -> list[dict]:
    """The rows of a metrics.jsonl, each an object with an integer step. A last line cut short (no newline: a process
    killed while it wrote it) is dropped with a warning on stderr; any other bad line is one line naming the file and
    the line (a file edited by hand, or another file)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            row = False
        if row is None:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        elif n == len(lines) and row is False and not text.endswith("\n"):
            print(f"warning: {path}: its last line is cut short (line {n}); dropped", file=sys.stderr, flush=True)
        else:
            raise UserError(
                f"{path} line {n} is not a logged step (a JSON object with a step); delete that line, or move the "
                f"file away to start the log afresh"
            )
    return rows


class Logger:
    def __init__(self, out_dir, wandb_run=None, resume_step: int | None = None):
        self.path = Path(out_dir) / "metrics.jsonl"
        if resume_step is not None and self.path.exists():  # drop steps logged after the checkpoint we resume
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
