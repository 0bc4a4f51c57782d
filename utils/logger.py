"""Metrics to out_dir/metrics.jsonl (one JSON object per logged step) and to wandb.

python train.py logger.wandb=false          (jsonl only)
wandb is online when an API key is configured (WANDB_API_KEY or a netrc entry), otherwise offline; it never
waits on a login prompt. logger.mode=online|offline|disabled forces a mode.
"""

import json
import netrc
import os
from pathlib import Path


def wandb_mode(requested: str | None) -> str:
    if requested and requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1]
        if netrc.netrc().authenticators(host):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        pass
    return "offline"


def start_wandb(project: str, out_dir, config: dict, mode=None, group=None, name=None, run_id=None, **kwargs):
    """A wandb run, or None when disabled. The mode is settled before wandb starts, so nothing prompts."""
    mode = wandb_mode(mode)
    if mode == "disabled":
        return None
    os.environ["WANDB_MODE"] = mode
    import wandb

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
    )


class Logger:
    def __init__(self, out_dir, wandb_run=None, resume_step: int | None = None):
        self.path = Path(out_dir) / "metrics.jsonl"
        if resume_step is not None and self.path.exists():  # drop steps logged after the checkpoint we resume
            kept = [ln for ln in self.path.read_text().splitlines() if ln and json.loads(ln)["step"] <= resume_step]
            self.path.write_text("".join(ln + "\n" for ln in kept))
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
