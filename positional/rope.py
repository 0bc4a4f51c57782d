"""RoPE: rotate each (query, key) pair of dimensions by an angle proportional to position (Su et al. 2021).

python train.py positional=rope positional.base=10000
python train.py positional=rope positional.rotary_fraction=0.25      (partial rotary, GPT-NeoX style)
python train.py experiment=gemma3      (positional.global_base: the full-attention layers at base 1M, as Gemma 3)
Scores then depend only on q_pos - k_pos. Context extensions (rope_scaling.py, rerope.py) are passed to
rotation(pos, scaling), or built in at construction (a fine-tune's positional.scaling). rotary_fraction < 1 rotates
the first fraction of each head's pairs at the frequencies of a head that many dims wide; the other pairs get
frequency 0 (cos 1, sin 0), so every backend and cache serves it unchanged.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from settings import setting

from . import rope_scaling
from .base import Positional, PositionalOptions


def rotate_by(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) over the halves of the last dim."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if torch.compiler.is_compiling():  # inductor fuses this into one kernel itself
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return _Rotate.apply(x, cos, sin)


TABLE_MIN = 1 << 17  # elements of x from which the laid-out tables pay for themselves (below: decoding, short rows)


def _rotate_into(out, x, cos, sin):
    """Write the rotation of x into out. cos and sin are first laid out over every head in x's memory order: against
    tables broadcast over the heads each op's inner loop is one 16-float half row, 2-3x slower on the CPU
    (bench/cpu_bench.py). The tables cost 25-50 us, which a small x (a decoding step) never earns back: below
    TABLE_MIN every op goes half by half (break-even near 64K elements, 1 thread)."""
    h = x.size(-1) // 2
    x1, x2, o1, o2 = x[..., :h], x[..., h:], out[..., :h], out[..., h:]
    if x.numel() < TABLE_MIN:
        torch.mul(x1, cos, out=o1)
        o1.addcmul_(x2, sin, value=-1.0)
        torch.mul(x1, sin, out=o2)
        o2.addcmul_(x2, cos)
        return out
    like = x[(0,) * (x.dim() - 3)] if x.dim() > 3 else x  # one sequence's (heads, T, Dh) in x's layout
    cos2 = torch.empty_like(like)
    cos2[..., :h], cos2[..., h:] = cos, cos
    sin2 = torch.empty_like(like)[..., :h]  # strided as x's halves are
    sin2.copy_(sin.expand_as(sin2))
    torch.mul(x, cos2, out=out)
    o1.addcmul_(x2, sin2, value=-1.0)
    o2.addcmul_(x1, sin2)
    return out


class _Rotate(torch.autograd.Function):
    """A rotation's gradient is the rotation by the opposite angle: nothing but cos and sin is saved."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate_into(torch.empty_like(x), x, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotate_into(torch.empty_like(grad), grad, cos, -sin), None, None  # in grad's own layout: no copy


@dataclass
class BaseOptions(PositionalOptions):
    """The options of a rotary scheme that takes its base alone."""

    base: float = setting(10000.0, "pass a positive rotary base", gt=0)


@dataclass
class RoPEOptions(PositionalOptions):
    base: float = setting(10000.0, "pass a positive rotary base", gt=0)
    rotary_fraction: float = setting(  # < 1: partial rotary (GPT-NeoX)
        1.0, "pass a fraction in (0, 1] of each head's dimension pairs to rotate", gt=0, le=1
    )
    # the full-attention layers' base (model.window_pattern's L; positional/__init__.py build_long). Gemma 3: 1,000,000
    global_base: float | None = setting(
        None, "pass a positive base for the full-attention layers, or null for positional.base everywhere", gt=0
    )


