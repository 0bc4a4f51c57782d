"""Checkpoints and the run folder that holds one: atomic writes, checked reads, a locked folder, a matching resume.

python eval.py checkpoint=out/rope      python sample.py checkpoint=out/rope
ckpt.pt holds the weights, model config, run config, tokenizer, optimizer state, step and data position; eval and
sampling memory-map it and read only the weights. A write goes to .ckpt.pt.tmp<pid>.pt and is renamed over ckpt.pt:
a process killed midway leaves the old checkpoint loadable, and the next save removes the temp file.
"""

import functools
import os
import pickle
import shlex
import zipfile
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig

import settings
from model.gpt import GPT, GPTConfig, schemes
from utils import runtime
from utils.errors import UserError
from utils.files import remove_stale_temps, replacing, shape_problem, spec_problem, unreadable

VERSION = 1
NAME = "ckpt.pt"


def checkpoint_path(path) -> Path:
    path = Path(path)
    return path / NAME if path.is_dir() or path.suffix != ".pt" else path


def run_checkpoint(value: str) -> str | None:
    """Why value is not a readable checkpoint (a run folder or a .pt file), or None."""
    given, path = Path(value).expanduser(), checkpoint_path(Path(value).expanduser())
    if given.is_file() and given.suffix != ".pt":
        return "is a file, not a run folder or a .pt file"
    if not path.is_file():
        return f"has no checkpoint at {path}"
    if why := unreadable(path):
        return why
    return None if zipfile.is_zipfile(path) else "is corrupt or truncated (not the zip archive torch.save writes)"


def sweep_folder(value: str) -> str | None:
    """Why value is not a training sweep folder holding run folders with a checkpoint, or None."""
    path = Path(value).expanduser()
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is a file, not a folder"
    if not os.access(path, os.R_OK | os.X_OK):
        return "cannot be read (permission denied)"
    return None if any(path.glob(f"*/{NAME}")) else f"holds no run folder with a {NAME}"


def save(path, state: dict):
    """Atomic write (files.replacing): the old file survives any crash; a failure is one OSError naming the file."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        torch.save({"version": VERSION, **state}, f)


REQUIRED = ("model", "model_config", "tokenizer", "seq_len")  # what every entry point reads of a checkpoint
# the type of each key readers take, where present; a missing one is named when read (Checkpoint), so a checkpoint
# stripped of its optimizer still evaluates
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
CONFIG = {"data": dict, "tokenizer": dict}  # read from its run config
POSITIONAL = {"positional": dict}  # read from model_config, besides what GPTConfig takes
FIX = "restore a good copy, or train again into a new out_dir"


class Checkpoint(dict):
    """A loaded checkpoint: a missing key is a one-line error naming the file. config: its model_config, checked;
    scheme: its positional scheme, built on the meta device (what the rules that read a checkpoint ask of it)."""

    def __init__(self, values: dict, path: Path, config: GPTConfig, scheme):
        super().__init__(values)
        self.path, self.config, self.scheme = path, config, scheme

    def __missing__(self, key):
        raise UserError(f"checkpoint {self.path} has no {key!r} (damaged, or not written by train.py); {FIX}")


def load(path, mmap: bool = False) -> Checkpoint:
    """The checkpoint, checked. mmap=True reads only the tensors used (eval never reads the optimizer state), once per
    process: an entry point's checks and its own reads share one read of each file as it is."""
    path = checkpoint_path(path)
    if not path.exists():
        raise UserError(f"no checkpoint at {path}; train one first (python train.py out_dir={path.parent})")
    if mmap:
        stat = path.stat()
        return _mapped(str(path), stat.st_mtime_ns, stat.st_size)
    return _read(path)


@functools.lru_cache(maxsize=8)  # mapped: the tensors stay on disk
def _mapped(path: str, mtime_ns: int, size: int) -> Checkpoint:
    return _read(Path(path), mmap=True)


