"""Checkpoints: written atomically, read with a clear message when missing, corrupt or from another run.

python eval.py checkpoint=out/rope      python sample.py checkpoint=out/rope
ckpt.pt holds the weights, the model's dataclass, the resolved run config, the tokenizer itself, the
optimizer state, the step and the data position. Eval and sampling need nothing but this file (and the
prepared data folder it names, for evaluation), and read only its weights (the file is memory-mapped).
A write goes to .ckpt.pt.tmp<pid> and is renamed over ckpt.pt once whole: a process killed midway (kill -9, a lost
node) leaves the old checkpoint loadable and its temp file behind, which the next save removes.
"""

import os
import pickle
import re
import zipfile
from contextlib import suppress
from pathlib import Path

import torch

from model.gpt import GPT, GPTConfig
from utils.errors import UserError

VERSION = 1
NAME = "ckpt.pt"


def checkpoint_path(path) -> Path:
    path = Path(path)
    return path / NAME if path.is_dir() or path.suffix != ".pt" else path


def save(path, state: dict):
    """Write to a temporary file in the same folder, fsync, then rename: the old file survives any crash. A write
    that fails (a full disk) removes its temp file and raises one OSError naming the checkpoint; torch's own error
    about the half-written archive, which would follow it, is dropped."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({"version": VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        cause = os_error(e)
        if cause is None:
            raise
        raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from None
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def os_error(e: BaseException) -> OSError | None:
    """The OSError behind e (itself, or the one it was raised in handling of), if any."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


def remove_stale_temps(path):
    """Remove the temp files that saves of this checkpoint left when killed midway: only ours (.<name>.tmp<pid>),
    and only where that process is gone (a pid reused since keeps its file: a leftover, never a loss)."""
    path = Path(path)
    ours = re.compile(rf"\.{re.escape(path.name)}\.tmp(\d+)")
    for tmp in path.parent.glob(f".{path.name}.tmp*"):
        found = ours.fullmatch(tmp.name)
        if found and not alive(int(found.group(1))):
            with suppress(FileNotFoundError):  # another process may clean up at the same time
                tmp.unlink()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: no signal, only the check
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def load(path, map_location="cpu", mmap: bool = False) -> dict:
    """The checkpoint dict. mmap=True maps the file rather than reading it, so only the tensors that are used
    come off the disk: eval and sampling read the weights, never the optimizer state (any checkpoint)."""
    path = checkpoint_path(path)
    if not path.exists():
        raise UserError(f"no checkpoint at {path}; train one first (python train.py out_dir={path.parent})")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as e:
        raise UserError(
            f"checkpoint {path} is corrupt or truncated ({type(e).__name__}); restore a good copy "
            f"or train again into a new out_dir"
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("version") != VERSION or "model" not in ckpt:
        raise UserError(f"{path} is not a nanopos checkpoint (version {VERSION}); train again with this version")
    return ckpt


def build_model(model_config: dict) -> GPT:
    try:
        return GPT(GPTConfig(**model_config))
    except (ValueError, TypeError) as e:
        raise UserError(f"bad model config: {e}") from None


def load_model(path, device="cpu"):
    """(model in eval mode on device, checkpoint dict) from a checkpoint file or the run folder holding it; the
    file is mapped, and only the model's weights are read from it."""
    ckpt = load(path, mmap=True)
    model = build_model(ckpt["model_config"])
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise UserError(f"checkpoint {checkpoint_path(path)} does not match its own model config ({e})") from None
    return model.to(device).eval(), ckpt
