"""RMSNorm and ReLU^2 as autograd functions that make fewer passes over memory than their eager compositions.

python bench/cpu_bench.py           (nanopos against a plain GPT-2 block; these close most of the gap on the CPU)
On the CPU each eager elementwise op is its own pass over the activations, and at this model size the passes,
not the matrix multiplies, take much of a step: F.rms_norm runs as pow, mean, add, rsqrt, mul (and as many
again backward), and F.relu(x).square() allocates and saves two new tensors. Here a norm is one reduction and
one multiply forward, a dot product and two passes backward (5x faster than F.rms_norm at 1 thread); ReLU^2
saves relu(x) and its backward is one pass. Same formulas, same values (tests/test_fast_paths.py).
Under torch.compile the plain formulas are traced instead: inductor fuses them into single kernels itself.
"""

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, no weight; eps as F.rms_norm's default (the dtype's eps)."""
    if torch.compiler.is_compiling():
        return F.rms_norm(x, (x.size(-1),))
    return _RMSNorm.apply(x)


def relu_square(x: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return F.relu(x).square()
    return _ReLUSquare.apply(x)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        n, eps = x.size(-1), torch.finfo(x.dtype).eps
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        r = r.square_().div_(n).add_(eps).rsqrt_().to(x.dtype)  # (..., 1): the reciprocal RMS per row
        y = x * r
        ctx.save_for_backward(y, r)
        return y

    @staticmethod
    def backward(ctx, g):
        """dx = r (g - y mean(g y)): the norm's Jacobian, with y = x r."""
        y, r = ctx.saved_tensors
        m = torch.linalg.vecdot(g, y, dim=-1).unsqueeze(-1).div_(y.size(-1))
        return torch.addcmul(g, y, m, value=-1.0).mul_(r)


class _ReLUSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        r = torch.relu(x)
        ctx.save_for_backward(r)  # in place of the input, which is then freed: no more memory held than before
        return r.square()

    @staticmethod
    def backward(ctx, g):
        """2 relu(x) g in one pass: addcmul onto a broadcast zero (relu, mul, mul was three)."""
        (r,) = ctx.saved_tensors
        return torch.addcmul(r.new_zeros(()), r, g, value=2.0)
