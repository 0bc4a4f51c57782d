"""KERPLE: a learned per-head kernel of query-key distance added to the scores (Chi et al. 2022).

python train.py positional=kerple                       (the log variant, the paper's better one)
python train.py positional=kerple positional.variant=power
log:   bias(h, i, j) = -r1_h * log(1 + r2_h * |i - j|)
power: bias(h, i, j) = -r1_h * |i - j| ** r2_h, 0 < r2_h <= r2_max <= 2 (conditionally positive definite up to 2)
r1, r2 > 0 by construction (softplus, or r2_max * sigmoid for the power exponent). Both start at ALiBi's slopes m_h:
power as ALiBi itself (r1 = m_h, r2 = 1), log as -log(1 + m_h * d).
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from settings import choices, setting

from .alibi import alibi_slopes
from .base import Positional, PositionalOptions

Variant = choices("Variant", "log", "power")


@dataclass
class KERPLEOptions(PositionalOptions):
    variant: Variant = "log"
    r2_max: float = setting(2.0, "pass the power variant's largest exponent, in (0, 2]", gt=0, le=2)


def softplus_inverse(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


class KERPLE(Positional):
    about = "a learned per-head log (or power) kernel of distance on the scores (Chi et al. 2022)"
    Options = KERPLEOptions
    relative = True

    def __init__(self, n_head, head_dim, d_model, variant: str = "log", r2_max: float = 2.0):
        super().__init__(n_head, head_dim, d_model)
        self.variant, self.r2_max = variant, float(r2_max)
        slopes = torch.tensor(alibi_slopes(n_head))
        ones = torch.ones(n_head)
        r1, r2 = (ones, slopes) if variant == "log" else (slopes, ones.clamp(max=self.r2_max / 2))
        self.r1_raw = nn.Parameter(softplus_inverse(r1))
        self.r2_raw = nn.Parameter(softplus_inverse(r2) if variant == "log" else torch.logit(r2 / self.r2_max))

    # indexed by head before the transform: flex's backward scatters a captured tensor's gradient where score_mod
    # indexes it, and refuses one it transforms first (tests/test_flex_gradients.py)
    def r1(self, h=slice(None)) -> torch.Tensor:
        return F.softplus(self.r1_raw[h])

    def r2(self, h=slice(None)) -> torch.Tensor:
        raw = self.r2_raw[h]
        return F.softplus(raw) if self.variant == "log" else self.r2_max * torch.sigmoid(raw)

    def score_bias(self, h, q_pos, k_pos):
        d = (q_pos - k_pos).abs().float()
        r1, r2 = self.r1(h), self.r2(h)
        if self.variant == "log":
            return -r1 * torch.log1p(r2 * d)
        return -r1 * d.pow(r2)

    def extra_repr(self) -> str:
        return f"variant={self.variant}, r2_max={self.r2_max}, " + super().extra_repr()
