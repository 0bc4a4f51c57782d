"""The checks an entry point makes before any work, each failure one line naming the key.

python train.py -m train.seq_len=256,0     error: train.seq_len=0 must be >= 1; ... (job 2 of 2: ...), before job 1
python train.py out_dir=notes.txt          error: out_dir=notes.txt is a file, not a folder; ...
preflight() walks the config (settings.problem), then what needs more than the config: the paths it names, the model
it would build (its schemes on the meta device: no memory, no data) and the rules that read a checkpoint it names
(facts). Check, a Hydra callback (hydra.callbacks.check in each entry point's YAML), runs it on every job of a sweep
before the first.
"""

import copy
import functools
import itertools
import json
from pathlib import Path

import torch
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from model.gpt import GPTConfig, schemes
from settings import config_type, files_problem, problem
from utils import checkpoint
from utils.errors import UserError, cli, compose_message
from utils.files import writable_folder
from utils.schema import (
    CHECKPOINT_HINT,
    RUN,
    TrainConfig,
    model_config,
    plain,
)

PASSED: set[str] = set()  # the configs (as YAML) preflight passed in this process


def facts(path) -> dict:
    """What the rules that need a checkpoint read of it (Rule.needs): its training length, its learned table's size
    (None: unbounded), its learned sink tokens, and the run folder, for the message. The file is mapped, and the
    scheme built on the meta device (checkpoint.load): no weights are read."""
    ckpt = checkpoint.load(path, mmap=True)
    pe = ckpt.scheme
    return dict(
        train_length=ckpt["seq_len"], max_positions=pe.max_positions, n_prefix=pe.n_prefix, run=str(ckpt.path.parent)
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
    learned table's size, the training length). Check runs it on every job before Hydra starts one, and
    the entry point then calls it again: a config that passed once in this process is not checked twice."""
    text = OmegaConf.to_yaml(cfg)
    if text in PASSED:
        return
    kind = config_type(cfg)
    if kind is TrainConfig and cfg.init_from:  # its checkpoint gives positional.original_length, as train.py does
        from utils.finetune import read_init

        if message := problem(cfg, values_only=True):  # the values read_init reads, first
            raise UserError(message)
        if why := checkpoint.run_checkpoint(str(cfg.init_from)):
            raise UserError(f"init_from={cfg.init_from} {why}; {CHECKPOINT_HINT}")
        read_init(cfg)
    if message := problem(cfg, facts=dict.fromkeys(RUN, True)) or files_problem(cfg):
        raise UserError(message)
    if cfg.get("logger") is not None and cfg.logger.wandb:  # online needs a key, which the environment holds
        from utils.logger import check_mode

        check_mode(cfg.logger.mode)
    if "model" in cfg and not (cfg.get("checkpoint") or cfg.get("sweep_dir")):  # a model it builds (train, viz)
        check_model(cfg)
    if kind is TrainConfig:
        config_type(cfg.data).check_rows(cfg.data, cfg.train.seq_len)
    for path in checkpoints(cfg):
        if message := problem(cfg, facts={**dict.fromkeys(RUN, True), **facts(path)}):
            raise UserError(message)
    PASSED.add(text)


def check_model(cfg) -> GPTConfig | None:
    """The model's config, and its schemes built on the meta device (no memory, no time; model/gpt.py schemes), so
    that every constraint their code derives (a scheme's options against its class, the layer pattern, a table
    covering train.seq_len, and the range data.random_positions draws from) fails before data is read. The
    network itself is built once, by the entry point, from this config (checked_model)."""
    model = json.dumps(model_config(plain(cfg), vocab_size=512), sort_keys=True)  # the vocabulary comes with the data
    return fit_model(model, cfg.train.seq_len, OmegaConf.select(cfg, "data.random_positions"))  # viz.py: no data


def checked_model(cfg, vocab_size: int) -> GPTConfig | None:
    """The config check_model checked, with the prepared data's vocabulary (a copy: nothing checks it twice); None
    where its schemes could not be built on the meta device."""
    checked = check_model(cfg)
    if checked is None:
        return None
    config = copy.copy(checked)
    config.vocab_size = vocab_size
    return config


@functools.lru_cache(maxsize=256)  # one build per model config: an entry point checks it more than once
def fit_model(model: str, seq_len: int, drawn: int | None) -> GPTConfig | None:
    try:
        config = GPTConfig(**json.loads(model))
        with torch.device("meta"):
            pe = schemes(config)[0]
    except NotImplementedError:  # a module that cannot be built without data: checked at its real build
        return None
    except ValueError as e:  # positional/ and GPTConfig word theirs as one line naming the key
        raise UserError(str(e)) from None
    pe.check_length(seq_len)
    if drawn is not None:
        pe.check_length(drawn)
    return config


# ---- every job of a run or a sweep, before Hydra starts one ----


def task_config(config: DictConfig) -> DictConfig:
    """The job's own config, as Hydra hands it to the entry point: less its hydra node."""
    cfg = copy.deepcopy(config)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg


def sweep_jobs(config: DictConfig) -> tuple[list[list[str]], set[str]]:
    """The overrides of each job of a sweep, as hydra's basic sweeper makes them (each sweep's values crossed), and
    the keys swept; no jobs for another sweeper (its jobs are checked as each starts)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return [], set()
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create().parse_overrides([*params, *config.hydra.overrides.task])
    by_key, swept = {}, set()
    for o in overrides:
        values = o.sweep_string_iterator() if o.is_discrete_sweep() else [o.get_value_element_as_str()]
        by_key[o.get_key_element()] = [f"{o.get_key_element()}={v}" for v in values]
        swept |= {o.get_key_element()} if o.is_sweep_override() else set()
    return [list(job) for job in itertools.product(*by_key.values())], swept


def check_run(config: DictConfig):
    preflight(task_config(config))
    folder = Path(config.hydra.run.dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        key = "out_dir" if "out_dir" in config else "hydra.run.dir"
        raise UserError(f"{key}={folder} cannot be made ({e.strerror}); pass a folder you can write") from None


def check_sweep(config: DictConfig):
    from hydra.core.global_hydra import GlobalHydra

    if why := writable_folder(str(config.hydra.sweep.dir)):  # a file there: Hydra's traceback after every check
        raise UserError(f"hydra.sweep.dir={config.hydra.sweep.dir} {why}; pass a folder you can write")
    jobs, swept = sweep_jobs(config)
    loader = GlobalHydra.instance().config_loader()
    for n, overrides in enumerate(jobs, 1):
        which = " ".join(o for o in overrides if o.partition("=")[0] in swept) or "as given"
        try:
            job = loader.load_sweep_config(master_config=config, sweep_overrides=overrides)
        except CompactHydraException as e:  # an option that does not exist (positional=alibii)
            raise UserError(f"{compose_message(e, config.hydra.job.config_name)} (job {n} of {len(jobs)})") from None
        try:
            preflight(task_config(job))
        except UserError as e:
            raise UserError(f"{e} (job {n} of {len(jobs)}: {which})") from None


class Check(Callback):
    """Hydra turns an exception a callback raises into a warning and goes on: a refusal here exits, through cli()."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        refuse(check_run, config)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        refuse(check_sweep, config)


def refuse(check, config: DictConfig):
    cli(lambda: check(config))  # a UserError, or a scheme's or a cache's own refusal: one line and exit 2
