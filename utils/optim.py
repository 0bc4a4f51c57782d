"""Optimizers and the learning-rate schedule.

python train.py optim=adamw optim.lr=3e-3     python train.py optim=muon optim.lr=0.02
adamw: one AdamW; weight decay on the block matrices and the head only.
muon:  Muon for the block matrices, AdamW (optim.adam_lr) for everything else (embeddings, gains, scalars).
On the CPU, Muon below is torch.optim.Muon with Newton-Schulz in fp32 rather than emulated bf16: for the tiny model
on the 2-core CPU, 0.034 s per step against 0.83 s (bench/RESULTS.md). Same defaults and state, so checkpoints move
between the two; tests/test_optim.py bounds the rounding difference.
"""

import math

import torch
from torch import nn
from torch.optim._muon import _adjust_lr  # torch's per-matrix lr rule


def param_groups(model):
    """(block matrices, head, the rest). The rest take no weight decay: it would pull embeddings, QK-norm gains and
    sink logits towards zero, which for a gain means flatter attention, not a smaller model."""
    matrices = [m.weight for m in model.blocks.modules() if isinstance(m, nn.Linear)]
    head = [model.lm_head.weight]
    taken = {id(p) for p in matrices + head}
    rest = [p for p in model.parameters() if id(p) not in taken]
    return matrices, head, rest


def build(model, optim: dict, fused: bool = False) -> list[torch.optim.Optimizer]:
    matrices, head, rest = param_groups(model)
    muon, wd = optim["name"] == "muon", optim["weight_decay"]  # else adamw (settings allow only the two)
    groups = [{"params": head if muon else matrices + head, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]
    opts = [torch.optim.AdamW(groups, lr=optim["adam_lr" if muon else "lr"], betas=tuple(optim["betas"]), fused=fused)]
    if muon:  # Muon first: checkpoints hold [muon, adamw], and the lr logged is Muon's
        on_cpu = matrices[0].device.type == "cpu"  # its bf16 orthogonalization is emulated there, 25x slower
        options = {"momentum": optim["momentum"], "weight_decay": wd, "adjust_lr_fn": optim.get("adjust_lr_fn")}
        opts.insert(0, (Muon if on_cpu else torch.optim.Muon)(matrices, lr=optim["lr"], **options))
    for opt in opts:
        for g in opt.param_groups:
            g["base_lr"] = g["lr"]
    return opts


def lr_factor(step: int, max_steps: int, warmup: int, min_ratio: float, schedule: str) -> float:
    """Linear warmup (cut to the run's length), then cosine or linear decay to min_ratio, or constant."""
    warmup = min(warmup, max_steps)
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine


def set_lr(opts, factor: float):
    for opt in opts:
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * factor


def orthogonalize(g: torch.Tensor, coefficients, steps: int, eps: float) -> torch.Tensor:
    """torch.optim.Muon's quintic Newton-Schulz (X -> aX + (bA + cA^2)X, A = XX^T) in fp32: singular values of
    g / |g| go to about 0.7-1.2, all Muon needs."""
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
            self._init_group(group, params, grads, bufs)  # torch's checks and state
            momentum, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
            for p, g, buf in zip(params, grads, bufs, strict=True):
                buf.lerp_(g, 1 - momentum)
                update = g.lerp(buf, momentum) if group["nesterov"] else buf
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                p.mul_(1 - lr * wd)
                p.add_(update.to(p.dtype), alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss
