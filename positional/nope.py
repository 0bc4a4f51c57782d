"""NoPE: no positional information at all; causal masking alone tells tokens apart (Kazemnejad et al. 2023).

python train.py positional=nope
"""

from .base import Positional


class NoPE(Positional):
    name = "nope"
    relative = True
