"""Optimizers and the learning-rate schedule.

python train.py optim=adamw optim.lr=3e-3     python train.py optim=muon optim.lr=0.02
adamw: one AdamW; weight decay on the block matrices and the head only.
muon:  torch.optim.Muon (on the CPU utils/muon.py's, the same in fp32) for the block matrices, AdamW
       (optim.adam_lr) for embeddings, head, positional parameters, QK-norm gains and sink logits (Muon
       orthogonalizes 2-D updates; it is not meant for embeddings, gains or scalars).
"""

import math

import torch
from torch import nn

from utils.muon import Muon


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
    """Linear warmup, then cosine or linear decay to min_ratio, or constant."""
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
