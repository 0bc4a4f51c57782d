"""One-line errors for bad input: raise UserError(message) anywhere; entry points print it and exit 2.

The message says what is wrong and what to do (`<key>=<value> ...; <what to do>`); bugs still raise with a traceback.
    if __name__ == "__main__":
        hydra_cli(main)          # main: a @hydra.main function whose body calls cli(...)
hydra_cli words a config that does not compose (a wrong type, an unknown key or option, a malformed override) the
same way, where Hydra would print several lines and exit 1.
"""

import os
import re
import sys
from pathlib import Path

from settings import UserError  # noqa: F401  (raised and caught by this name across the project)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
# the settings of a training run, which the entry points that read its checkpoint take from it (utils/eval_schema.py)
FROM_CHECKPOINT = ("positional", "model", "data", "tokenizer", "optim", "train", "init_from", "out_dir")
READERS = ("eval", "sample", "longrope")  # entry points that read every one of them from a checkpoint
# the entry point a process runs, by its script's name, as its configs/<name>.yaml is named
SCRIPTS = {"longrope_search": "longrope"}


def cli(fn):
    """Run fn(); a UserError, or a known bad-input error from the library, becomes 'error: ...' and exit 2."""
    from omegaconf.errors import MissingMandatoryValue

    try:
        return fn()
    except UserError as e:  # also a scheme's PositionLimitError and a cache's CacheError
        fail(str(e))
    except MissingMandatoryValue as e:
        fail(f"{e.full_key}=??? has no value; pass {e.full_key}=...")


def fail(message: str):
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def entry_point() -> str:
    """The entry point this process runs (train, eval, ...), by the name of its script."""
    stem = Path(sys.argv[0]).stem
    return SCRIPTS.get(stem, stem)


def hydra_cli(main):
    """Call a @hydra.main function; a config that does not compose is one line and exit 2.

    Hydra catches its composition errors and prints them over several lines, unless HYDRA_FULL_ERROR=1, when it
    raises them: that is set here, and they are caught and worded. Anything else (a bug) raises as before, with
    its traceback. A user who sets HYDRA_FULL_ERROR=1 gets Hydra's own full report."""
    import argparse

    from hydra.errors import CompactHydraException

    debug = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    # a flag Hydra's parser refuses (--cfg jobb): its one line, not argparse's usage block over it
    argparse.ArgumentParser.error = lambda parser, message: fail(f"{message}; see python {parser.prog} --help")
    try:
        return main()
    except UserError as e:  # a check Hydra ran before the job (utils/checks.py Check)
        fail(str(e))
    except CompactHydraException as e:
        if debug:
            raise
        fail(compose_message(e, entry_point()))
    except ValueError as e:  # group=<a number or null>: Hydra raises a bare ValueError while it reads the defaults
        if debug or not str(e).startswith("Config group override must be"):
            raise
        fail(group_value_message(sys.argv[1:]) or str(e))


def groups(name: str) -> list[str]:
    """The config groups of an entry point: those the defaults list of configs/<name>.yaml names."""
    from omegaconf import OmegaConf

    path = CONFIGS / f"{name}.yaml"
    if not path.is_file():
        return []
    entries = OmegaConf.to_container(OmegaConf.load(path)).get("defaults", [])
    return [k for d in entries if isinstance(d, dict) for k in d if not k.startswith("override ")]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def group_value_message(overrides) -> str | None:
    """One line for a group given a value that is not an option's name (model=5, positional=null)."""
    for override in overrides:
        key, _, value = override.partition("=")
        if (CONFIGS / key).is_dir() and (value == "null" or not re.fullmatch(r"[A-Za-z_][\w.-]*|\[.*\]", value)):
            return f"{key}={value} is not one of {', '.join(options(key))}; pick one (configs/{key}/)"
    return None


def split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def parse_hint(key: str) -> str:
    """How to write a value the override parser cannot read: quoted for Hydra, in quotes for the shell."""
    text = " or put the text in a file: prompt=@file.txt" if key == "prompt" else ""
    return (
        f"put the value in double quotes for the override parser and the whole in single quotes for the shell, e.g. "
        f"'{key}=\"it's [a] {{b}}, c\"' (a double quote inside as \\\"),{text or ' or pass a list as [a,b]'}"
    ).rstrip(",")


