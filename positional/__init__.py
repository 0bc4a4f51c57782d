"""Positional schemes by name: `positional=<name>` in any entry point picks one.

Adding a scheme: one file here with a Positional subclass, one line in SCHEMES, one configs/positional/*.yaml.
"""

from .alibi import ALiBi
from .base import Positional, PositionLimitError
from .fire import FIRE
from .fox import FoX
from .kerple import KERPLE
from .learned import Learned
from .nope import NoPE
from .pope import PoPE
from .prope import PRoPE
from .rope import RoPE
from .shaw import Shaw
from .sink import Sink
from .sinusoidal import Sinusoidal
from .t5 import T5
from .xpos import XPos

SCHEMES = {
    cls.name: cls
    for cls in (Learned, Sinusoidal, ALiBi, RoPE, NoPE, Sink, T5, KERPLE, FIRE, Shaw, FoX, XPos, PRoPE, PoPE)
}

__all__ = ["SCHEMES", "Positional", "PositionLimitError", "build"]


def build(spec: dict, n_head: int, head_dim: int, d_model: int) -> Positional:
    """Make a scheme from its config dict ({'name': 'rope', 'base': 10000, ...})."""
    spec = dict(spec)
    name = spec.pop("name")
    if name not in SCHEMES:
        raise ValueError(f"unknown positional scheme '{name}'; choose one of: {', '.join(SCHEMES)}")
    if name == "sink":  # a wrapper: its inner scheme is built from the same keys
        inner = dict(spec.pop("inner", {"name": "rope"}))
        spec["inner"] = build(inner, n_head, head_dim, d_model)
    try:
        return SCHEMES[name](n_head, head_dim, d_model, **spec)
    except TypeError as e:
        raise ValueError(f"positional={name}: bad option ({e})") from None
