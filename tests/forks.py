"""A process that has imported torch, Hydra and numpy once and forks a fresh entry point per request.

Started by tests/conftest.py run() (one per pytest worker): `python train.py ...` as a test runs it costs about 4 s,
most of it importing torch; a fork of this process starts with those imports done, and then imports the project,
reads argv, composes and runs exactly as `python <args>` would, in its own process with its own pid, signals, exit
status and output. Protocol, one JSON line each way: {args, env, cwd, stdout, stderr} (two file paths) -> {pid},
then {status} as os.waitpid reports it once the child ends.
"""

import atexit
import json
import os
import runpy
import signal
import sys
import traceback

import hydra  # noqa: F401  (loaded here: the point of this process)
import numpy  # noqa: F401
import omegaconf  # noqa: F401
import torch  # noqa: F401
import tqdm  # noqa: F401
from hydra.core.config_store import ConfigStore  # noqa: F401


def exit_code(e: SystemExit) -> int:
    """The status python gives a SystemExit that reaches the top: None 0, an int itself, else printed and 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def run(args: list[str]) -> int:
    """Run args as python's command line would (a script, -m module or -c code); its exit status."""
    try:
        if args[0] == "-m":
            sys.argv, sys.path[0] = [args[1], *args[2:]], os.getcwd()
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "-c":
            sys.argv, sys.path[0] = ["-c", *args[2:]], ""
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv, sys.path[0] = list(args), os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
        return 0
    except SystemExit as e:
        return exit_code(e)
    except KeyboardInterrupt:  # python ends so by SIGINT itself: status -2
        traceback.print_exc()
        return -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        return 1


def child(req: dict):
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.dup2(stdin, 0)
    sys.stdin = open(os.devnull)  # noqa: SIM115  (the process's, for its life)
    code = 1
    try:
        code = run(req["args"])
        atexit._run_exitfuncs()  # wandb's and the project's, as at a normal exit
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)


def serve():
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            sys.stdin.close()
            child(req)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve()
