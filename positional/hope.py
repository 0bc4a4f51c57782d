"""HoPE (Chen et al. 2025, ACL, "HoPE: A Novel Positional Encoding Without Long-Term Decay for Enhanced Context
Awareness and Extrapolation"): RoPE that keeps only its high frequencies, with no long-term decay.

python train.py positional=hope                          (the pairs that turn a full period within train.seq_len)
python eval.py checkpoint=out/hope eval.rope_scaling=yarn
The pairs whose wavelength 2 pi / theta_j is longer than the training length get frequency 0 (cos 1, sin 0): they
carry content whatever the distance, the rest rotate as in RoPE. The paper finds that these slow components settle
into a constant pattern in a trained RoPE model and shape its U-shaped attention. The cut used here, theta_j >=
2 pi / L, is the one DaRoPE (Levy et al. 2025), which trains HoPE as a baseline, and a second reimplementation state;
the HoPE paper's own method section was not checked. At the tiny model (head dim 32, base 10,000, L = 256) 7 of 16
pairs rotate. The cut is made once, at train_length, so an eval-time scaling rescales the pairs that rotate.
"""

import math
from dataclasses import dataclass

from settings import setting

from .base import PositionalOptions
from .prope import PRoPE
from .rope_scaling import full_turns


@dataclass
class HoPEOptions(PositionalOptions):
    base: float = setting(10000.0, "pass a positive rotary base", gt=0)
    # the training length L: pairs that turn a full period within it rotate, the others are still
    train_length: int = setting("${train.seq_len}", "pass the length the kept pairs must turn a full period in", ge=2)


class HoPE(PRoPE):
    about = "HoPE: only RoPE's pairs that turn a full period within the training length rotate (Chen et al. 2025)"
    Options = HoPEOptions

    def __init__(self, n_head, head_dim, d_model, base: float = 10000.0, train_length: int = 256, scaling=None):
        # train_length 256: the default train.seq_len, for a spec built in code
        kept = full_turns(head_dim, base, train_length)
        if kept == 0:
            raise ValueError(
                f"positional.train_length={train_length}: no pair turns a full period within it (the fastest takes "
                f"{2 * math.pi:.2f} positions); pass a longer length"
            )
        super().__init__(n_head, head_dim, d_model, base, kept / (head_dim // 2), scaling)
