"""Stops asked for by SIGTERM or Ctrl-C: what is done is kept, and nothing more starts.

python train.py -m seed=1,2,3          the running job saves and stops (train.py StopFlag); no later job starts
python eval.py sweep_dir=multirun/x    the runs evaluated so far keep their results; the one under way writes nothing
python -m data.prepare data=text       the half-built folder is removed; nothing else changes
Where nothing can be saved (data preparation, an evaluation), the signal raises Stopped where the program is: a
SystemExit with the shell's status for the signal (130 for Ctrl-C, 143 for SIGTERM), so every finally block runs (a
temp file or folder removed, a lock released), Hydra starts no other job, and the process ends without a traceback.
A training run saves first and exits 0 (train.py); `asked` keeps the signal's name for the rest of the process, so
that StopSweep (a Hydra callback in configs/train.yaml and configs/eval.yaml) starts no other job after it.
"""

import signal
import sys
from contextlib import contextmanager

from hydra.experimental.callback import Callback

SIGNALS = (signal.SIGTERM, signal.SIGINT)
asked: str | None = None  # the name of the signal that asked this process to stop, once one has


class Stopped(SystemExit):
    """A stop asked for by a signal, where nothing could be saved: exit status 128 + its number."""

    def __init__(self, name: str):
        super().__init__(128 + signal.Signals[name])
        self.name = name


def ask(signum: int) -> str:
    """Record that signal signum asked this process to stop; its name."""
    global asked
    asked = signal.Signals(signum).name
    return asked


def say(line: str):
    print(line, file=sys.stderr, flush=True)


@contextmanager
def raising(said: str | None = None):
    """Within the block SIGTERM and Ctrl-C raise Stopped at once (said, where given: what that leaves, in a line on
    stderr); the handlers before it are put back after."""

    def handle(signum, frame):
        name = ask(signum)
        if said:
            say(f"stopped by {name}: {said}")
        raise Stopped(name)

    old = {s: signal.signal(s, handle) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class StopSweep(Callback):
    """A -m sweep whose job was stopped by a signal (and saved, exit 0) starts no other job."""

    def on_job_start(self, config, **kwargs):
        if asked:
            which = " ".join(config.hydra.overrides.task)
            say(f"stopped by {asked}: job #{config.hydra.job.num} ({which}) and the later ones were not started")
            sys.exit(0)


class StopFlag:
    """SIGTERM or a first Ctrl-C asks the loop to save and stop; a second Ctrl-C interrupts at once. Before the loop
    (data preparation, setup) there is nothing to save: the signal stops the run at once (raising)."""

    def __init__(self):
        self.requested = False
        self.name = None  # of the signal that asked
        self.saving = False  # set once the loop runs
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested, self.name = True, ask(signum)
        if not self.saving:
            print(f"\n{self.name}: stopping before the first step, with nothing to save", flush=True)
            raise Stopped(self.name)
        print(f"\n{self.name}: saving a checkpoint and stopping", flush=True)

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)
