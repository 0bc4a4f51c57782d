"""The checks an entry point makes before any work, each failure one line naming the key (utils/errors.py UserError).

python train.py train.seq_len=0     error: train.seq_len=0 must be >= 1; pass a positive length
check() walks a composed config against every range and rule its dataclasses declare (utils/schema.py, settings.py);
preflight() adds what needs more than the config: the paths it names, the model it would build (check_model, on the
meta device: no memory, no data), and the rules that read a checkpoint it names (facts). resume_mismatch words a
resume that changes a setting. utils/precheck.py runs preflight on every job of a sweep before the first one starts.
"""

import functools
import json
from pathlib import Path

import torch

import positional
import settings
from model.gpt import GPT, GPTConfig
from settings import config_type, files_problem, problem
from utils import checkpoint
from utils.errors import UserError
from utils.schema import (
    CHECKPOINT_HINT,
    RUN,
    TrainConfig,
    check_grid_row,
    model_config,
    plain,
    run_checkpoint,
)


def facts(path) -> dict:
    """What the rules that need a checkpoint read of it (Rule.needs): its training length, its learned table's size
    (None: unbounded), its learned sink tokens, and the run folder, for the message. The file is mapped, and the
    scheme built on the meta device: no weights are read."""
    path = checkpoint.checkpoint_path(path)
    return dict(_facts(str(path), path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _facts(path: str, mtime: int) -> tuple:
    ckpt = checkpoint.load(path, mmap=True)
    cfg = ckpt["model_config"]
    with torch.device("meta"):
        pe, _ = positional.build_layers(
            cfg["positional"], cfg["n_head"], cfg["d_model"] // cfg["n_head"], cfg["d_model"]
        )
    run = str(Path(path).parent)
    return tuple(
        dict(train_length=ckpt["seq_len"], max_positions=pe.max_positions, n_prefix=pe.n_prefix, run=run).items()
    )


def checkpoints(cfg) -> list[Path]:
    """The checkpoints a config reads: checkpoint=, or every run of sweep_dir= (viz.py and eval.py)."""
    if cfg.get("sweep_dir"):
        return sorted(Path(cfg.sweep_dir).expanduser().glob(f"*/{checkpoint.NAME}"))
    return [Path(cfg.checkpoint).expanduser()] if cfg.get("checkpoint") else []


def check(cfg):
    """Every setting of a composed config against its declared range and rules: one line, before any work. The
    config alone: no file is read (the docs' commands are checked so, tests/test_docs.py)."""
    if message := problem(cfg):
        raise UserError(message)


def preflight(cfg):
    """What an entry point checks before any work, each failure one line naming the key: every setting of the
    composed config against its declared range and rules, then the paths it names, then what needs more than the
    config: the model it would build (train.py, viz.py at init) and the rules that read a checkpoint it names (a
    learned table's size, the training length). utils/precheck.py runs it on every job before Hydra starts one."""
    kind = config_type(cfg)
    if kind is TrainConfig:  # init_from's checkpoint gives positional.original_length its value, as train.py does
        from utils.finetune import read_init

        if message := problem(cfg, values_only=True):  # the values read_init reads, first
            raise UserError(message)
        if cfg.init_from and (why := run_checkpoint(str(cfg.init_from))):
            raise UserError(f"init_from={cfg.init_from} {why}; {CHECKPOINT_HINT}")
        read_init(cfg)
    if message := problem(cfg, facts=dict.fromkeys(RUN, True)) or files_problem(cfg):
        raise UserError(message)
    if cfg.get("logger") is not None and cfg.logger.wandb:  # online needs a key, which the environment holds
        from utils.logger import check_mode

        check_mode(cfg.logger.mode)
    if "model" in cfg and not (cfg.get("checkpoint") or cfg.get("sweep_dir")):  # a model it builds (train, viz)
        check_model(cfg)
    if kind is TrainConfig and cfg.data.source == "grids":
        check_grid_row(cfg.data, cfg.train.seq_len)
    for path in checkpoints(cfg):
        if message := problem(cfg, facts={**dict.fromkeys(RUN, True), **facts(path)}):
            raise UserError(message)


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


def check_model(cfg):
    """Build the model on the meta device (no memory, no time), so that every constraint its code derives (a
    scheme's options against its class, the layer pattern, a table covering train.seq_len, and the range
    positional.random_positions draws from) fails before data is read."""
    model = json.dumps(model_config(plain(cfg), vocab_size=512), sort_keys=True)
    fit_model(model, cfg.train.seq_len, cfg.positional.get("random_positions"))


@functools.lru_cache(maxsize=256)  # one build per model config: an entry point checks it more than once
def fit_model(model: str, seq_len: int, drawn: int | None):
    try:
        with torch.device("meta"):
            built = GPT(GPTConfig(**json.loads(model)))
    except NotImplementedError:  # a module that cannot be built without data: checked at its real build
        return
    except ValueError as e:  # positional/ and GPTConfig word theirs as one line naming the key
        raise UserError(str(e)) from None
    built.pe.check_length(seq_len)
    if drawn is not None:
        built.pe.check_length(drawn)
