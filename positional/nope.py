"""NoPE: no positional information at all; causal masking alone tells tokens apart (Kazemnejad et al. 2023).

python train.py positional=nope
python train.py positional=nope positional.attn_scale=0.1          (with Llama 4's query temperature)
python train.py positional=irope                                   (NoPE in every 4th layer: positional/__init__.py)
The query temperature (attn_scale > 0; 0, the default, leaves queries as they are) is Llama 4's "attention
temperature tuning" of its NoPE layers, after Nakanishi 2025 (Scalable-Softmax, arXiv 2501.19399): a query at
position i is multiplied by
    temperature(i) = 1 + attn_scale * ln(1 + floor((i + 1) / floor_scale))
(HF transformers' Llama4TextAttention; Llama 4 ships attn_scale 0.1, floor_scale 8192). It is 1 for the first
floor_scale - 1 positions and then grows with the log of the length, so attention spread over ever more keys stays
about as sharp. Keys are left alone: scaling them too would square it. Positions before 0 (the learned sink tokens
of positional=sink) get 1. The temperature is the scheme's rotation state, made once per forward in the attention
plan from the explicit query positions, so a full forward, every backend and both caches apply the same factor (a
sink cache: at the query's in-cache position, as it re-indexes every relative scheme).
"""

from dataclasses import dataclass

import torch

from settings import setting

from .base import Positional, PositionalOptions


def temperature(pos: torch.Tensor, floor_scale: float, attn_scale: float) -> torch.Tensor:
    """1 + attn_scale * ln(1 + floor((pos + 1) / floor_scale)) at each position (T,), fp32; 1 before position 0."""
    steps = torch.floor((pos.float() + 1).clamp(min=0) / floor_scale)
    return 1 + attn_scale * torch.log1p(steps)


@dataclass
class NoPEOptions(PositionalOptions):
    # > 0: Llama 4's query temperature 1 + attn_scale ln(1 + floor((i + 1) / floor_scale)); 0: none
    attn_scale: float = setting(0.0, "pass the temperature's slope, 0 for none (Llama 4: 0.1)", ge=0)
    # the temperature is 1 through the training length, grows past it (a spec built in code without it: 8192)
    floor_scale: float = setting("${train.seq_len}", "pass the positions after which the query temperature grows", gt=0)


class NoPE(Positional):
    about = "no positions: the causal mask alone"  # its row in the README's scheme table (evaluation/doc_tables.py)
    Options = NoPEOptions
    relative = True  # the temperature reads the query's own position, as FIRE's normaliser (sink cache: in-cache)

    def __init__(self, n_head, head_dim, d_model, attn_scale: float = 0.0, floor_scale: float = 8192.0):
        super().__init__(n_head, head_dim, d_model)
        self.attn_scale, self.floor_scale = float(attn_scale), float(floor_scale)

    def rotation(self, pos, scaling=None):
        """The queries' temperature (T, 1) at these positions, or None without one (attn_scale 0)."""
        if not self.attn_scale:
            return None
        return temperature(pos, self.floor_scale, self.attn_scale)[:, None]

    def rotate(self, x, pos, rotation=None):
        scale = self.rotation(pos) if rotation is None else rotation
        return x if scale is None else x * scale.to(x.dtype)

    def rotate_key(self, x, pos, rotation=None):
        return x

    def extra_repr(self):
        return f"attn_scale={self.attn_scale}, floor_scale={self.floor_scale}, " + super().extra_repr()