def compose_message(e, name: str = "") -> str:
    """One line for a Hydra composition error, naming the key and what to do: worded from the fields of OmegaConf's
    exception (its key, the class that declares it, the value given) by settings.py, as the walker words the
    ranges. name: the entry point (its configs/<name>.yaml), for what only it can say (its groups). Never a +key:
    a key that is not in the config is a misspelling, and + would add one that nothing reads."""
    from dataclasses import is_dataclass

    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import (
        ConfigAttributeError,
        ConfigKeyError,
        ConfigTypeError,
        GrammarParseError,
        ValidationError,
    )

    import settings

    cause = e.__cause__ or e.__context__  # a config group's option that does not compose: raised while handling
    declared = getattr(cause, "object_type", None)
    declared = declared if isinstance(declared, type) and is_dataclass(declared) else None
    merging = re.match(r"Error merging override (.+)", str(e))
    if isinstance(cause, ValidationError) and cause.full_key:
        return settings.invalid(cause)
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and cause.full_key:  # an unknown key
        if declared is not None:
            return settings.unknown(declared, cause.full_key, cause.parent_node)
        return f"{cause.full_key} is not a key of this config; check the spelling (--cfg job prints every key)"
    if isinstance(cause, GrammarParseError) and merging:
        key, value = split(merging.group(1))
        return (
            f"{key}={value} holds a ${{ that does not close: ${{...}} names another setting; write \\${{ to keep "
            f"${{ as text, e.g. '{key}=\\${{'"
        )
    if isinstance(cause, ConfigTypeError) and merging and merging.group(1).startswith("~"):
        key, _ = split(merging.group(1))
        return f"~{key} would delete a setting every run reads; set it instead ({key}=...; --cfg job prints its value)"
    if merging:  # a value Hydra could not merge, whose error names no field (an element of the wrong shape)
        key, value = split(merging.group(1))
        why = str(cause).splitlines()[0].rstrip(".") if cause else "of the wrong type"
        return f"{key}={value} cannot be set ({why}); pass a value of its type (--cfg job prints the current one)"
    if isinstance(e, MissingConfigException) and (e.missing_cfg_file or "").startswith("hydra/launcher/submitit"):
        return "hydra/launcher=slurm runs its jobs through Hydra's submitit plugin; pip install hydra-submitit-launcher"
    if isinstance(e, MissingConfigException) and e.options and "/" in (e.missing_cfg_file or ""):
        group, _, option = e.missing_cfg_file.rpartition("/")
        return f"{group}={settings.show(option)} is not one of {', '.join(e.options)}; pick one (configs/{group}/)"
    if isinstance(e, OverrideParseException):
        key, value = split(e.override)
        if "=" not in e.override:
            return f"{e.override} has no value; write it as {key}=<value> (or group=option)"
        return f"{key}={value} cannot be parsed (a quote, bracket, brace or comma the override parser reads); " + (
            parse_hint(key)
        )
    if found := re.match(r"Could not override '([^']+)'\. No match in the defaults list", str(e)):
        return no_group_message(found.group(1), str(e), name)
    if found := re.match(r"Ambiguous value for argument '([^']+)'", str(e)):
        key, value = split(found.group(1))
        return (
            f"{key}={value} holds a comma, which an override reads as a sweep of values: to pass it as text, "
            f"{parse_hint(key).removeprefix('put the value in ')}; to sweep, add -m"
        )
    lines = [ln.strip() for ln in str(e).split("Config search path")[0].splitlines() if ln.strip()]
    return "; ".join(ln for ln in lines if " use +" not in ln)  # Hydra's '+key' hint adds a key nothing reads


def no_group_message(group: str, text: str, name: str) -> str:
    """group=option where the entry point has no such group: the nearest group it has, or, for a setting a checkpoint
    fixes (eval.py positional=alibi), where it is set."""
    import difflib

    value = re.search(r"use \+\S+=(\S+)", text)
    shown = f"{group}={value.group(1) if value else '...'}"
    if name in READERS and group in FROM_CHECKPOINT:
        return (
            f"{shown}: {name}.py reads {group} from the checkpoint, as the run was trained; train a run with it "
            f"(python train.py {shown}), and pass that run's folder as checkpoint="
        )
    have = groups(name)
    near = difflib.get_close_matches(group, have, n=1, cutoff=0.6)
    listed = f"its groups: {', '.join(have)}" if have else "it has none"
    fix = f"check the spelling ({near[0]}?)" if near else "--cfg job prints every setting"
    where = f"{name}.py" if name else "this entry point"
    return f"{shown}: {group} is not a config group of {where} ({listed}); {fix}"
