"""Fused RMSNorm, ReLU^2 and output head: autograd functions making fewer passes over memory than eager torch.

python train.py          (every training and evaluation forward goes through here)
python bench/cpu_bench.py           (nanopos against a plain GPT-2 block; these close most of the gap on the CPU)
At this size, on the CPU, elementwise passes rather than matmuls take much of a step. The norm is one reduction and one
multiply (5x faster than F.rms_norm at 1 thread); ReLU^2 saves relu(x) and is one pass backward. The head computes
CE(c tanh(x W^T / c), y) a chunk of rows at a time, gradient included, so no B x T x V logits tensor exists (128 MiB
at B x T = 8192, V = 4096; on a GPU at a 50K vocabulary, the memory peak). Same values as the plain formulas
(tests/test_fast_paths.py), which torch.compile traces instead, fusing them itself.
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


CHUNK_BYTES = {"cpu": 8 << 20, "cuda": 512 << 20}  # fp32 logits per chunk: 8 MiB is 512 rows at V = 4096
CHUNK_ROWS = None  # None: from CHUNK_BYTES (measured on the 2-core CPU: 512 rows beat 256, 1024 and 2048)


def chunk_rows(device: torch.device, vocab: int) -> int:
    if CHUNK_ROWS is not None:
        return CHUNK_ROWS
    return max(128, CHUNK_BYTES.get(device.type, CHUNK_BYTES["cuda"]) // (4 * vocab))


def softcapped_logits(x: torch.Tensor, weight: torch.Tensor, softcap: float) -> torch.Tensor:
    logits = F.linear(x, weight).float()
    return softcap * torch.tanh(logits / softcap)


def head_loss(x, weight, targets, softcap: float, reduction: str = "mean") -> torch.Tensor:
    """CE(softcap * tanh(x W^T / softcap), targets) with ignore_index -1; reduction mean, sum or none."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be mean, sum or none, got {reduction}")
    if torch.compiler.is_compiling():
        logits = softcapped_logits(x, weight, softcap)
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=-1, reduction=reduction)
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    with torch.autocast(x.device.type, enabled=False):
        out = _ChunkedHead.apply(x.to(dtype), weight.to(dtype), targets, float(softcap), reduction)
    return out.view(targets.shape) if reduction == "none" else out


def _chunks(x, weight, targets, softcap: float, row_grad=None):
    """Yield (rows, nll, g, scale) per chunk; with row_grad the raw logits' gradient is g * scale[:, None], the
    caller scaling the small (rows, d) operands instead. Capped logits lie in [-c, c], so exp needs no max
    subtraction in fp32. tanh(v) = 2 sigmoid(2v) - 1: torch's CPU sigmoid is about twice as fast as its tanh."""
    step = min(chunk_rows(x.device, weight.size(0)), len(targets))
    sig_buf = torch.empty(step, weight.size(0), device=x.device)  # reused: every pass in place
    exp_buf = torch.empty_like(sig_buf)
    minus_c = torch.full((), -softcap, device=x.device)
    for start in range(0, len(targets), step):
        rows = slice(start, start + step)
        t = targets[rows]
        sig, e = sig_buf[: len(t)], exp_buf[: len(t)]
        _linear_into(sig, x[rows] * (2.0 / softcap), weight).sigmoid_()  # tanh(u/c) = 2 sig - 1
        torch.add(minus_c, sig, alpha=2.0 * softcap, out=e).exp_()  # exp(s), s = c (2 sig - 1)
        total = e.sum(dim=-1)
        valid = t != -1
        safe_t = t.clamp(min=0)[:, None]
        sig_t = sig.gather(1, safe_t)[:, 0]
        nll = (total.log() - softcap * (2.0 * sig_t - 1.0)) * valid
        if row_grad is None:
            yield rows, nll, None, None
            continue
        g = sig.addcmul_(sig, sig, value=-1.0).mul_(e)  # exp(s) sig (1 - sig) = exp(s) (1 - tanh^2) / 4
        g.scatter_add_(1, safe_t, -(total * sig_t * (1.0 - sig_t))[:, None])  # minus S * onehot * that
        yield rows, nll, g, 4.0 * valid * row_grad[rows] / total


def _linear_into(out, x, weight):
    if weight.dtype == torch.float32:
        return torch.matmul(x, weight.t(), out=out)
    return out.copy_(F.linear(x, weight))


class _ChunkedHead(torch.autograd.Function):
    """Summed or mean NLL with its gradients made in forward (backward scales them), or per-row NLL (recomputed)."""

    @staticmethod
    def forward(ctx, x, weight, targets, softcap, reduction):
        x2, t = x.reshape(-1, x.size(-1)), targets.reshape(-1)
        ctx.reduction, ctx.softcap, ctx.x_shape = reduction, softcap, x.shape
        if reduction == "none":
            nll = torch.empty(len(t), device=x.device)
            for rows, nll_c, _, _ in _chunks(x2, weight, t, softcap):
                nll[rows] = nll_c
            ctx.save_for_backward(x2, weight, t)
            return nll
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        n = (t != -1).sum().clamp(min=1) if reduction == "mean" else torch.ones((), device=x.device)
        total = torch.zeros((), device=x.device)
        gx, gw = (torch.empty_like(x2), _zeros32(weight)) if want_grad else (None, None)
        row_grad = (1.0 / n).expand(len(t)) if want_grad else None
        for rows, nll_c, g, scale in _chunks(x2, weight, t, softcap, row_grad):
            total += nll_c.sum()
            if want_grad:
                _accumulate(g, scale, x2[rows], weight, gx[rows], gw)
        ctx.save_for_backward(gx, gw)
        ctx.w_dtype = weight.dtype
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.reduction != "none":
            gx, gw = ctx.saved_tensors
            grad_out = grad_out.to(gx.dtype)
            return (gx * grad_out).view(ctx.x_shape), (gw * grad_out.float()).to(ctx.w_dtype), None, None, None
        x2, weight, t = ctx.saved_tensors
        gx, gw = torch.empty_like(x2), _zeros32(weight)
        for rows, _, g, scale in _chunks(x2, weight, t, ctx.softcap, grad_out.float()):
            _accumulate(g, scale, x2[rows], weight, gx[rows], gw)
        return gx.view(ctx.x_shape), gw.to(weight.dtype), None, None, None


def _zeros32(weight):
    return torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)


def _accumulate(g, scale, x_rows, weight, gx_rows, gw):
    """With the logits' gradient G = g * scale[:, None]: gx_rows = G W and gw += G^T x, summed in fp32."""
    g, scale = g.to(weight.dtype), scale.to(weight.dtype)[:, None]
    torch.matmul(g, weight, out=gx_rows)
    gx_rows.mul_(scale)
    if gw.dtype == weight.dtype:
        gw.addmm_(g.t(), x_rows * scale)
    else:
        gw += (g.t() @ (x_rows * scale)).float()
