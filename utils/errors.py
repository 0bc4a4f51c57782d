"""One-line errors for bad input: raise UserError(message) anywhere; entry points print it and exit 2.

The message says what is wrong and what to do. Bugs still raise with a full traceback.
"""

import sys


class UserError(Exception):
    pass


def cli(fn):
    """Run fn(); a UserError, or a known bad-input error from the library, becomes 'error: ...' and exit 2."""
    from omegaconf.errors import MissingMandatoryValue

    from model.kv_cache import CacheError
    from positional import PositionLimitError

    try:
        return fn()
    except (UserError, PositionLimitError, CacheError) as e:
        fail(str(e))
    except MissingMandatoryValue as e:
        fail(f"{e.full_key} has no value; pass {e.full_key}=...")


def fail(message: str):
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)
