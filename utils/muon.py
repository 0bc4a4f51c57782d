"""torch.optim.Muon with its Newton-Schulz orthogonalization in fp32, for the CPU.

python train.py optim=muon          (utils/optim.py picks it when the matrices live on the CPU)
torch.optim.Muon orthogonalizes every update in bf16, which suits a GPU's tensor cores; a CPU without bf16 matmul
units emulates it. For the tiny model's 24 block matrices, on the 2-core CPU here: 0.83 s per step in bf16
against 0.034 s in fp32, as long as the forward and backward of a whole 8192-token batch (bench/RESULTS.md).
Everything else is torch's: the same defaults, the same Nesterov momentum and learning-rate adjustment, the
same state ("momentum_buffer"), so checkpoints move between the two. Only the arithmetic differs: fp32 instead
of bf16 rounding, which tests/test_optim.py bounds.
"""

import torch
from torch.optim._muon import _adjust_lr  # torch's per-matrix lr rule, reused as it is


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
