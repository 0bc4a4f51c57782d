"""Progress for the long loops: a bar on a terminal; elsewhere (a log file, CI) a line every half minute; and the time
left at the pace so far.

python eval.py checkpoint=out/rope                   a bar over the (variant, length, mode) cells; each cell's line ends
                                                     with the cells done and the time left (Eta)
python eval.py checkpoint=out/rope eval.mode=stream  a bar over the stream's tokens, one method at a time
python eval.py checkpoint=out/rope > eval.log        no bar: a line every 30 s, `dense: 2,560/12,800 tok, eta 1:23`
tqdm's disable=None turns a bar off when its stream is not a TTY, so CI logs and redirected output stay clean.
"""

import sys
import time

from tqdm import tqdm

EVERY = 30.0  # seconds between the progress lines written where no bar is drawn


def progress(iterable, desc: str, total: int | None = None, unit: str = "it", file=None):
    bar = tqdm(iterable, desc=desc, total=total, unit=unit, disable=None, leave=False, dynamic_ncols=True, file=file)
    if not bar.disable or iterable is None:
        return bar
    return lines(iterable, desc, total if total is not None else len(iterable), unit)


def lines(iterable, desc: str, total: int, unit: str):
    """iterable's items, with a line every EVERY seconds: how many are done of total, and the time left."""
    eta, shown = Eta(total), time.time()
    for item in iterable:
        yield item
        done = eta.step(unit)
        if time.time() - shown >= EVERY:
            shown = time.time()
            say(f"  {desc}: {done}")


class Eta:
    """Items done of a known total, and the time left at the pace so far: step("cells") -> '3/12 cells, eta 1:05'."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.time()

    def step(self, unit: str = "") -> str:
        self.done += 1
        left = (time.time() - self.start) / self.done * (self.total - self.done)
        return f"{self.done:,}/{self.total:,}{' ' + unit if unit else ''}, eta {clock(left)}"


def clock(seconds: float) -> str:
    """h:mm:ss, or m:ss under an hour."""
    m, sec = divmod(round(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}" if m >= 60 else f"{m}:{sec:02d}"


def say(line: str):
    """Print a line to stdout without tearing a bar drawn on the terminal."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()
