"""FoPE (Hua et al. 2025, ICML, "Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length
Generalization"): each dimension pair a Fourier series of RoPE's frequencies, the under-trained ones clipped.

python train.py positional=fope                          (the frequencies that turn a full period within train.seq_len)
python train.py positional=fope positional.sigma=0.4     (the coefficients' spread: the release's 0.3, 0.4, 0.6)
As the released code computes it (TsinghuaC3I/Fourier-Position-Embedding, its configs' settings): RoPE's frequencies
theta_j = base^(-2j/Dh) below 2 pi / L (L the training length) are clipped to zero and dropped, leaving D; each of the
first d_out = min(D, Dh/4) pairs m of a query or key at position t is transformed by
  C_m(t) = sum_j cos(theta_j t) a_jm,   S_m(t) = sum_j sin(theta_j t) b_jm,   (x1, x2) -> (x1 C - x2 S, x1 S + x2 C)
and every other pair by C = S = 1 (zero frequency, a phase of 45 degrees, as the release pads it). a and b are fixed
random coefficients, never trained: an identity-like eye (a 1 at every ceil(D / d_out)-th frequency) plus
xavier-normal noise of gain sigma, drawn as the release draws a (heads, D, d_out) tensor. Not a rotation, so scores
depend on absolute positions (relative = False). Two choices the release makes otherwise: one set of coefficients
for all heads (its fourier_separate_head=false: a key/value head serves several query heads here) and for all
layers (the release draws them per block); both are in the plan once per forward, as RoPE's cos and sin.
"""

import math
from dataclasses import dataclass

import torch

from settings import setting

from .base import Positional, PositionalOptions
from .rope import rotate_by
from .rope_scaling import base_inv_freq, full_turns


@dataclass
class FoPEOptions(PositionalOptions):
    base: float = setting(10000.0, "pass a positive rotary base", gt=0)
    # the training length L: frequencies that turn a full period within it are kept (the release's floor, 2 pi / L)
    train_length: int = setting(
        "${train.seq_len}", "pass the length the kept frequencies must turn a full period in", ge=2
    )
    # the coefficients' noise (the release: 0.3 at 60M parameters, 0.4 at 180M, 0.6 at 1.2B); 0: RoPE on the kept
    sigma: float = setting(0.3, "pass the coefficients' xavier gain, 0 for none", ge=0)


def coefficients(n: int, d_out: int, sigma: float, n_head: int) -> torch.Tensor:
    """(n, d_out) fp32: the release's eye_xavier_norm init of a (n_head, n, d_out) tensor, for one head: normal noise
    of std sigma sqrt(2 / ((n + n_head) d_out)), then +1 at (i * step, i), step = ceil(n / d_out)."""
    coef = torch.randn(n, d_out) * sigma * math.sqrt(2.0 / ((n + n_head) * d_out))
    step = -(-n // d_out)
    for i in range(d_out):
        if i * step < n:
            coef[i * step, i] += 1.0
    return coef


class FoPE(Positional):
    about = "FoPE: each pair a Fourier series of RoPE's frequencies, the untrained ones clipped (Hua et al. 2025)"
    Options = FoPEOptions

    def __init__(self, n_head, head_dim, d_model, base=10000.0, train_length: int = 256, sigma: float = 0.3):
        super().__init__(n_head, head_dim, d_model)
        if head_dim % 2:
            raise ValueError(f"fope needs an even head dim, got {head_dim}")
        theta = base_inv_freq(head_dim, base)[: full_turns(head_dim, base, train_length)]  # the highest first
        if len(theta) == 0:
            raise ValueError(
                f"positional.train_length={train_length}: no frequency turns a full period within it; pass a longer "
                f"length"
            )
        self.base, self.train_length, self.sigma = float(base), int(train_length), float(sigma)
        self.d_out = min(len(theta), max(1, head_dim // 4))
        self.register_buffer("theta", theta.float(), persistent=False)
        # fixed, not trained, and random: kept in the state dict, so a checkpoint holds the ones it was trained with
        self.register_buffer("cos_coef", coefficients(len(theta), self.d_out, self.sigma, n_head))
        self.register_buffer("sin_coef", coefficients(len(theta), self.d_out, self.sigma, n_head))

    def rotation(self, pos, scaling=None):
        """(C, S), each (T, Dh/2) fp32: the first d_out pairs' series at each position, the others 1."""
        angles = self.check_axes(pos).float()[:, None] * self.theta[None, :]
        ones = angles.new_ones(len(pos), self.head_dim // 2 - self.d_out)
        cos = torch.cat((angles.cos() @ self.cos_coef, ones), dim=-1)
        sin = torch.cat((angles.sin() @ self.sin_coef, ones), dim=-1)
        return cos, sin

    def rotate(self, x, pos, rotation=None):
        cos, sin = self.rotation(pos) if rotation is None else rotation
        return rotate_by(x, cos, sin)

    def extra_repr(self):
        return (
            f"base={self.base}, kept={len(self.theta)}, d_out={self.d_out}, sigma={self.sigma}, " + super().extra_repr()
        )
