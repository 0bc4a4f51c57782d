"""Every job is checked before any runs: a Hydra callback that makes the entry point's check (utils/checks.py
preflight) on the config of each job, before Hydra makes its folder.

python train.py -m train.seq_len=256,0     error: train.seq_len=0 must be >= 1; ... (job 2 of 2: ...), before job 1
python train.py out_dir=notes.txt          error: out_dir=notes.txt is a file, not a folder; ...
Registered in each entry point's configs/<name>.yaml as hydra.callbacks.check. on_run_start checks the run's config
and makes the folder Hydra would make next (hydra.run.dir: train.py's out_dir), so that a folder that cannot be made
is one line naming out_dir; on_multirun_start composes every job of the sweep as the basic sweeper will (its params
and the command line's overrides, crossed) and checks each, so a bad later job stops the sweep before the first
trains. The entry points check again when they start (they also run without Hydra: tests call them in process).
"""

import copy
import itertools
from pathlib import Path

from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict, read_write

from utils.errors import UserError, cli, compose_message


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
    from utils import checks

    checks.preflight(task_config(config))
    folder = Path(config.hydra.run.dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        key = "out_dir" if "out_dir" in config else "hydra.run.dir"
        raise UserError(f"{key}={folder} cannot be made ({e.strerror}); pass a folder you can write") from None


def check_sweep(config: DictConfig):
    from hydra.core.global_hydra import GlobalHydra

    from utils import checks

    jobs, swept = sweep_jobs(config)
    loader = GlobalHydra.instance().config_loader()
    for n, overrides in enumerate(jobs, 1):
        which = " ".join(o for o in overrides if o.partition("=")[0] in swept) or "as given"
        try:
            job = loader.load_sweep_config(master_config=config, sweep_overrides=overrides)
        except CompactHydraException as e:  # an option that does not exist (positional=alibii)
            raise UserError(f"{compose_message(e, config.hydra.job.config_name)} (job {n} of {len(jobs)})") from None
        try:
            checks.preflight(task_config(job))
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
