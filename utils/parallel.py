"""Many processes: DDP or FSDP over the process group runtime.setup joined.

torchrun --nproc_per_node=8 train.py model=d12                       DDP: every rank holds the whole model
torchrun --nproc_per_node=8 train.py model=d12 train.parallel=fsdp   FSDP2: everything sharded over the ranks
Checkpoints hold full weights either way, so eval.py and sample.py load them on one device.
"""

import hashlib
from contextlib import nullcontext

import torch
import torch.distributed as dist

from utils.runtime import Runtime


def ranks(rt: Runtime) -> Runtime:
    """rt as a rank of its torchrun job, sharing the model as train.parallel says."""
    return {"ddp": DDP, "fsdp": FSDP}[rt.parallel](**vars(rt))


class Ranks(Runtime):
    """What DDP and FSDP share: the collectives that keep the ranks in step."""

    def all_reduce_mean(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, op=dist.ReduceOp.AVG if x.device.type == "cuda" else dist.ReduceOp.SUM)
        if x.device.type != "cuda":  # gloo has no AVG
            x /= dist.get_world_size()
        return x

    def max_over_ranks(self, value: float) -> float:
        t = torch.tensor([float(value)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def barrier(self):
        dist.barrier()


class DDP(Ranks):
    def wrap(self, model, optim_name: str):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def sync_grads(self, runner, sync: bool):
        return nullcontext() if sync else runner.no_sync()

    def check_ranks_agree(self, model):
        h = hashlib.sha256()
        for t in model.state_dict().values():
            h.update(t.detach().float().cpu().numpy().tobytes())
        digests = [None] * self.world
        dist.all_gather_object(digests, h.hexdigest()[:16])
        if len(set(digests)) != 1:
            raise RuntimeError(f"DDP ranks ended with different weights: {digests}")
        if self.master:
            print(f"weights identical on {self.world} ranks (sha256 {digests[0]})", flush=True)


class FSDP(Ranks):
    sharded = True

    def wrap(self, model, optim_name: str):
        super().wrap(model, optim_name)  # refuses Muon
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)  # reduce gradients in fp32
        kwargs = {"mp_policy": policy} if self.dtype != torch.float32 else {}  # gather bf16 parameters
        for block in model.blocks:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        return model

    def sync_grads(self, runner, sync: bool):
        runner.set_requires_gradient_sync(sync)
        return nullcontext()

    def full_state(self, model, opts) -> tuple[dict, list]:
        from torch.distributed.checkpoint import state_dict as dcp

        options = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
        return dcp.get_model_state_dict(model, options=options), [
            dcp.get_optimizer_state_dict(model, o, options=options) for o in opts
        ]

    def load_state(self, model, opts, model_state: dict, opt_states: list):
        from torch.distributed.checkpoint import state_dict as dcp

        options = dcp.StateDictOptions(full_state_dict=True)
        dcp.set_model_state_dict(model, model_state, options=options)
        for opt, state in zip(opts, opt_states, strict=True):
            dcp.set_optimizer_state_dict(model, opt, state, options=options)
