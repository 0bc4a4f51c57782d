"""The one interface every positional scheme implements.

A scheme may act at three points and is the identity elsewhere:
  embed(x, pos)                  add a vector per position to the token embeddings
  rotate(x, pos, rotation)       transform queries or keys (B, H, T, Dh) by their positions; rotation is what
                                 rotation(pos, scaling) returned (RoPE: cos, sin), computed once per forward in the
                                 attention plan every layer shares, or None to compute it here; scaling: an
                                 eval-time RoPE extension (positional/rope_scaling.py Scaling), a value passed in
  rotate_key(x, pos, rotation)   keys, where they differ from queries (xPos decays them the other way); the
                                 rotated width may differ from the values' (rotated_dim(): PoPE doubles it)
  score_bias(h, q_pos, k_pos)    additive attention-score bias, written with broadcasting tensor ops so the
                                 same function serves as a FlexAttention score_mod and as a dense SDPA bias
                                 (a learned one, in training, reaches flex as a table: attention.bias_score_mod)
A bias that reads content (Shaw's q . a_(i-j), FoX's data-dependent forget gates) is built per layer, since every
layer has its own queries and input, by two more hooks (the plan, shared by the layers, keeps positions and mask):
  layer_module()                 an nn.Module each attention layer keeps (FoX: its forget gate), or None; it maps
                                 the layer input (B, T, D) to a per-token state (B, state_dim, T), which a KV
                                 cache stores beside the keys (slot order) and hands back for every cached key;
                                 a module of parameters only returns None (CoPE: its position vectors)
  content_bias(q, state, plan)   -> fn(b, h, i, j): the bias for batch b, head h, query row i, key row j (rows of
                                 q and of the keys, not positions; plan.q_pos[i] and plan.k_pos[j] give those),
                                 written with broadcasting tensor ops over tensors it captures, like score_bias:
                                 the dense paths call it on index grids, flex calls it from its score_mod
A weight that reads the scores themselves (CoPE's gates count the keys a query chooses, stick-breaking breaks a stick
from the nearest key back, PaTH transforms keys by what lies between key and query) is no bias on a softmax: such a
scheme gives the weights, by one more hook (model/attention.py content_attention applies them):
  content_weights(q, k, bias, state, layer, plan) -> (B, H, Tq, Tk) fp32 weights over the keys, in place of
                                 softmax(q . k / sqrt(d) + bias); bias (H or 1, Tq, Tk) is the plan's mask, -inf
                                 where hidden; layer the scheme's layer_module() of this layer, state its output.
                                 Rows may sum to less than one: the rest goes to layer.rest (H, Dh) where the layer
                                 module has it (stick-breaking), else to nothing. It reads every score, so it runs
                                 on the dense paths only (a T x T tensor per layer, on a GPU too)
Positions are explicit integer tensors: (T,), one per token, or (axes, T) for a scheme that reads several axes
(rope2d: row, column; mrope: temporal, height, width). A token given one id, (T,), carries it on every axis (M-RoPE's
rule for text), so every scheme reads a text sequence. A scheme also states what it supports:
  axes           how many position axes it reads (1: positions (T,) only; check_axes refuses the rest)
  relative       scores depend on positions only through q_pos - k_pos, so a streaming sink cache can re-index
                 them (FIRE: also through the query's own position, which its normaliser reads; see fire.py)
  max_positions  None for unbounded, N for a table of N positions
  n_prefix       learned tokens prepended to every sequence (attention sinks); prefix() returns them
A scheme is named by its file (positional/t5.py: positional=t5). Its options are a dataclass beside it (RoPEOptions
next to RoPE), a subclass of PositionalOptions below, or PositionalOptions itself where it has none of its own; Hydra
reads them as the option positional=<name> (utils/schema.py SchemeGroup), so a misspelled one fails as it composes.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch
from omegaconf import MISSING
from torch import nn

from settings import Rule, UserError, choices, setting

LAYERS = r"[PN]+"  # positional.layers: P a layer of the scheme, N a layer with no positions (NoPE), tiled


# positional.scaling: a RoPE extension fixed for training (positional/rope_scaling.py). dynamic_ntk moves with the
# length, so a fine-tune at one length would not fix the frequencies it is evaluated with: ntk is its fixed form
Trained = choices("Trained", "none", "linear", "ntk", "yarn", "yarn_released", "llama3")


def rotates(name: str) -> bool:
    """Whether the scheme of this name rotates queries and keys (a sink: as its inner scheme, which build() checks
    with the scaling it passes down; an unknown name: options() says so)."""
    from positional import SCHEMES  # the registry, which imports this module first

    return name == "sink" or name not in SCHEMES or SCHEMES[name].rotary


def is_scheme(name: str) -> bool:
    from positional import names  # the registry, which imports this module first

    return name in names()


@dataclass
class PositionalOptions:
    """The options every scheme shares. A scaling and the N layers' options are kept in a model's saved config only
    where they are on (positional.spec_of), so a model without them has the config it had before they existed."""

    name: str = setting(  # the scheme (positional/__init__.py SCHEMES), set by picking it: positional=t5
        MISSING, "pick one with positional=<name> (a file of positional/)", test=is_scheme, must="name a scheme"
    )
    # a RoPE extension trained into the model (rotary schemes): kept in its saved config, so eval.py and sample.py
    # build it the same
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
    # positions drawn as a sorted random subset of range(random_positions), one draw per batch, in training and in
    # eval.mode=tasks (Ruoss et al. 2023: the positions of longer sequences seen in short ones); null: 0..T-1
    random_positions: int | None = setting(
        None, "pass the range to draw from, above the longest test sample's tokens, or null for 0..T-1", ge=2
    )

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
    """(order, inverse) that sort the keys by position and back, or None where they are in order: a full forward's
    are (q_pos is k_pos); a cache's slots are in any order (a sink cache's ring, a static step's empty slots last).
    The attention plan computes it once for its layers (plan.key_order), for the schemes that sum over keys in order."""
    if q_pos is k_pos:
        return None
    order = k_pos.argsort()
    return order, order.argsort()


def scores(q, k) -> torch.Tensor:
    """q . k / sqrt(Dh) in fp32 (B, H, Tq, Tk), each key head shared by its group of query heads (GQA)."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    return q.float() @ k.float().transpose(-2, -1) / q.size(-1) ** 0.5


