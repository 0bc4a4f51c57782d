"""Data-parallel training behind a few calls: DDP (the default) or FSDP2 (train.parallel=fsdp).

torchrun --nproc_per_node=8 train.py model=d12                         DDP: every rank holds the whole model
torchrun --nproc_per_node=8 train.py model=d12 train.parallel=fsdp     FSDP2: parameters, gradients and
                                                                       optimizer state sharded over the ranks
Checkpoints hold full (unsharded) weights either way, so eval.py and sample.py load them on one device.
"""

import hashlib
from contextlib import nullcontext

import torch
import torch.distributed as dist

from utils.errors import UserError


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
