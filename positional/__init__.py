"""Positional schemes by name: `positional=<name>` in any entry point picks one.

python train.py positional=irope                                 (rope, positional.layers=PPPN: NoPE in every 4th layer)
python train.py positional=alibi positional.layers=PPN           (any scheme that acts in attention)
python train.py experiment=gemma3                   (RoPE at base 10,000 in 5 sliding-window layers of 6, 1M in the 6th)
python train.py init_from=out/rope train.seq_len=1024 positional.scaling=yarn positional.scaling_factor=4
A scheme is one file here, named as it is picked; SCHEMES imports its module only when asked for. An option a spec
leaves out takes the constructor's default, what the scheme did before the option existed, so an older checkpoint
builds as it was trained.
"""

from dataclasses import asdict, fields, is_dataclass

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

import settings

from .base import SCHEMES, Positional, PositionalOptions, PositionAxesError, PositionLimitError, Schemes, names  # noqa: F401

NOPE_OPTIONS = ("attn_scale", "floor_scale")  # with positional.layers: the N layers' query temperature (nope.py)
# a RoPE extension trained into the model: options no scheme's constructor takes, build() passes a Scaling
SCALING_KEYS = ("scaling", "scaling_factor", "original_length")
SHARED = tuple(f.name for f in fields(PositionalOptions))  # the options every scheme has (base.py)


def spec_of(opts) -> dict:
    """A spec as a plain dict, less the shared options that are off (scaling none, null layer options): a saved
    config holds only what the model uses, so older checkpoints still resume."""
    if isinstance(opts, DictConfig):
        opts = OmegaConf.to_container(opts, resolve=True, enum_to_str=True)
    spec = asdict(opts) if is_dataclass(opts) else dict(opts)
    if spec.get("scaling", "none") == "none":
        spec = {k: v for k, v in spec.items() if k not in SCALING_KEYS}
    off = ("layers", "global_base", *NOPE_OPTIONS)
    spec.pop("random_positions", None)  # data.random_positions now; a checkpoint older than the move has it here
    return {k: v for k, v in spec.items() if not (k in off and v is None)}


def options(spec, key: str = "positional") -> dict:
    """spec checked against its scheme's Options class (names, types, ranges, rules) -> the given options as plain
    values; else a ValueError, one line naming key.<option>."""
    name = spec.get("name")
    if name not in SCHEMES:
        raise ValueError(f"{key}.name={settings.show(name)} is not one of {', '.join(SCHEMES)}; pick one")
    cls = SCHEMES[name].Options
    node = OmegaConf.structured(cls(name=name))
    for option, value in spec.items():
        if option not in node:
            raise ValueError(settings.unknown(cls, f"{key}.{option}", node))
        try:
            node[option] = value
        except ValidationError as e:
            raise ValueError(settings.invalid(e, f"{key}.{option}")) from None
    if message := settings.problem(node, f"{key}.", only=spec):
        raise ValueError(message)
    return {k: v for k, v in OmegaConf.to_container(node, enum_to_str=True).items() if k in spec}


def rotary(spec: dict) -> bool:
    """Whether the spec's scheme rotates queries and keys (a sink: its inner scheme's)."""
    return rotary(spec.get("inner", {"name": "rope"})) if spec["name"] == "sink" else SCHEMES[spec["name"]].rotary


def build(spec, n_head: int, head_dim: int, d_model: int, key: str = "positional", checked=False) -> Positional:
    """Make a scheme from its options ({'name': 'rope', 'base': 10000, ...}); checked: options() made spec. layers and
    global_base are build_layers' and build_long's: ignored here, refused in a wrapped scheme."""
    spec = dict(spec if checked else options(spec_of(spec), key))  # a copy: options are popped below
    if spec.pop("global_base", None) is not None and key != "positional":
        raise ValueError(f"{key}.global_base is read from positional.global_base alone; set it there")
    scaling = {k: spec.pop(k) for k in SCALING_KEYS if k in spec}
    name = spec.pop("name")
    # its own options, and for nope its query temperature (the N layers' elsewhere)
    own = {k: v for k, v in spec.items() if k not in SHARED or name == "nope" and k in NOPE_OPTIONS}
    if name == "sink":  # a wrapper: its inner scheme is built from its own options, and takes the scaling
        inner = {**spec.get("inner", {"name": "rope"}), **scaling}
        own["inner"] = build(inner, n_head, head_dim, d_model, key + ".inner")
    elif scaling.get("scaling", "none") != "none":  # a rotary scheme's, whose module imports rope_scaling already
        from .rope_scaling import Scaling

        own["scaling"] = Scaling(scaling["scaling"], scaling.get("scaling_factor", 1.0), scaling["original_length"])
    try:
        return SCHEMES[name](n_head, head_dim, d_model, **own)
    except TypeError as e:  # an option with no default left out of a spec built in code (learned's max_positions)
        raise ValueError(f"{key}={name} lacks an option it needs ({e}); pass it") from None


def layer_pattern(spec: dict) -> str:
    """positional.layers, P (the scheme) and N (NoPE) tiled over the layers; P if not given."""
    return spec.get("layers") or "P"


def build_layers(spec, n_head: int, head_dim: int, d_model: int, checked=False) -> tuple[Positional, Positional | None]:
    """The scheme, and NoPE for positional.layers' N layers (None without), which take attn_scale and floor_scale."""
    spec = dict(spec if checked else options(spec_of(spec)))  # a copy: options are popped below
    pattern = layer_pattern(spec)
    layered = "layers" in spec and spec["name"] != "nope"  # positional=nope's own temperature stays its own
    nope_spec = {k: spec.pop(k) for k in NOPE_OPTIONS if layered and k in spec}
    spec.pop("layers", None)
    pe = build(spec, n_head, head_dim, d_model, checked=True)
    if "N" not in pattern:
        return pe, None
    acts = pe.rotary or pe.score_bias is not None or pe.content_bias is not None or pe.content_weights is not None
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
    return pe, SCHEMES["nope"](n_head, head_dim, d_model, **nope_spec)


def build_long(spec, n_head: int, head_dim: int, d_model: int, checked=False) -> Positional | None:
    """The scheme at positional.global_base for the full-attention layers (Gemma 3: 1,000,000 there, 10,000 in its
    sliding-window layers), else None. A second instance, not a base per layer, so its rotation gets a plan of its
    own (plan.long) that caches, backends and scalings take as they are; rotary schemes add no parameters."""
    spec = dict(spec if checked else options(spec_of(spec)))
    base = spec.pop("global_base", None)
    return None if base is None else build({**spec, "base": base}, n_head, head_dim, d_model, checked=True)
