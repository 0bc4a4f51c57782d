"""Where and how a process runs: device, precision, and its place in a torchrun job (DDP/FSDP).

torchrun --nproc_per_node=2 train.py ...     (RANK/WORLD_SIZE from torchrun; NCCL on CUDA, gloo on CPU)
device=auto picks CUDA when present; dtype=auto is bf16 autocast on CUDA and fp32 on CPU.
A run holds a lock on its folder (lock_folder) for as long as it may write there.
compile=auto|true|false (should_compile), never a silent fallback: auto compiles on CUDA. On the CPU it trains
eagerly: measured with bench/cpu_bench.py on the 2-core machine (bench/RESULTS.md), the compiled step of the tiny
model was 0.86x to 1.06x the eager one in two runs (no gain outside the noise, since model/fused.py
already makes the eager step about as fast as a plain GPT-2 block) and compiling costs 5 s (warm inductor cache) to 26
s (cold) first; the small model compiled ran 1.04x eager after 33 s of compiling (about 220 steps to pay back, if that
4% is more than noise). Where that changes (another CPU, a larger model), pass compile=true (it needs a C++ compiler).
"""

import ctypes
import fcntl
import gc
import os
import resource
import shutil
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from utils.errors import UserError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means no autocast
    rank: int = 0
    local_rank: int = 0
    world: int = 1

    @property
    def master(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def autocast(self):
        if self.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


DATASHEET_BF16 = {"H100": 989e12, "H200": 989e12}  # dense bf16 FLOP/s of the SXM parts (nanochat, PaLM count so)


def datasheet_peak(device: torch.device) -> float | None:
    """The device's dense bf16 datasheet FLOP/s, the denominator of MFU; None where none is known (CPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in DATASHEET_BF16.items() if key in name), None)


def keep_freed_memory():
    """Stop glibc from returning big freed blocks to the OS: on CPU every step frees and re-allocates the same
    large activations, and the page faults of fresh mmaps cost about 40% of a tiny model's step."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: serve blocks up to 1 GiB from the heap (an int: no more)
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap memory for reuse
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def from_slurm():
    """Under `hydra/launcher=slurm` every task is a SLURM task, not a torchrun worker: export torchrun's
    variables from SLURM's (submitit knows the node list and a free port)."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:
        raise UserError("a multi-task SLURM job needs submitit: pip install hydra-submitit-launcher") from None
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def setup(device: str = "auto", dtype: str = "auto", seed: int = 0) -> Runtime:
    from_slurm()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={device} but no CUDA GPU is visible; use device=cpu (or device=auto)")
    if device == "cuda":
        device = f"cuda:{local_rank}"
    dev = torch.device(device)
    if dtype == "auto":
        dtype = "bf16" if dev.type == "cuda" else "fp32"
    if dev.type == "cpu":
        keep_freed_memory()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", device_id=dev if dev.type == "cuda" else None)
        if dev.type == "cpu":  # share the cores between the ranks on this node
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    torch.manual_seed(seed)
    return Runtime(dev, DTYPES[dtype], rank, local_rank, world)


def teardown():
    """Leave the process group; free the wrappers that hold it (DDP) before calling this. A DDP wrapper freed after
    the group is destroyed drops the last reference to a gloo group with the GIL held, and the group's destructor then
    waits for its worker thread, which needs the GIL to free the tensors of a finished collective: the process hangs
    at exit (torch binds that destructor without releasing the GIL). The collect frees such wrappers held in cycles."""
    if dist.is_initialized():
        gc.collect()
        dist.barrier()  # no rank tears down while another still has collectives in flight
        dist.destroy_process_group()


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(x, op=dist.ReduceOp.AVG if x.device.type == "cuda" else dist.ReduceOp.SUM)
        if x.device.type != "cuda":  # gloo has no AVG
            x /= dist.get_world_size()
    return x


def any_rank(flag: bool, device) -> bool:
    """True on every rank if it is true on any (so all ranks stop together)."""
    return bool(max_over_ranks(float(flag), device))


def max_over_ranks(value: float, device) -> float:
    """The largest of every rank's value, on every rank (a float32: integers exact below 2**24)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([float(value)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


class FolderBusy(Exception):
    def __init__(self, pid: str):
        super().__init__(f"held by pid {pid}")
        self.pid = pid


def lock_folder(folder: Path, name: str = ".lock"):
    """Take an exclusive lock on folder/name (fcntl.flock, which the kernel drops when the process dies, even by
    kill -9) and write our pid in it; returns the open file, for unlock_folder. Raises FolderBusy(the holder's pid)
    if another process holds it. unlock_folder removes the file, so a run leaves no trace; a process that opened it
    just before the removal may then lock a file no longer in the folder, hence the check that the path still names
    the file locked (else it tries again)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    while True:
        f = open(path, "a+")  # a+: never truncate the pid of a holder before holding the lock
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = f.read().strip() or "unknown"
            f.close()
            raise FolderBusy(pid) from None
        try:
            same = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()  # removed or replaced by its last holder: take the new one
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def unlock_folder(f):
    with suppress(FileNotFoundError):
        os.unlink(f.name)  # while still held: whoever locks this file next finds it gone from the folder
    f.close()


def barrier():
    if dist.is_initialized():
        dist.barrier()


def peak_memory_mb(device: torch.device) -> float:
    """The peak memory so far, MiB: the GPU's allocated peak on CUDA, else the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use on the CPU, or None."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # inductor raises its own error types when none is found
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
