"""The one interface every positional scheme implements.

A scheme may act at three points and is the identity elsewhere: embed() adds a vector per position to the
embeddings, rotate() and rotate_key() transform queries and keys, score_bias() adds a bias to the scores. A bias that
reads content is built per layer (layer_module, content_bias); a scheme whose weights read every score (CoPE,
stick-breaking, PaTH) gives them itself (content_weights). Positions are explicit integer tensors, (T,) or (axes, T)
for a multi-axis scheme (rope2d, mrope); a (T,) id sits on every axis, M-RoPE's rule for text. A scheme is named by
its file (positional/t5.py: positional=t5), its options a PositionalOptions subclass beside it, which Hydra checks as
it composes (utils/schema.py LazyGroup). docs/schemes.md lists each hook with the schemes that give it.
"""

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from omegaconf import MISSING
from torch import nn

from settings import Rule, UserError, choices, setting

LAYERS = r"[PN]+"  # positional.layers: P a layer of the scheme, N a layer with no positions (NoPE), tiled

# positional.scaling, a RoPE extension trained into the model (rope_scaling.py); no dynamic_ntk, which moves with
# the length, so a fine-tune would not fix its frequencies: ntk is its fixed form
Trained = choices("Trained", "none", "linear", "ntk", "yarn", "yarn_released", "llama3")


def rotates(name: str) -> bool:
    """Whether the named scheme rotates queries and keys (a sink's inner scheme is checked by build())."""
    return name == "sink" or name not in SCHEMES or SCHEMES[name].rotary


@dataclass
class PositionalOptions:
    """The options every scheme shares; a saved config keeps the optional ones only where on (positional.spec_of)."""

    name: str = setting(  # set by picking the scheme: positional=t5
        MISSING,
        "pick one with positional=<name> (a file of positional/)",
        test=lambda n: n in names(),
        must="name a scheme",
    )
    # kept in the saved config, so eval.py and sample.py build the same scaled frequencies
    scaling: Trained = "none"
    scaling_factor: float = setting(1.0, "pass s >= 1, the new length over the original (4 for 256 -> 1024)", ge=1)
    original_length: int | None = setting(  # the length the unscaled frequencies were trained at
        None, "pass the length the model was trained at, or null for init_from's", ge=1
    )
    layers: str | None = setting(  # tiled over the layers; null: the scheme in every layer (P)
        None, "e.g. PPPN (iRoPE: NoPE in every 4th layer)", match=LAYERS, must="hold only P (the scheme) and N (NoPE)"
    )
    # the N layers' query temperature 1 + attn_scale ln(1 + floor((i + 1) / floor_scale)) (nope.py); null: none
    attn_scale: float | None = setting(None, "pass the temperature's slope, 0 for none (Llama 4: 0.1)", ge=0)
    floor_scale: float | None = setting(None, "pass the positions after which the query temperature grows", gt=0)

    RULES: ClassVar = (
        Rule(
            ("scaling", "name"),
            lambda scaling, name: scaling == "none" or rotates(name),
            "{0} rescales rotary frequencies and {1} has none; drop it (init_from alone fine-tunes any scheme at a "
            "new train.seq_len)",
        ),
        Rule(
            ("scaling", "scaling_factor"),
            lambda scaling, factor: scaling == "none" or factor != 1,
            "{0} at {1} changes nothing; pass the factor (e.g. 4)",
        ),
        Rule(
            ("scaling", "original_length"),
            lambda scaling, length: scaling == "none" or length is not None,
            "{0} scales the frequencies of a model trained at a shorter length, and {1} does not say which: pass "
            "init_from=<its run folder>, or the length it was trained at",
        ),
    )


def key_order(q_pos, k_pos):
    """(order, inverse) sorting the keys by position and back, for schemes that sum over keys in order (FoX, CoPE,
    stick-breaking, PaTH); None in a full forward (q_pos is k_pos), whose keys are in order, unlike a cache's."""
    if q_pos is k_pos:
        return None
    order = k_pos.argsort()
    return order, order.argsort()


