"""Checkpoints: written atomically, read with a clear message when missing, corrupt or from another run.

python eval.py checkpoint=out/rope      python sample.py checkpoint=out/rope
ckpt.pt holds the weights, the model's dataclass, the resolved run config, the tokenizer itself, the
optimizer state, the step and the data position. Eval and sampling need nothing but this file (and the
prepared data folder it names, for evaluation), and read only its weights (the file is memory-mapped).
A write goes to .ckpt.pt.tmp<pid>.pt and is renamed over ckpt.pt once whole: a process killed midway (kill -9, a lost
node) leaves the old checkpoint loadable and its temp file behind, which the next save removes.
"""

import pickle
import zipfile
from pathlib import Path

import torch

from model.gpt import GPT, GPTConfig
from utils.errors import UserError
from utils.files import remove_stale_temps, replacing, shape_problem  # noqa: F401  (train.py: remove_stale_temps)

VERSION = 1
NAME = "ckpt.pt"


def checkpoint_path(path) -> Path:
    path = Path(path)
    return path / NAME if path.is_dir() or path.suffix != ".pt" else path


def save(path, state: dict):
    """Write to a temporary file in the same folder, fsync, then rename (utils/files.py replacing): the old file
    survives any crash. A write that fails (a full disk) removes its temp file and raises one OSError naming the
    checkpoint; torch's own error about the half-written archive, which would follow it, is dropped."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        torch.save({"version": VERSION, **state}, f)


REQUIRED = ("model", "model_config", "tokenizer", "seq_len")  # what every entry point reads of a checkpoint
# what readers take from a checkpoint (train.py writes more), with the type each must have where it is present; another
# key absent is named by the reader that reads it (Checkpoint): a checkpoint stripped of its optimizer still evaluates
TYPES = {
    "model": dict,
    "model_config": dict,
    "config": dict,
    "tokenizer": dict,
    "seq_len": int,
    "step": int,
    "rows": int,
    "optimizer": list,
    "data_dir": str,
}
CONFIG = {"data": dict, "tokenizer": dict}  # what the readers take from its run config
POSITIONAL = {"positional": dict}  # what they take from model_config, besides what GPTConfig takes
FIX = "restore a good copy, or train again into a new out_dir"


class Checkpoint(dict):
    """A loaded checkpoint: a key it lacks is one line naming the file, where a reader reads it."""

    def __init__(self, values: dict, path: Path):
        super().__init__(values)
        self.path = path

    def __missing__(self, key):
        raise UserError(f"checkpoint {self.path} has no {key!r} (damaged, or not written by train.py); {FIX}")


def load(path, map_location="cpu", mmap: bool = False) -> Checkpoint:
    """The checkpoint, checked (problem()). mmap=True maps the file rather than reading it, so only the tensors that
    are used come off the disk: eval and sampling read the weights, never the optimizer state (any checkpoint)."""
    path = checkpoint_path(path)
    if not path.exists():
        raise UserError(f"no checkpoint at {path}; train one first (python train.py out_dir={path.parent})")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as e:
        raise UserError(f"checkpoint {path} is corrupt or truncated ({type(e).__name__}); {FIX}") from None
    if not isinstance(ckpt, dict) or ckpt.get("version") != VERSION or "model" not in ckpt:
        raise UserError(f"{path} is not a nanopos checkpoint (version {VERSION}); train again with this version")
    if why := problem(ckpt):
        raise UserError(f"checkpoint {path} {why}; {FIX}")
    return Checkpoint(ckpt, path)


def problem(ckpt: dict) -> str | None:
    """What is wrong with a checkpoint's content, or None: a key every reader reads missing, a value of another type
    than train.py writes, a tokenizer that is not one, a model_config that builds no model, or weights of another
    model than it describes."""
    from data.tokenizer import spec_problem

    if missing := [k for k in REQUIRED if k not in ckpt]:
        return f"has no {missing[0]!r} (damaged, or not written by train.py)"
    present = {k: t for k, t in TYPES.items() if k in ckpt}
    if why := shape_problem(ckpt, present) or "config" in ckpt and shape_problem(ckpt["config"], CONFIG, "config"):
        return why
    if why := shape_problem(ckpt["model_config"], POSITIONAL, "model_config"):
        return why
    if not all(isinstance(t, torch.Tensor) for t in ckpt["model"].values()):
        return "holds weights that are not tensors"
    if why := spec_problem(ckpt["tokenizer"]):
        return f"holds a tokenizer that {why}"
    try:
        with torch.device("meta"):  # shapes only: nothing is allocated
            model = GPT(GPTConfig(**ckpt["model_config"]))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        return f"holds a model_config that builds no model ({' '.join(str(e).split())})"
    if why := weights_problem(model, ckpt["model"]):
        return f"holds the weights of another model than its model_config ({model.pe.name}): {why}"
    return None


def weights_problem(model, state: dict, most: int = 3) -> str | None:
    """How state differs from model's own weights, in a few words: the entries missing, unexpected or of another
    shape (the first `most` of each), or None."""

    def few(names):
        return ", ".join(names[:most]) + (f" (+{len(names) - most} more)" if len(names) > most else "")

    want = model.state_dict()
    missing, unexpected = [k for k in want if k not in state], [k for k in state if k not in want]
    shapes = [
        f"{k} {list(state[k].shape)} where the model's is {list(want[k].shape)}"
        for k in want
        if k in state and state[k].shape != want[k].shape
    ]
    parts = [f"{what} {few(names)}" for what, names in (("missing", missing), ("unexpected", unexpected)) if names]
    return ", ".join(parts + shapes[:most]) or None


def build_model(model_config: dict) -> GPT:
    try:
        return GPT(GPTConfig(**model_config))
    except (ValueError, TypeError) as e:
        raise UserError(f"bad model config: {e}") from None


def load_model(path, device="cpu"):
    """(model in eval mode on device, checkpoint) from a checkpoint file or the run folder holding it; the file is
    mapped, and only the model's weights are read from it (load checked that they fit its model_config)."""
    ckpt = load(path, mmap=True)
    model = build_model(ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt
