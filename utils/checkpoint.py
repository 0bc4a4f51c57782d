"""Checkpoints: written atomically, read with a clear message when missing, corrupt or from another run.

python eval.py checkpoint=out/rope      python sample.py checkpoint=out/rope
ckpt.pt holds the weights, the model's dataclass, the resolved run config, the tokenizer itself, the
optimizer state, the step and the data position. Eval and sampling need nothing but this file (and the
prepared data folder it names, for evaluation), and read only its weights (the file is memory-mapped).
"""

import os
import pickle
import zipfile
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
    """Write to a temporary file in the same folder, fsync, then rename: the old file survives any crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({"version": VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