class PositionLimitError(UserError, ValueError):
    """A position past what the scheme covers (a learned table)."""


class PositionAxesError(UserError, ValueError):
    """Positions with more axes than the scheme reads, or another number of them."""


class Positional(nn.Module):
    name = "none"  # a scheme's is its module's: positional/t5.py's T5 is t5 (__init_subclass__)
    about = ""  # what the scheme does, in one line: its row of the README's scheme table (evaluation/doc_tables.py)
    Options = PositionalOptions  # a scheme with options of its own gives their class
    relative = False
    axes = 1  # position axes read: pos (T,), or (axes, T) where axes > 1
    rotary = False  # rotary schemes' rotation(pos, scaling) takes a Scaling (rope_scaling.py; ReRoPE: rerope.py)
    max_positions: int | None = None
    n_prefix = 0
    score_bias = None  # subclasses with a bias define a method score_bias(h, q_pos, k_pos) -> Tensor
    content_bias = None  # subclasses whose bias reads q or the layer input define content_bias(q, state, plan)
    content_weights = None  # subclasses that give the weights define content_weights(q, k, bias, state, layer, plan)
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
        """pos, if this scheme reads it: (T,) always (a token's one id on every axis), (axes, T) for a multi-axis
        scheme with exactly its number of axes; anything else raises PositionAxesError, which says what fits."""
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
        """Checked positions as (axes, T): a (T,) id repeated on every axis (a view, no copy)."""
        pos = self.check_axes(pos)
        return pos.expand(self.axes, -1) if pos.dim() == 1 else pos

    def layer_module(self) -> nn.Module | None:
        return None

    def rotation(self, pos: torch.Tensor, scaling=None):
        return None

    def rotate(self, x: torch.Tensor, pos: torch.Tensor, rotation=None) -> torch.Tensor:
        return x

    def rotate_key(self, x: torch.Tensor, pos: torch.Tensor, rotation=None) -> torch.Tensor:
        return self.rotate(x, pos, rotation)

    def rotated_dim(self) -> int:
        """The width of rotated queries and keys (values keep head_dim)."""
        return self.head_dim

    def prefix(self) -> torch.Tensor | None:
        return None

    def scaling_factors(self, kind: str, factor: float, original_length: int):
        """A closed-form rope scaling's frequencies as LongRoPE factors, one per pair a Scaling's rescale takes
        (rotary schemes; the LongRoPE search starts from these)."""
        raise ValueError(f"rope scaling applies to rotary schemes, not positional={self.name}")

    def fit_state(self, state: dict, prefix: str) -> None:
        """Fit this scheme's entries of a saved state dict (keys under prefix, e.g. 'pe.') to this instance's sizes,
        in place, where a fine-tune at another length changes them (init_from; Learned resizes its table).
        Default: nothing depends on the length."""

    def check_length(self, n_positions: int) -> None:
        """Raise PositionLimitError if positions 0..n_positions-1 are not all covered."""
        if self.max_positions is not None and n_positions > self.max_positions:
            raise PositionLimitError(
                f"positional={self.name} covers {self.max_positions} positions but {n_positions} were asked for; "
                f"train with a larger positional.max_positions or use a relative scheme (rope, alibi, nope, sink)"
            )

    def extra_repr(self) -> str:
        return f"relative={self.relative}, max_positions={self.max_positions}, n_prefix={self.n_prefix}"
