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
import hashlib
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


# ---- stops asked for by SIGTERM or Ctrl-C: what is done is kept, and nothing more starts ----
# python train.py -m seed=1,2,3          the running job saves and stops (StopFlag); no later job starts (StopSweep)
# python eval.py sweep_dir=multirun/x    the runs evaluated so far keep their results; the one under way writes nothing
# python -m data.prepare data=text       the half-built folder is removed; nothing else changes
# Where nothing can be saved (data preparation, an evaluation), the signal raises Stopped where the program is: a
# SystemExit with the shell's status for the signal (130 for Ctrl-C, 143 for SIGTERM), so every finally block runs (a
# temp file or folder removed, a lock released), Hydra starts no other job, and the process ends without a traceback.
# A training run saves first and exits 0; `asked` keeps the signal's name for the rest of the process, so that
# StopSweep (a Hydra callback in configs/train.yaml) starts no other job after it.

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
            say(f"stopped by {asked}: job {config.hydra.job.num + 1} ({which}) and the later ones were not started")
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


# ---- many processes: DDP or FSDP wrapping, their checkpoints' state, and ranks that must agree ----
# torchrun --nproc_per_node=8 train.py model=d12                       DDP: every rank holds the whole model
# torchrun --nproc_per_node=8 train.py model=d12 train.parallel=fsdp   FSDP2: parameters, gradients and optimizer
#                                                                      state sharded over the ranks
# Checkpoints hold full (unsharded) weights either way, so eval.py and sample.py load them on one device.


def wrap(model, rt, parallel: str, optim_name: str):
    """The module the training loop calls: the model itself, or its DDP / FSDP2 wrapping."""
    if parallel == "fsdp" and optim_name == "muon":
        raise UserError(
            "optim=muon orthogonalizes whole matrices, which FSDP shards; use train.parallel=ddp, or FSDP with "
            "optim=adamw"
        )
    if not rt.distributed:
        return model
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mixed = rt.dtype != torch.float32  # gather bf16 parameters, reduce gradients in fp32
    kwargs = {"mp_policy": MixedPrecisionPolicy(param_dtype=rt.dtype, reduce_dtype=torch.float32)} if mixed else {}
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def optimizer_format(rt, parallel: str) -> str:
    """How optimizer state is keyed in a checkpoint: a resumed run must read it the same way."""
    return "fsdp" if parallel == "fsdp" and rt.distributed else "plain"


def sync_grads(runner, parallel: str, sync: bool):
    """Gradient accumulation: skip the gradient all-reduce on all but the last micro-batch."""
    if not dist.is_initialized():
        return nullcontext()
    if parallel == "fsdp":
        runner.set_requires_gradient_sync(sync)
        return nullcontext()
    return nullcontext() if sync else runner.no_sync()


def _fsdp(parallel: str) -> bool:
    return parallel == "fsdp" and dist.is_initialized()


def full_state(model, opts, parallel: str):
    """(model state, optimizer states) as whole tensors on the CPU; gathered from the shards under FSDP (a
    collective: every rank calls it; only rank 0 gets the tensors)."""
    if not _fsdp(parallel):
        return model.state_dict(), [o.state_dict() for o in opts]
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), [
        get_optimizer_state_dict(model, o, options=options) for o in opts
    ]


def load_state(model, opts, model_state: dict, opt_states: list, parallel: str, path=None):
    """Weights and optimizer moments from a checkpoint (path, for the message); the optimizer's hyperparameters (lr,
    betas, weight decay) stay as this run's config built them, so a resume with a lower optim.lr takes it. Moments of
    another optimizer, or of other parameters, are one line."""
    hyper = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in opts]
    try:
        _load_state(model, opts, model_state, opt_states, parallel)
        if why := moments_problem(opts):
            raise ValueError(why)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise UserError(
            f"checkpoint {path} holds optimizer state that does not fit this run's optimizer "
            f"({' '.join(str(e).split())[:200]}); resume with the optim= it was trained with, or start afresh in "
            f"another out_dir"
        ) from None
    for opt, groups in zip(opts, hyper, strict=True):
        for group, settings in zip(opt.param_groups, groups, strict=True):
            group.update(settings)


def _load_state(model, opts, model_state: dict, opt_states: list, parallel: str):
    if not _fsdp(parallel):
        model.load_state_dict(model_state)
        for opt, state in zip(opts, opt_states, strict=True):
            opt.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    for opt, state in zip(opts, opt_states, strict=True):
        set_optimizer_state_dict(model, opt, state, options=options)


def moments_problem(opts) -> str | None:
    """A loaded moment whose shape is not its parameter's (torch checks only the groups' sizes), or None."""
    for opt in opts:
        for p, state in opt.state.items():
            for name, t in state.items():
                if isinstance(t, torch.Tensor) and t.dim() and t.shape != p.shape:
                    return f"a {name} of shape {list(t.shape)} for a parameter of shape {list(p.shape)}"
    return None


def digest(state: dict) -> str:
    h = hashlib.sha256()
    for t in state.values():
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def check_ranks_agree(model, rt, parallel: str):
    """Under DDP every rank must end with the same weights: say so, or stop with an error."""
    if not rt.distributed or parallel != "ddp":
        return
    digests = [None] * rt.world
    dist.all_gather_object(digests, digest(model.state_dict()))
    if len(set(digests)) != 1:
        raise RuntimeError(f"DDP ranks ended with different weights: {digests}")
    if rt.master:
        print(f"weights identical on {rt.world} ranks (sha256 {digests[0]})", flush=True)