def _read(path: Path, mmap: bool = False) -> Checkpoint:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as e:
        raise UserError(f"checkpoint {path} is corrupt or truncated ({type(e).__name__}); {FIX}") from None
    if not isinstance(ckpt, dict) or ckpt.get("version") != VERSION or "model" not in ckpt:
        raise UserError(f"{path} is not a nanopos checkpoint (version {VERSION}); train again with this version")
    if why := problem(ckpt):
        raise UserError(f"checkpoint {path} {why}; {FIX}")
    try:  # its settings and schemes; the weights are checked against the model a reader builds (check_weights)
        config = GPTConfig(**ckpt["model_config"])
        with torch.device("meta"):
            scheme = schemes(config)[0]
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        why = f"holds a model_config that builds no model ({' '.join(str(e).split())})"
        raise UserError(f"checkpoint {path} {why}; {FIX}") from None
    return Checkpoint(ckpt, path, config, scheme)


def problem(ckpt: dict) -> str | None:
    """What is wrong with a checkpoint's content (keys, types, tokenizer), or None."""
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
    return None


def check_weights(model, ckpt: Checkpoint, state: dict | None = None, most: int = 3):
    """Refuse a checkpoint whose weights (or state, made from them) are not those of model, built from its
    model_config: the one check that needs the network, made where a reader builds it. Names the first `most`
    missing, unexpected and misshapen weights."""

    def few(names):
        return ", ".join(names[:most]) + (f" (+{len(names) - most} more)" if len(names) > most else "")

    state = ckpt["model"] if state is None else state
    want = model.state_dict()
    missing, unexpected = [k for k in want if k not in state], [k for k in state if k not in want]
    shapes = [
        f"{k} {list(state[k].shape)} where the model's is {list(want[k].shape)}"
        for k in want
        if k in state and state[k].shape != want[k].shape
    ]
    parts = [f"{what} {few(names)}" for what, names in (("missing", missing), ("unexpected", unexpected)) if names]
    if why := ", ".join(parts + shapes[:most]):
        raise UserError(
            f"checkpoint {ckpt.path} holds the weights of another model than its model_config ({model.pe.name}): "
            f"{why}; {FIX}"
        )


def build_model(model_config: dict) -> GPT:
    try:
        return GPT(GPTConfig(**model_config))
    except (ValueError, TypeError) as e:
        raise UserError(f"bad model config: {e}") from None


def load_model(path, device="cpu"):
    """(model in eval mode on device, checkpoint); only the weights are read from the mapped file."""
    ckpt = load(path, mmap=True)
    model = GPT(ckpt.config)
    check_weights(model, ckpt)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt


# ---- the run folder: one writer at a time; a resume continues its checkpoint's run ----

MATCH_KEYS = ("model_config", "tokenizer", "seq_len", "bos_aligned", "optimizer_format", "data")  # a resume shares
# options newer than some checkpoints: an older one was trained with these defaults
OLDER = {
    "bos_aligned": False,
    "model_config": {"qk_norm": "rms", "sink_logit": False, "ssmax": False, "attn_gate": False},
}
LOCK = ".lock"  # in out_dir while a run may write there


def lock_out_dir(out_dir: Path, rt):
    """Rank 0 locks out_dir (two runs would interleave checkpoints) and removes stale temp files; returns the lock."""
    lock, holder = None, -1  # the pid that holds out_dir (0: unknown), -1: none
    if rt.master:
        try:
            lock = runtime.lock_folder(out_dir, LOCK)
        except runtime.FolderBusy as e:
            holder = e.args[0]
        except OSError as e:
            raise UserError(f"out_dir={out_dir} cannot be written ({e.strerror}); pass another out_dir") from None
    holder = int(rt.max_over_ranks(holder))  # every rank stops
    if holder >= 0:
        raise UserError(
            f"out_dir={out_dir} is in use by another run (pid {holder or 'unknown'}); wait for it to end, or pass "
            f"another out_dir"
        )
    if rt.master:
        remove_stale_temps(out_dir / NAME)
    return lock


