"""Device, precision, signals, and a process's place in a torchrun job (utils/parallel.py shares the model over it).

torchrun --nproc_per_node=2 train.py ...     (NCCL on CUDA, gloo on CPU)
device=auto picks CUDA when present; dtype=auto is bf16 autocast on CUDA, fp32 on CPU.
compile=auto compiles on CUDA only. On the 2-core CPU (bench/cpu_bench.py, bench/RESULTS.md) the compiled tiny model
ran 0.86x-1.06x eager (noise: model/fused.py already makes eager fast) after 5 s (warm cache) to 26 s (cold) of
compiling; the small model ran 1.04x after 33 s (about 220 steps to pay back). Elsewhere, pass compile=true.
"""

import ctypes
import fcntl
import gc
import os
import resource
import shutil
import signal
import sys
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from hydra.experimental.callback import Callback

from utils.errors import UserError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Runtime:
    """Where this process runs. Alone it shares nothing, and the methods below that share work do nothing; in a
    torchrun job train.py swaps in utils/parallel.py's DDP or FSDP, which share the model and the work."""

    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means no autocast
    rank: int = 0
    world: int = 1
    parallel: str = "ddp"  # train.parallel: how a torchrun job shares the model
    sharded = False  # FSDP: each rank holds a shard of the weights and of the optimizer state

    @property
    def master(self) -> bool:
        return self.rank == 0

    def autocast(self):
        if self.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def wrap(self, model, optim_name: str):
        if self.parallel == "fsdp" and optim_name == "muon":
            raise UserError(
                "optim=muon orthogonalizes whole matrices, which FSDP shards; use train.parallel=ddp, or FSDP with "
                "optim=adamw"
            )
        return model

    def sync_grads(self, runner, sync: bool):
        """Skip the gradient all-reduce on all but the last micro-batch."""
        return nullcontext()

    def all_reduce_mean(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def max_over_ranks(self, value: float) -> float:
        """The max over ranks, as a float32 (integers exact below 2**24)."""
        return value

    def any_rank(self, flag: bool) -> bool:
        """True on every rank if true on any, so all ranks stop together."""
        return bool(self.max_over_ranks(float(flag)))

    def barrier(self):
        """Wait until every rank is here."""

    def full_state(self, model, opts) -> tuple[dict, list]:
        """(model state, optimizer states), whole, on the CPU. Under FSDP a collective: every rank calls it."""
        return model.state_dict(), [o.state_dict() for o in opts]

    def load_state(self, model, opts, model_state: dict, opt_states: list):
        """full_state's inverse."""
        model.load_state_dict(model_state)
        for opt, state in zip(opts, opt_states, strict=True):
            opt.load_state_dict(state)

    def check_ranks_agree(self, model):
        """Under DDP: refuse weights that differ between ranks."""


DATASHEET_BF16 = {"H100": 989e12, "H200": 989e12}  # dense bf16 FLOP/s of the SXM parts (nanochat, PaLM count so)


def datasheet_peak(device: torch.device) -> float | None:
    """Dense bf16 datasheet FLOP/s (MFU's denominator), or None (CPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in DATASHEET_BF16.items() if key in name), None)


def keep_freed_memory():
    """Keep glibc from returning big freed blocks to the OS: on CPU the page faults of re-mmapping each step's
    activations cost about 40% of a tiny model's step."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD (an int: 1 GiB is the most)
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


def from_slurm():
    """Under hydra/launcher=slurm, export torchrun's variables from SLURM's (submitit finds the nodes and a port)."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:
        raise UserError("a multi-task SLURM job needs submitit: pip install hydra-submitit-launcher") from None
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def setup(device: str = "auto", dtype: str = "auto", seed: int = 0, parallel: str = "ddp") -> Runtime:
    from_slurm()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={device} but no CUDA GPU is visible; use device=cpu (or device=auto)")
    if device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    dev = torch.device(device)
    if dtype == "auto":
        dtype = "bf16" if dev.type == "cuda" else "fp32"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        keep_freed_memory()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", device_id=dev if dev.type == "cuda" else None)
        if dev.type == "cpu":  # share the cores between the ranks on this node
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    torch.manual_seed(seed)
    return Runtime(dev, DTYPES[dtype], rank, world, parallel)


def teardown():
    """Leave the process group; free DDP wrappers first. A wrapper freed after the group drops the last reference to a
    gloo group with the GIL held, and its destructor (bound without releasing the GIL) waits on a worker thread that
    needs the GIL: a hang at exit. The collect frees wrappers held in cycles."""
    if dist.is_initialized():
        gc.collect()
        dist.barrier()  # no rank tears down while another has collectives in flight
        dist.destroy_process_group()


class FolderBusy(Exception):
    """lock_folder's refusal: args[0] is the pid that holds the folder (0: unknown)."""


def lock_folder(folder: Path, name: str = ".lock"):
    """flock folder/name (the kernel drops it even on kill -9), write our pid, return the file; FolderBusy if held.
    unlock_folder removes the file, so a process that opened it just before may lock an unlinked file: hence the
    inode check and retry."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    while True:
        f = open(path, "a+")  # a+: never truncate a holder's pid before holding the lock
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = f.read().strip()
            f.close()
            raise FolderBusy(int(pid) if pid.isdigit() else 0) from None
        with suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        f.close()  # removed by its last holder: retry
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def unlock_folder(f):
    with suppress(FileNotFoundError):
        os.unlink(f.name)  # while still held: the next to lock it sees it gone
    f.close()


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory in MiB: allocated on CUDA, else the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use on the CPU, or None."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # inductor's own error types
        return shutil.which("g++") or shutil.which("clang++")


def should_compile(setting, device: torch.device, say=print) -> bool:
    if setting is False:
        return False
    if device.type == "cuda":
        return True
    if setting is True:
        if cxx_compiler() is None:
            raise UserError(
                "compile=true on the CPU needs a C++ compiler and none was found; install one (apt-get install g++, "
                "or set CXX) or pass compile=false"
            )
        return True
    say("compile=auto: eager on the CPU, where compiling measured no gain (bench/RESULTS.md); compile=true forces it")
    return False


# ---- SIGTERM or Ctrl-C: what is done is kept, and nothing more starts ----
# python train.py -m seed=1,2,3          the running job saves and stops (StopFlag); no later job starts (StopSweep)
# python eval.py sweep_dir=multirun/x    the runs evaluated so far keep their results; the one under way writes nothing
# python -m data.prepare data=text       the half-built folder is removed
# Where nothing can be saved, the signal raises Stopped: a SystemExit with the shell's status (130 Ctrl-C, 143
# SIGTERM), so finally blocks run and there is no traceback. Training saves and exits 0; `asked` keeps the signal's
# name so StopSweep (configs/train.yaml) starts no later job.

SIGNALS = (signal.SIGTERM, signal.SIGINT)
asked: str | None = None  # the name of the signal that asked this process to stop


class Stopped(SystemExit):
    """A signal's stop where nothing could be saved: exit status 128 + its number."""

    def __init__(self, name: str):
        super().__init__(128 + signal.Signals[name])
        self.name = name


def ask(signum: int) -> str:
    global asked
    asked = signal.Signals(signum).name
    return asked


def say(line: str):
    print(line, file=sys.stderr, flush=True)


@contextmanager
def raising(said: str | None = None):
    """Within the block SIGTERM and Ctrl-C raise Stopped at once (said: what that leaves, on stderr)."""

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
    """A -m sweep whose job a signal stopped starts no other job."""

    def on_job_start(self, config, **kwargs):
        if asked:
            which = " ".join(config.hydra.overrides.task)
            say(f"stopped by {asked}: job {config.hydra.job.num + 1} ({which}) and the later ones were not started")
            sys.exit(0)


class StopFlag:
    """SIGTERM or a first Ctrl-C: save and stop (before the loop: stop at once); a second Ctrl-C interrupts."""

    def __init__(self):
        self.requested = False
        self.name = None
        self.saving = False  # set once the loop runs
        self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}

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
