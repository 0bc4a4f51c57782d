"""xPos (Sun et al. 2023, "A Length-Extrapolatable Transformer"): RoPE with an exponential decay per rotated pair.

python train.py positional=xpos positional.scale_base=512
Queries are rotated and scaled by zeta_i^(n / scale_base), keys by zeta_i^(-m / scale_base), one zeta per rotated
pair: zeta_i = (2i/Dh + gamma) / (1 + gamma), in [0.29, 1) at gamma = 0.4. Pair i of a score carries
zeta_i^((n - m) / scale_base): relative, decaying with distance, fastest in the high-frequency pairs.
Range: one factor alone is exp(1.25 n / 512), and fp32 and bf16 overflow past exp(88) (fp16 past exp(11): n ~ 4.5k).
Exponents are clamped to +-MAX_EXPONENT so that a masked placeholder position stays finite, which makes positions
past ~32k at scale_base 512 wrong rather than inf: a sink cache re-indexes within its capacity, but a dense cache or
a full forward past ~32k is out of reach. eval.rope_scaling rescales the rotation only, not the decay.
"""

from dataclasses import dataclass

import torch

from settings import setting

from .rope import RoPE, RoPEOptions, rotate_by

MAX_EXPONENT = 80.0  # exp(80) ~ 5.5e34: a query times a key still fits fp32/bf16 (3.4e38)


@dataclass
class XPosOptions(RoPEOptions):
    gamma: float = setting(0.4, "pass a positive xPos gamma", gt=0)
    scale_base: float = setting(512.0, "pass a positive xPos decay length", gt=0)


class XPos(RoPE):
    about = "RoPE with a per-pair exponential decay (Sun et al. 2023)"
    Options = XPosOptions

    def __init__(
        self, n_head, head_dim, d_model, base=10000.0, gamma=0.4, scale_base=512.0, rotary_fraction=1.0, scaling=None
    ):
        super().__init__(n_head, head_dim, d_model, base, rotary_fraction, scaling)
        self.gamma, self.scale_base = float(gamma), float(scale_base)
        zeta = (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim + self.gamma) / (1 + self.gamma)
        self.register_buffer("log_zeta", zeta.log().float(), persistent=False)

    def rotation(self, pos, scaling=None):
        """(cos, sin) times the queries' decay zeta^(n/scale_base), and times the keys' zeta^(-m/scale_base)."""
        cos, sin = super().rotation(pos, scaling)
        exponent = pos.float()[:, None] / self.scale_base * self.log_zeta[None, :]
        decay = exponent.clamp(-MAX_EXPONENT, MAX_EXPONENT).exp()
        return cos * decay, sin * decay, cos / decay, sin / decay

    def rotate(self, x, pos, rotation=None):
        cos, sin, _, _ = self.rotation(pos) if rotation is None else rotation
        return rotate_by(x, cos, sin)

    def rotate_key(self, x, pos, rotation=None):
        _, _, cos, sin = self.rotation(pos) if rotation is None else rotation
        return rotate_by(x, cos, sin)

    def extra_repr(self):
        return f"gamma={self.gamma}, scale_base={self.scale_base}, " + super().extra_repr()
