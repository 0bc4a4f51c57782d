"""Checkpoints and the run folder that holds one: written atomically, read with a clear message when missing, corrupt
or from another run; a folder locked while a run writes it, and a resume held to the run its checkpoint holds.

python eval.py checkpoint=out/rope      python sample.py checkpoint=out/rope
ckpt.pt holds the weights, the model's dataclass, the resolved run config, the tokenizer itself, the
optimizer state, the step and the data position. Eval and sampling need nothing but this file (and the
prepared data folder it names, for evaluation), and read only its weights (the file is memory-mapped).
A write goes to .ckpt.pt.tmp<pid>.pt and is renamed over ckpt.pt once whole: a process killed midway (kill -9, a lost
node) leaves the old checkpoint loadable and its temp file behind, which the next save removes.
"""

import os
import pickle
import shlex
import zipfile
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig

import settings
from model.gpt import GPT, GPTConfig
from utils import runtime
from utils.errors import UserError
from utils.files import remove_stale_temps, replacing, shape_problem, spec_problem, unreadable

VERSION = 1
NAME = "ckpt.pt"


def checkpoint_path(path) -> Path:
    path = Path(path)
    return path / NAME if path.is_dir() or path.suffix != ".pt" else path


def run_checkpoint(value: str) -> str | None:
    """A run folder holding ckpt.pt, or a .pt file (checkpoint_path), readable and a zip archive
    as torch.save writes one."""
    given, path = Path(value).expanduser(), checkpoint_path(Path(value).expanduser())
    if given.is_file() and given.suffix != ".pt":
        return "is a file, not a run folder or a .pt file"
    if not path.is_file():
        return f"has no checkpoint at {path}"
    if why := unreadable(path):
        return why
    return None if zipfile.is_zipfile(path) else "is corrupt or truncated (not the zip archive torch.save writes)"


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


# ---- the run folder: one run writes it at a time, and a resume continues the run its checkpoint holds ----

MATCH_KEYS = ("model_config", "tokenizer", "seq_len", "bos_aligned", "optimizer_format", "data")  # a resume shares
# options added after checkpoints were written: an older checkpoint was trained with their defaults
OLDER = {"bos_aligned": False, "model_config": {"qk_norm": "rms", "sink_logit": False, "ssmax": False}}
LOCK = ".lock"  # in out_dir while a run may write there (utils/runtime.py lock_folder)


def lock_out_dir(out_dir: Path, rt):
    """Rank 0 locks out_dir for the run: two runs writing one folder would interleave their checkpoints and metrics.
    Also removes the temp files of checkpoint writes killed midway (save). Returns the lock."""
    lock, holder = None, None
    if rt.master:
        try:
            lock = runtime.lock_folder(out_dir, LOCK)
        except runtime.FolderBusy as e:
            holder = e.pid
        except OSError as e:
            raise UserError(f"out_dir={out_dir} cannot be written ({e.strerror}); pass another out_dir") from None
    busy = runtime.any_rank(holder is not None, rt.device)
    pid = int(runtime.max_over_ranks(int(holder) if holder and holder.isdigit() else 0, rt.device))
    if busy:
        raise UserError(
            f"out_dir={out_dir} is in use by another run (pid {pid or 'unknown'}); wait for it to end, or pass "
            f"another out_dir"
        )
    if rt.master:
        remove_stale_temps(out_dir / NAME)
    return lock


def resume_command(out_dir: Path, rt) -> str:
    """The command that continues this run: the options it was given (known under Hydra), then train.resume=true."""
    given = ["..."]  # train() called from Python: its options are the caller's
    if HydraConfig.initialized():
        skip = ("out_dir", "train.resume", "train.overwrite")
        given = [shlex.quote(o) for o in HydraConfig.get().overrides.task if o.lstrip("+~").split("=")[0] not in skip]
    local = int(os.environ.get("LOCAL_WORLD_SIZE", rt.world))
    launch = ["python"] if rt.world == 1 else ["torchrun", f"--nproc_per_node={local}"]
    launch += [f"--nnodes={rt.world // local}"] if rt.world > local else []
    return " ".join([*launch, "train.py", *given, "train.resume=true", f"out_dir={shlex.quote(str(out_dir))}"])


def check_out_dir(out_dir: Path, tr):
    ckpt = out_dir / NAME
    if tr.resume and not ckpt.exists():
        raise UserError(f"train.resume=true but {out_dir} holds no {NAME}; drop train.resume to start afresh")
    if not tr.resume and ckpt.exists() and not tr.overwrite:
        raise UserError(
            f"{out_dir} already holds a checkpoint: add train.resume=true to continue it, train.overwrite=true to "
            f"start over, or out_dir=<another folder> for a run of its own"
        )


def check_resume(ckpt: dict, run: dict, path):
    """A resume must match its checkpoint in MATCH_KEYS (a checkpoint older than a key: OLDER's value); the first
    setting that differs is one line with both values (resume_mismatch)."""

    def saved(k):
        if k == "data" and k not in ckpt:  # a checkpoint older than the key: its run config's
            return corpus(ckpt["config"]["data"])
        if isinstance(OLDER.get(k), dict) and isinstance(ckpt.get(k), dict):
            return {**OLDER[k], **ckpt[k]}
        return ckpt.get(k, OLDER.get(k))

    if message := resume_mismatch({k: saved(k) for k in MATCH_KEYS}, {k: run[k] for k in MATCH_KEYS}, path):
        raise UserError(message)


def corpus(data: dict) -> dict:
    """The data settings that say which documents a run reads (not where the prepared copy is kept)."""
    return {k: v for k, v in data.items() if k != "cache_dir"}


def resume_mismatch(saved: dict, run: dict, path) -> str | None:
    """One line naming the first setting a resumed run changes from the checkpoint it resumes, with both values and
    the setting that resumes it, or None. saved and run: what a resume must match (train.py's MATCH_KEYS:
    model_config, tokenizer, seq_len, bos_aligned, optimizer_format), the checkpoint's with its older defaults."""
    keys = {"seq_len": "train.seq_len", "bos_aligned": "data.bos_aligned", "optimizer_format": "train.parallel"}

    def flat(d: dict, prefix: str = "") -> dict:
        return {k: v for key, value in d.items() for k, v in flat_item(f"{prefix}{key}", value).items()}

    def flat_item(key: str, value) -> dict:
        return flat(value, f"{key}.") if isinstance(value, dict) and value else {key: value}

    def where(key: str) -> str:  # a model_config key as the run's setting
        head, _, rest = key.partition(".")
        if head == "model_config":
            first = rest.partition(".")[0]
            return (
                rest if first == "positional" else "tokenizer.vocab_size" if first == "vocab_size" else f"model.{rest}"
            )
        return keys.get(head, key)

    old, new = flat({k: saved.get(k) for k in run}), flat(run)
    diff = [k for k in dict.fromkeys([*new, *old]) if old.get(k) != new.get(k)]
    diff.sort(key=lambda k: k.startswith("model_config."))  # a run setting first: it sets model ones (a table's size)
    if not diff:
        return None
    key, was = diff[0], settings.show(old.get(diff[0]))
    setting = "positional" if where(key) == "positional.name" else where(key)  # a scheme is picked by its group
    return (
        f"{where(key)}={settings.show(new.get(key))} does not match this run's checkpoint {path}, trained with "
        f"{was}; resume with {setting}={was}, or start afresh in another out_dir"
    )
