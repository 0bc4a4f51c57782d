"""Optimizers and the learning-rate schedule.

python train.py optim=adamw optim.lr=3e-3     python train.py optim=muon optim.lr=0.02
adamw: one AdamW; weight decay on the block matrices and the head only.
muon:  torch.optim.Muon (on the CPU Muon below, the same in fp32) for the block matrices, AdamW
       (optim.adam_lr) for embeddings, head, positional parameters, QK-norm gains and sink logits (Muon
       orthogonalizes 2-D updates; it is not meant for embeddings, gains or scalars).
Muon below: torch.optim.Muon with its Newton-Schulz orthogonalization in fp32, for the CPU. torch.optim.Muon
orthogonalizes every update in bf16, which suits a GPU's tensor cores; a CPU without bf16 matmul units emulates it.
For the tiny model's 24 block matrices, on the 2-core CPU here: 0.83 s per step in bf16 against 0.034 s in fp32, as
long as the forward and backward of a whole 8192-token batch (bench/RESULTS.md). Everything else is torch's: the same
defaults, the same Nesterov momentum and learning-rate adjustment, the same state ("momentum_buffer"), so checkpoints
move between the two. Only the arithmetic differs: fp32 instead of bf16 rounding, which tests/test_optim.py bounds.
"""

import math

import torch
from torch import nn
from torch.optim._muon import _adjust_lr  # torch's per-matrix lr rule, reused as it is


def param_groups(model):
    """(block matrices: the weights of the blocks' linear layers, head, the rest). The rest take no weight decay:
    decay would pull embeddings, QK-norm gains (model.qk_norm=learned, a (heads, head dim) matrix that is no
    projection) and sink logits towards zero, which for a gain means flatter attention, not a smaller model."""
    matrices = [m.weight for m in model.blocks.modules() if isinstance(m, nn.Linear)]
    head = [model.lm_head.weight]
    taken = {id(p) for p in matrices + head}
    rest = [p for p in model.parameters() if id(p) not in taken]
    return matrices, head, rest


def build(model, optim: dict, fused: bool = False) -> list[torch.optim.Optimizer]:
    matrices, head, rest = param_groups(model)
    betas, wd = tuple(optim["betas"]), optim["weight_decay"]
    if optim["name"] == "adamw":
        groups = [{"params": matrices + head, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]
        opts = [torch.optim.AdamW(groups, lr=optim["lr"], betas=betas, fused=fused)]
    elif optim["name"] == "muon":
        on_cpu = matrices[0].device.type == "cpu"  # its bf16 orthogonalization is emulated there, 25x slower
        muon = (Muon if on_cpu else torch.optim.Muon)(
            matrices,
            lr=optim["lr"],
            momentum=optim["momentum"],
            weight_decay=wd,
            adjust_lr_fn=optim.get("adjust_lr_fn"),
        )
        adam = torch.optim.AdamW(
            [{"params": head, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}],
            lr=optim["adam_lr"],
            betas=betas,
            fused=fused,
        )
        opts = [muon, adam]
    else:
        raise ValueError(f"unknown optim.name '{optim['name']}'; choose adamw or muon")
    for opt in opts:
        for g in opt.param_groups:
            g["base_lr"] = g["lr"]
    return opts


def lr_factor(step: int, max_steps: int, warmup: int, min_ratio: float, schedule: str) -> float:
    """Linear warmup, then cosine or linear decay to min_ratio, or constant. A warmup longer than the run is the whole
    run (a shortened command keeps its default warmup): the rate reaches its peak at the last step."""
    warmup = min(warmup, max_steps)
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown train.schedule '{schedule}'; choose cosine, linear or constant")


def set_lr(opts, factor: float):
    for opt in opts:
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * factor


def orthogonalize(g: torch.Tensor, coefficients, steps: int, eps: float) -> torch.Tensor:
    """The quintic Newton-Schulz iteration torch.optim.Muon runs (X -> aX + (bA + cA^2)X, A = XX^T) in fp32: it
    pushes every singular value of g / |g| towards 1 (to about 0.7-1.2, which is all Muon needs)."""
    a, b, c = coefficients
    x = g.float()
    wide = x.size(0) <= x.size(1)
    x = x if wide else x.T  # the Gram matrix on the short side
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x if wide else x.T


class Muon(torch.optim.Muon):
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)  # torch's own: its checks and its state
            momentum, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
            for p, g, buf in zip(params, grads, bufs, strict=True):
                buf.lerp_(g, 1 - momentum)
                update = g.lerp(buf, momentum) if group["nesterov"] else buf
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                p.mul_(1 - lr * wd)
                p.add_(update.to(p.dtype), alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss
