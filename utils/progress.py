"""Progress bars for the long evaluation loops: drawn on stderr when it is a terminal, absent otherwise.

python eval.py checkpoint=out/rope                   a bar over the (variant, length, mode) cells
python eval.py checkpoint=out/rope eval.mode=stream  a bar over the stream's tokens, one method at a time
tqdm's disable=None turns a bar off when its stream is not a TTY, so CI logs and redirected output stay clean.
"""

import sys

from tqdm import tqdm


def progress(iterable, desc: str, total: int | None = None, unit: str = "it", file=None):
    return tqdm(iterable, desc=desc, total=total, unit=unit, disable=None, leave=False, dynamic_ncols=True, file=file)


def say(line: str):
    """Print a line to stdout without tearing a bar drawn on the terminal."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()