def scores(q, k) -> torch.Tensor:
    """q . k / sqrt(Dh) in fp32 (B, H, Tq, Tk), each key head shared by its group of query heads (GQA)."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    return q.float() @ k.float().transpose(-2, -1) / q.size(-1) ** 0.5


class PositionLimitError(UserError, ValueError):
    """A position past what the scheme covers."""


class PositionAxesError(UserError, ValueError):
    """Positions with another number of axes than the scheme reads."""


class Positional(nn.Module):
    name = "none"  # its module's: positional/t5.py's T5 is t5 (__init_subclass__)
    about = ""  # one line: its row of the README's scheme table (evaluation/doc_tables.py)
    Options = PositionalOptions
    relative = False  # scores read q_pos - k_pos only (FIRE: also the query's position), so a sink cache re-indexes
    axes = 1  # position axes read: pos (T,), or (axes, T) where axes > 1
    rotary = False  # rotation(pos, scaling) takes a Scaling (rope_scaling.py; ReRoPE: rerope.py)
    max_positions: int | None = None  # None: unbounded; N: a table of N positions
    n_prefix = 0  # learned tokens before every sequence (attention sinks), from prefix()
    # score_bias(h, q_pos, k_pos): broadcasting tensor ops, so one function is a flex score_mod and a dense SDPA bias
    score_bias = None
    # content_bias(q, state, plan) -> fn(b, h, i, j) over query and key rows (plan.q_pos[i] is a position), in
    # broadcasting ops like score_bias: the dense paths call it on index grids, flex from its score_mod
    content_bias = None
    # content_weights(q, k, bias, state, layer, plan) -> (B, H, Tq, Tk) fp32 weights in place of softmax(q.k + bias),
    # bias being the plan's mask; a row may leave some weight to layer.rest (H, Dh). Dense paths only
    content_weights = None
    state_dim = 0  # channels of the per-token state layer_module() computes (a KV cache keeps them per key)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "name" not in cls.__dict__:
            cls.name = cls.__module__.rpartition(".")[2]

    def __init__(self, n_head: int, head_dim: int, d_model: int):
        super().__init__()
        self.n_head, self.head_dim, self.d_model = n_head, head_dim, d_model

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x

    def check_axes(self, pos: torch.Tensor) -> torch.Tensor:
        """pos if this scheme reads it, (T,) or (its axes, T); else PositionAxesError, which says what fits."""
        if pos.dim() == 1 or (pos.dim() == 2 and self.axes > 1 and pos.size(0) == self.axes):
            return pos
        wants = (
            "one position per token, shape (T,)" if self.axes == 1 else f"positions of shape (T,) or ({self.axes}, T)"
        )
        fix = "a multi-axis scheme (rope2d, mrope, sinusoidal2d, sinusoidal3d)" if self.axes == 1 else "those"
        raise PositionAxesError(
            f"positional={self.name} reads {wants}, but got positions of shape {tuple(pos.shape)}; pass {fix}"
        )

    def per_axis(self, pos: torch.Tensor) -> torch.Tensor:
        """Checked positions as (axes, T), a (T,) id repeated on every axis (a view)."""
        pos = self.check_axes(pos)
        return pos.expand(self.axes, -1) if pos.dim() == 1 else pos

    def layer_module(self) -> nn.Module | None:
        """Each attention layer's module (FoX: its forget gate): layer input (B, T, D) -> state (B, state_dim, T)."""
        return None

    def rotation(self, pos: torch.Tensor, scaling=None):
        """What rotate() reads (RoPE: cos, sin), made once per forward by the plan; scaling: rope_scaling.Scaling."""
        return None

    def rotate(self, x: torch.Tensor, pos: torch.Tensor, rotation=None) -> torch.Tensor:
        return x

    def rotate_key(self, x: torch.Tensor, pos: torch.Tensor, rotation=None) -> torch.Tensor:
        """Keys, where they differ from queries (xPos decays them the other way)."""
        return self.rotate(x, pos, rotation)

    def rotated_dim(self) -> int:
        """The width of rotated queries and keys (PoPE doubles it; values keep head_dim)."""
        return self.head_dim

    def prefix(self) -> torch.Tensor | None:
        return None

    def fit_state(self, state: dict, prefix: str) -> None:
        """Fit a saved state dict's entries under prefix to this instance's sizes, in place (init_from at another
        length: Learned resizes its table). Default: nothing depends on the length."""

    def check_length(self, n_positions: int) -> None:
        """Raise PositionLimitError if positions 0..n_positions-1 are not all covered."""
        if self.max_positions is not None and n_positions > self.max_positions:
            raise PositionLimitError(
                f"positional={self.name} covers {self.max_positions} positions but {n_positions} were asked for; "
                f"train with a larger positional.max_positions or use a relative scheme (rope, alibi, nope, sink)"
            )

    def extra_repr(self) -> str:
        return f"relative={self.relative}, max_positions={self.max_positions}, n_prefix={self.n_prefix}"


HELPERS = ("base", "rope_scaling", "hf_rope_scaling", "rerope", "dca")  # modules here that are not schemes


@functools.cache
def names() -> tuple[str, ...]:
    """Every scheme's name: each module of this folder but HELPERS."""
    found = (p.stem for p in Path(__file__).parent.glob("*.py") if not p.stem.startswith("_"))
    return tuple(sorted(n for n in found if n not in HELPERS))


class Schemes(Mapping):
    """name -> its Positional subclass (of="Options": its options' class), its module imported when first asked for."""

    def __init__(self, of: str | None = None):
        self.of = of

    def __getitem__(self, name: str):
        if name not in names():
            raise KeyError(name)
        found = vars(importlib.import_module(f"positional.{name}")).values()
        cls = next(c for c in found if isinstance(c, type) and issubclass(c, Positional) and c.name == name)
        return getattr(cls, self.of) if self.of else cls

    def __iter__(self):
        return iter(names())

    def __len__(self) -> int:
        return len(names())


SCHEMES = Schemes()