class RoPE(Positional):
    about = "rotary queries and keys (Su et al. 2021)"
    relative = True
    rotary = True
    Options = RoPEOptions

    def __init__(self, n_head, head_dim, d_model, base: float = 10000.0, rotary_fraction: float = 1.0, scaling=None):
        super().__init__(n_head, head_dim, d_model)
        if head_dim % 2:
            raise ValueError(f"rope needs an even head dim, got {head_dim}")
        self.base, self.rotary_fraction = float(base), float(rotary_fraction)
        self.n_rotated = round(self.rotary_fraction * head_dim / 2)  # pairs that turn
        if self.n_rotated < 1:
            raise ValueError(
                f"positional.rotary_fraction={rotary_fraction} rotates no pair of a {head_dim}-dim head; pass a "
                f"larger one"
            )
        self.scaling = scaling or rope_scaling.NONE  # a fine-tune's positional.scaling; an eval-time one: rotation()
        inv_freq, self.pos_scale, self.cos_scale = self.frequencies(self.scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        plain = self.arrange(rope_scaling.base_inv_freq(self.freq_dim(), self.base)).float()
        self.register_buffer("plain_inv_freq", plain, persistent=False)  # LongRoPE's first start_tokens positions

    def freq_dim(self) -> int:
        """The head width whose RoPE frequencies this scheme turns at (partial rotary: the rotated dims only)."""
        return 2 * self.n_rotated

    def arrange(self, inv_freq: torch.Tensor) -> torch.Tensor:
        """Those frequencies laid out over the rotated pairs: the pairs past them stand still (frequency 0)."""
        return F.pad(inv_freq, (0, self.rotated_dim() // 2 - len(inv_freq)))

    def frequencies(self, scaling) -> tuple[torch.Tensor, float, float]:
        """(inv_freq (pairs,) fp32, position scale, cos/sin scale) under a Scaling (rope_scaling.py)."""
        inv_freq, pos_scale, cos_scale = scaling.frequencies(self.freq_dim(), self.base)
        return self.arrange(inv_freq).float(), pos_scale, cos_scale

    def rotation(self, pos, scaling=None):
        """(cos, sin), each (T, Dh/2), under a Scaling (None: the one built in, which an eval-time one replaces)."""
        if scaling is None or scaling == self.scaling:
            scaling, (inv_freq, pos_scale, cos_scale) = self.scaling, (self.inv_freq, self.pos_scale, self.cos_scale)
        else:
            inv_freq, pos_scale, cos_scale = self.frequencies(scaling)
            inv_freq = inv_freq.to(self.inv_freq.device)
        if scaling.kind == "dynamic_ntk":
            dims, length = self.freq_dim(), pos.max() + 1
            inv_freq = rope_scaling.dynamic_inv_freq(dims, self.base, scaling.original_length, length, scaling.alpha)
            inv_freq = self.arrange(inv_freq)
        angles = self.angles(pos.float() * pos_scale, inv_freq)
        cos, sin = angles.cos() * cos_scale, angles.sin() * cos_scale
        if scaling.start_tokens:  # LongRoPE: the first positions rotate as in training, unscaled (as its release)
            first = pos if pos.dim() == 1 else pos[0]  # several axes: the first (M-RoPE's temporal) axis decides
            keep = (first < scaling.start_tokens)[:, None]
            plain = self.angles(pos.float(), self.plain_inv_freq)
            cos, sin = torch.where(keep, plain.cos(), cos), torch.where(keep, plain.sin(), sin)
        return cos, sin

    def angles(self, pos, inv_freq):
        """Each pair's angle (T, Dh/2): its frequency times its position, with several axes the position on the axis
        the pair turns with (pair_axis). A (T,) id is the same on every axis, so it turns exactly as in RoPE."""
        if self.axes == 1:
            return self.check_axes(pos)[:, None] * inv_freq[None, :]
        return self.per_axis(pos)[self.pair_axis].T * inv_freq[None, :]

    def rotate(self, x, pos, rotation=None):
        cos, sin = self.rotation(pos) if rotation is None else rotation
        return rotate_by(x, cos, sin)

    def extra_repr(self):
        scaling = "" if self.scaling.kind == "none" else f", scaling={self.scaling.kind} x{self.scaling.factor:g}"
        return f"base={self.base}, rotary_fraction={self.rotary_fraction}{scaling}, " + super().extra_repr()