def resume_command(out_dir: Path, rt) -> str:
    """The command that continues this run: its options (under Hydra), then train.resume=true."""
    given = ["..."]  # train() called from Python
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
    """A resume must match its checkpoint in MATCH_KEYS (OLDER's value for a key the checkpoint predates)."""

    def saved(k):
        if k == "data" and k not in ckpt:  # older checkpoint: its run config's
            return corpus(ckpt["config"]["data"])
        if isinstance(OLDER.get(k), dict) and isinstance(ckpt.get(k), dict):
            return {**OLDER[k], **ckpt[k]}
        return ckpt.get(k, OLDER.get(k))

    if message := resume_mismatch({k: saved(k) for k in MATCH_KEYS}, {k: run[k] for k in MATCH_KEYS}, path):
        raise UserError(message)


def resume_state(ckpt: Checkpoint, model, opts, rt):
    """Load ckpt's weights and optimizer moments, keeping this run's hyperparameters (a resume may lower optim.lr)."""
    hyper = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in opts]
    try:
        rt.load_state(model, opts, ckpt["model"], ckpt["optimizer"])
        held = [(p, name, t) for opt in opts for p, state in opt.state.items() for name, t in state.items()]
        for p, name, t in held:  # a moment shaped unlike its parameter: torch checks only group sizes
            if isinstance(t, torch.Tensor) and t.dim() and t.shape != p.shape:
                raise ValueError(f"a {name} of shape {list(t.shape)} for a parameter of shape {list(p.shape)}")
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise UserError(
            f"checkpoint {ckpt.path} holds optimizer state that does not fit this run's optimizer "
            f"({' '.join(str(e).split())[:200]}); resume with the optim= it was trained with, or start afresh in "
            f"another out_dir"
        ) from None
    for opt, groups in zip(opts, hyper, strict=True):
        for group, kept in zip(opt.param_groups, groups, strict=True):
            group.update(kept)


def corpus(data: dict) -> dict:
    """The data settings that pick the documents (not where the prepared copy is kept)."""
    return {k: v for k, v in data.items() if k != "cache_dir"}


def resume_mismatch(saved: dict, run: dict, path) -> str | None:
    """One line naming the first MATCH_KEYS setting a resume changes, with both values, or None."""
    keys = {"seq_len": "train.seq_len", "bos_aligned": "data.bos_aligned", "optimizer_format": "train.parallel"}

    def flat(d: dict, prefix: str = "") -> dict:
        return {k: v for key, value in d.items() for k, v in flat_item(f"{prefix}{key}", value).items()}

    def flat_item(key: str, value) -> dict:
        return flat(value, f"{key}.") if isinstance(value, dict) and value else {key: value}

    def where(key: str) -> str:  # a model_config key as the run's setting
        head, _, rest = key.partition(".")
        if head != "model_config":
            return keys.get(head, key)
        first = rest.partition(".")[0]
        return rest if first == "positional" else "tokenizer.vocab_size" if first == "vocab_size" else f"model.{rest}"

    old, new = flat({k: saved.get(k) for k in run}), flat(run)
    diff = [k for k in dict.fromkeys([*new, *old]) if old.get(k) != new.get(k)]
    # the first that differs, a run setting before model ones: it sets them
    key = min(diff, key=lambda k: k.startswith("model_config."), default=None)
    if key is None:
        return None
    was, now = (settings.show(d.get(key)) for d in (old, new))
    if key == "optimizer_format":  # state keyed for FSDP, or plain: an unsharded run, train.parallel's default
        was, now = (v.replace("plain", "ddp") for v in (was, now))
    setting = "positional" if where(key) == "positional.name" else where(key)  # a scheme is picked by group
    return (
        f"{where(key)}={now} does not match this run's checkpoint {path}, trained with "
        f"{was}; resume with {setting}={was}, or start afresh in another out_dir"
    )
