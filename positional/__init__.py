"""Positional schemes by name: `positional=<name>` in any entry point picks one.

Adding a scheme: one file here with a Positional subclass, one line in SCHEMES, one configs/positional/*.yaml.
python train.py init_from=out/rope train.seq_len=1024 positional.scaling=yarn positional.scaling_factor=4
A spec may carry a RoPE extension made part of the model (SCALING_KEYS): build() applies it with set_scaling, so
every model built from a saved config (train, eval, sample) rotates at the same scaled frequencies.
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

__all__ = ["SCALING_KEYS", "SCHEMES", "Positional", "PositionLimitError", "build"]
# positional.scaling (a rope_scaling kind), .scaling_factor (s) and .original_length (the length the unscaled
# frequencies were trained at): options of the spec that no scheme's constructor takes
SCALING_KEYS = ("scaling", "scaling_factor", "original_length")


def build(spec: dict, n_head: int, head_dim: int, d_model: int) -> Positional:
    """Make a scheme from its config dict ({'name': 'rope', 'base': 10000, ...})."""
    spec = dict(spec)
    scaling = {k: spec.pop(k) for k in SCALING_KEYS if k in spec}
    name = spec.pop("name")
    if name not in SCHEMES:
        raise ValueError(f"unknown positional scheme '{name}'; choose one of: {', '.join(SCHEMES)}")
    if name == "sink":  # a wrapper: its inner scheme is built from the same keys
        inner = dict(spec.pop("inner", {"name": "rope"}))
        spec["inner"] = build(inner, n_head, head_dim, d_model)
    try:
        pe = SCHEMES[name](n_head, head_dim, d_model, **spec)
    except TypeError as e:
        raise ValueError(f"positional={name}: bad option ({e})") from None
    kind = scaling.get("scaling", "none")
    if kind != "none":
        if not pe.rotary:
            raise ValueError(f"positional.scaling={kind} rescales rotary frequencies, and positional={name} has none")
        if scaling.get("original_length") is None:
            raise ValueError(f"positional.scaling={kind} needs positional.original_length (the unscaled length)")
        pe.set_scaling(kind, float(scaling.get("scaling_factor", 1.0)), int(scaling["original_length"]))
    return pe
