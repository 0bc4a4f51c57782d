"""NoPE: no positional information at all; causal masking alone tells tokens apart (Kazemnejad et al. 2023).

python train.py positional=nope
python train.py positional=nope positional.attn_scale=0.1          (with Llama 4's query temperature)
python train.py positional=irope                                   (NoPE in every 4th layer: positional/__init__.py)
attn_scale > 0 multiplies a query at position i by Llama 4's attention temperature of its NoPE layers (after
Scalable-Softmax, Nakanishi 2025, arXiv 2501.19399; HF Llama4TextAttention; Llama 4 ships 0.1 and floor_scale 8192):
    temperature(i) = 1 + attn_scale * ln(1 + floor((i + 1) / floor_scale))
It is 1 for the first floor_scale - 1 positions, then grows with the log of the length, so attention over ever more
keys stays about as sharp. Keys are left alone (scaling them too would square it); sink tokens (positions < 0) get 1.
The temperature is the rotation state, so every backend and cache applies the same factor (a sink cache: at the
query's in-cache position).
"""

from dataclasses import dataclass

import torch

from settings import setting

from .base import Positional, PositionalOptions


@dataclass
class NoPEOptions(PositionalOptions):
    attn_scale: float = setting(0.0, "pass the temperature's slope, 0 for none (Llama 4: 0.1)", ge=0)
    # 1 through the training length, growing past it (a spec built in code without it: 8192)
    floor_scale: float = setting("${train.seq_len}", "pass the positions after which the query temperature grows", gt=0)


class NoPE(Positional):
    about = "no positions: the causal mask alone"
    Options = NoPEOptions
    relative = True  # the temperature reads the query's in-cache position, as FIRE's normaliser

    def __init__(self, n_head, head_dim, d_model, attn_scale: float = 0.0, floor_scale: float = 8192.0):
        super().__init__(n_head, head_dim, d_model)
        self.attn_scale, self.floor_scale = float(attn_scale), float(floor_scale)

    def rotation(self, pos, scaling=None):
        """The queries' temperature (T, 1) fp32 at these positions (1 before position 0), or None without one."""
        if not self.attn_scale:
            return None
        steps = torch.floor((pos.float() + 1).clamp(min=0) / self.floor_scale)
        return (1 + self.attn_scale * torch.log1p(steps))[:, None]

    def rotate(self, x, pos, rotation=None):
        scale = self.rotation(pos) if rotation is None else rotation
        return x if scale is None else x * scale.to(x.dtype)

    def rotate_key(self, x, pos, rotation=None):
        return x

    def extra_repr(self):
        return f"attn_scale={self.attn_scale}, floor_scale={self.floor_scale}, " + super().extra_repr()
