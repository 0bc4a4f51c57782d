"""p-RoPE (Barbero et al. 2025, "Round and Round We Go! What makes Rotary Positional Encodings useful?").

python train.py positional=prope positional.rotary_fraction=0.75
Only the highest rotary_fraction of RoPE's frequencies turn: the lowest, whose wavelengths exceed any context and
which the paper finds serve as semantic channels, get frequency 0. Partial RoPE (positional=rope
positional.rotary_fraction=f) differs: it squeezes RoPE's whole frequency range into the first f of the pairs.
"""

from dataclasses import dataclass

import torch

from settings import setting

from .rope import RoPE, RoPEOptions


@dataclass
class PRoPEOptions(RoPEOptions):
    rotary_fraction: float = setting(  # the paper compares 0.25 and 0.75
        0.75, "pass a fraction in (0, 1] of the frequencies to keep turning", gt=0, le=1
    )


class PRoPE(RoPE):
    about = "p-RoPE: only the fastest 75% of RoPE's frequencies turn (Barbero et al. 2025)"
    Options = PRoPEOptions

    def freq_dim(self) -> int:
        return self.head_dim

    def arrange(self, inv_freq):
        """Keep the n_rotated highest frequencies, stop the rest."""
        return torch.cat((inv_freq[: self.n_rotated], inv_freq.new_zeros(len(inv_freq) - self.n_rotated)))
