"""Positional schemes by name: `positional=<name>` in any entry point picks one.

Adding a scheme: one file here with a Positional subclass, one line in SCHEMES, one configs/positional/*.yaml.

Per-layer schemes (iRoPE, Llama 4):
python train.py positional=irope                                 (rope, positional.layers=PPPN: NoPE in every 4th layer)
python train.py positional=alibi +positional.layers=PPN          (any scheme that acts in attention)
positional.layers is a pattern tiled over the layers, as model.window_pattern is: P a layer of the scheme, N a layer
with no positions (NoPE), whose query temperature positional.attn_scale and positional.floor_scale set (nope.py).
build_layers makes the two schemes; the model gives each layer its own and the attention plan one plan per scheme.

python train.py init_from=out/rope train.seq_len=1024 positional.scaling=yarn positional.scaling_factor=4
A spec may carry a RoPE extension made part of the model (SCALING_KEYS): build() gives it to the scheme, so
every model built from a saved config (train, eval, sample) rotates at the same scaled frequencies.
"""

import re

from .alibi import ALiBi
from .base import Positional, PositionAxesError, PositionLimitError
from .fire import FIRE
from .fox import FoX
from .kerple import KERPLE
from .learned import Learned
from .mrope import MRoPE
from .nope import NoPE
from .pope import PoPE
from .prope import PRoPE
from .rope import RoPE
from .rope2d import RoPE2D
from .rope_scaling import Scaling
from .shaw import Shaw
from .sink import Sink
from .sinusoidal import Sinusoidal
from .sinusoidal2d import Sinusoidal2D
from .sinusoidal3d import Sinusoidal3D
from .t5 import T5
from .xpos import XPos

SCHEMES = {
    cls.name: cls
    for cls in (Learned, Sinusoidal, ALiBi, RoPE, NoPE, Sink, T5, KERPLE, FIRE, Shaw, FoX, XPos, PRoPE, PoPE)
    + (RoPE2D, MRoPE, Sinusoidal2D, Sinusoidal3D)  # multi-axis positions (grids, images): pos (axes, T)
}

__all__ = [
    "SCALING_KEYS",
    "SCHEMES",
    "PositionAxesError",
    "Positional",
    "PositionLimitError",
    "build",
    "build_layers",
    "layer_pattern",
]
NOPE_OPTIONS = ("attn_scale", "floor_scale")  # with positional.layers: the N layers' query temperature (nope.py)
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
    kind = scaling.get("scaling", "none")
    if name == "sink":  # a wrapper: its inner scheme is built from the same keys, and takes the scaling
        spec["inner"] = build({**spec.pop("inner", {"name": "rope"}), **scaling}, n_head, head_dim, d_model)
    elif kind != "none":
        if not SCHEMES[name].rotary:
            raise ValueError(f"positional.scaling={kind} rescales rotary frequencies, and positional={name} has none")
        if scaling.get("original_length") is None:
            raise ValueError(f"positional.scaling={kind} needs positional.original_length (the unscaled length)")
        spec["scaling"] = Scaling(kind, scaling.get("scaling_factor", 1.0), scaling["original_length"])
    try:
        return SCHEMES[name](n_head, head_dim, d_model, **spec)
    except TypeError as e:
        raise ValueError(f"positional={name}: bad option ({e})") from None


def layer_pattern(spec: dict) -> str:
    """positional.layers: P (the scheme) and N (NoPE) letters tiled over the layers; P, the scheme everywhere, if
    not given."""
    pattern = spec.get("layers", "P")
    if not isinstance(pattern, str) or not re.fullmatch(r"[PN]+", pattern):
        raise ValueError(
            f"positional.layers={pattern} may hold only P (the scheme) and N (NoPE) letters, tiled over the layers; "
            f"e.g. PPPN (iRoPE: NoPE in every 4th layer)"
        )
    return pattern


def build_layers(spec: dict, n_head: int, head_dim: int, d_model: int) -> tuple[Positional, Positional | None]:
    """The scheme, and the NoPE scheme of the N layers of positional.layers (None when the pattern has no N).

    With positional.layers given, attn_scale and floor_scale are the N layers' options, not the scheme's."""
    spec = dict(spec)
    pattern = layer_pattern(spec)
    layered = "layers" in spec and spec["name"] != "nope"  # positional=nope's own temperature stays its own
    nope_spec = {k: spec.pop(k) for k in NOPE_OPTIONS if layered and k in spec}
    spec.pop("layers", None)
    pe = build(spec, n_head, head_dim, d_model)
    if "N" not in pattern:
        return pe, None
    acts = pe.rotary or pe.score_bias is not None or pe.content_bias is not None
    if not acts:  # learned and sinusoidal add positions to the embeddings every layer reads; nope has none
        raise ValueError(
            f"positional.layers={pattern} leaves positions out of the N layers, but positional={pe.name} has none in "
            f"attention to leave out; use a scheme that rotates queries and keys or biases the scores (rope, alibi)"
        )
    if pe.rotated_dim() != head_dim:  # PoPE: one KV cache row cannot hold its 2 x head-dim keys and NoPE's
        raise ValueError(
            f"positional.layers={pattern} cannot mix positional={pe.name}'s {pe.rotated_dim()}-wide keys with NoPE's "
            f"{head_dim}-wide ones in one KV cache; use positional=rope or prope"
        )
    return pe, NoPE(n_head, head_dim, d_model, **nope_spec)
