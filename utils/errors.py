"""One-line errors for bad input: raise UserError(message) anywhere; entry points print it and exit 2.

The message says what is wrong and what to do. Bugs still raise with a full traceback.
    if __name__ == "__main__":
        hydra_cli(main)          # main: a @hydra.main function whose body calls cli(...)
hydra_cli words a config that does not compose (a value of the wrong type, an unknown key or option, a
malformed override) the same way: Hydra itself would print several lines and exit 1.
"""

import os
import re
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


TYPE_WORDS = {  # omegaconf's message -> what the value must be
    r"converted to Float": "a number",
    r"converted to Integer": "a whole number",
    r"not a valid bool": "true or false",
    r"is not a ListConfig": "a list, e.g. [1,2]",
    r"to string": "a string",
}


def compose_message(e) -> str:
    """One line for a Hydra composition error, naming the key and what to do."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    text, cause = str(e), e.__cause__
    if isinstance(cause, ValidationError):
        first = str(cause).splitlines()[0]
        value = re.search(r"Value '(.*?)'", first) or re.search(r"override \S+?=(.*)$", text.splitlines()[0])
        shown = f"{cause.full_key}={value.group(1)}" if value else cause.full_key
        want = next((w for pattern, w in TYPE_WORDS.items() if re.search(pattern, first)), None)
        return f"{shown} must be {want}" if want else f"{shown}: {first}"
    if isinstance(cause, ConfigAttributeError | ConfigKeyError):  # an unknown key
        head = text.splitlines()[0].rstrip(".")
        return (
            f"{head}: {cause.full_key} is not a key of this config; check the spelling "
            f"(--cfg job prints every key), or prefix + to add a key it lacks (+{cause.full_key}=...)"
        )
    if isinstance(e, MissingConfigException):
        lines = [ln.strip() for ln in text.split("Config search path")[0].splitlines() if ln.strip()]
        head = re.sub(r"^In '[^']*': ", "", lines[0])
        if len(lines) > 2 and lines[1].startswith("Available options"):
            return f"{head}; {lines[1].rstrip(':')}: {', '.join(lines[2:])}; pick one"
        return head
    if isinstance(e, OverrideParseException):
        return f"cannot parse an override ({text.splitlines()[0]}); write overrides as key=value or group=option"
    return "; ".join(ln.strip() for ln in text.splitlines() if ln.strip())
