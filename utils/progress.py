"""Progress of a long evaluation: a bar on a terminal, elsewhere a line every half minute.

python eval.py checkpoint=out/rope eval.mode=stream     `dense: 2,560/12,800 tok, eta 1:23` in a log file
"""

import sys
import time

from tqdm import tqdm

from utils.logger import clock

EVERY = 30.0  # seconds between progress lines where no bar is drawn


def progress(iterable, desc: str, total: int | None = None, unit: str = "it", file=None):
    bar = tqdm(iterable, desc=desc, total=total, unit=unit, disable=None, leave=False, dynamic_ncols=True, file=file)
    if not bar.disable or iterable is None:
        return bar
    return lines(iterable, desc, total if total is not None else len(iterable), unit)


def lines(iterable, desc: str, total: int, unit: str):
    eta, shown = Eta(total), time.time()
    for item in iterable:
        yield item
        done = eta.step(unit)
        if time.time() - shown >= EVERY:
            shown = time.time()
            say(f"  {desc}: {done}")


class Eta:
    """step("cells") -> '3/12 cells, eta 1:05', at the pace so far."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.time()

    def step(self, unit: str = "") -> str:
        self.done += 1
        left = (time.time() - self.start) / self.done * (self.total - self.done)
        return f"{self.done:,}/{self.total:,}{' ' + unit if unit else ''}, eta {clock(left)}"


def say(line: str):
    """Print without tearing a progress bar."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()
