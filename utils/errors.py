"""One-line errors for bad input: raise UserError(message) anywhere; entry points print it and exit 2.

The message says what is wrong and what to do. Bugs still raise with a full traceback.
    if __name__ == "__main__":
        hydra_cli(main)          # main: a @hydra.main function whose body calls cli(...)
hydra_cli words a config that does not compose (a value of the wrong type, an unknown key or option, a
malformed override) the same way: Hydra itself would print several lines and exit 1.
"""

import os
import sys


class UserError(Exception):
    pass


def cli(fn):
    """Run fn(); a UserError, or a known bad-input error from the library, becomes 'error: ...' and exit 2."""
    from omegaconf.errors import MissingMandatoryValue

    from model.kv_cache import CacheError
    from positional import PositionAxesError, PositionLimitError

    try:
        return fn()
    except (UserError, PositionLimitError, PositionAxesError, CacheError) as e:
        fail(str(e))
    except MissingMandatoryValue as e:
        fail(f"{e.full_key} has no value; pass {e.full_key}=...")


def fail(message: str):
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def hydra_cli(main):
    """Call a @hydra.main function; a config that does not compose is one line and exit 2.

    Hydra catches its composition errors and prints them over several lines, unless HYDRA_FULL_ERROR=1, when it
    raises them: that is set here, and they are caught and worded. Anything else (a bug) raises as before, with
    its traceback. A user who sets HYDRA_FULL_ERROR=1 gets Hydra's own full report."""
    from hydra.errors import CompactHydraException

    debug = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        return main()
    except CompactHydraException as e:
        if debug:
            raise
        fail(compose_message(e))


def compose_message(e) -> str:
    """One line for a Hydra composition error, naming the key and what to do: worded from the fields of OmegaConf's
    exception (its key, the class that declares it, the value given) by utils/settings.py, as the walker words the
    ranges."""
    from dataclasses import is_dataclass

    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    from utils import settings

    cause = e.__cause__
    declared = getattr(cause, "object_type", None)
    declared = declared if isinstance(declared, type) and is_dataclass(declared) else None
    if isinstance(cause, ValidationError) and cause.full_key:
        return settings.invalid(cause)
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and cause.full_key:  # an unknown key
        if declared is not None:
            return settings.unknown(declared, cause.full_key)
        return f"{cause.full_key} is not a key of this config; check the spelling (--cfg job prints every key)"
    if isinstance(e, MissingConfigException) and e.options and "/" in (e.missing_cfg_file or ""):
        group, _, option = e.missing_cfg_file.rpartition("/")
        return f"{group}={option} is not one of {', '.join(e.options)}; pick one (configs/{group}/)"
    if isinstance(e, OverrideParseException):
        return (
            f"{e.override} cannot be parsed ({e.message.splitlines()[0]}); write overrides as key=value or "
            f"group=option, and quote a value that holds brackets, braces or quotes"
        )
    return "; ".join(ln.strip() for ln in str(e).split("Config search path")[0].splitlines() if ln.strip())
