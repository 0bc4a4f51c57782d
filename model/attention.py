"""Attention backends behind one plan, built once per forward and shared by every layer.

python train.py          (every forward of every entry point: model/gpt.py makes the plan, its layers attend)
make_plan picks a backend: sdpa (is_causal for plain causal attention, else a dense (H, Tq, Tk) bias, -inf where
hidden), flex (model/flex.py: compiled flex_attention, score_bias as score_mod and a block mask: CUDA, Tq >= 128, no
dense H x T x T tensor) or reference (fp32 softmax, for tests). The plan holds the rotation state, made once per
forward, and the plans of other layers: windows[W], nope (N layers), long (positional.global_base); an evaluation
variant's plans subclass it (model/variant.py). model.sink_logit adds a learned "nothing" slot to each head's softmax
denominator (gpt-oss), exactly in every backend.
"""

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from positional.base import key_order
from positional.base import scores as dot_scores  # q . k / sqrt(Dq) in fp32, GQA heads shared

BACKENDS = ("auto", "sdpa", "flex", "reference")
BLOCK_MIN_ROWS = 64  # smallest query block of the dense causal path (32 was slower on the CPU: more calls)
FLEX_MIN_QUERIES = 128  # below this (decoding) a dense bias is small and flex's block machinery is not worth it
# cuDNN builds a graph per shape; decoding adds a key each step (d12, H100: 3.8 ms host time a call, 12 a token)
NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class Mask:
    """Which keys each query sees, and the scheme's static score bias, in the form the backend takes."""

    is_causal: bool = False  # sdpa's own causal mask: no bias, no window, no nothing slot
    bias: torch.Tensor | None = None  # dense paths: (H or 1, Tq, Tk) float32, -inf where hidden
    blocks: list | None = None  # dense causal forward: query blocks along the diagonal (diagonal_blocks)
    score_mod: object = None  # flex: the scheme's score_bias
    block_mask: object = None  # flex: visibility, over the positions padded to flex_length
    flex_pad: tuple[int, int] = (0, 0)  # flex: query and key rows padded on
    kernel_options: dict | None = None  # flex: its kernels' settings where the defaults do not fit (TABLE_KERNEL)


@dataclass
class AttnPlan:
    pe: torch.nn.Module
    q_pos: torch.Tensor
    k_pos: torch.Tensor
    backend: str
    mask: Mask
    q_rot: object = None  # the scheme's rotation state (RoPE: cos, sin) at q_pos and k_pos, shared by every layer
    k_rot: object = None
    window: int | None = None  # this plan's sliding window (None: full causal attention)
    windows: dict | None = None  # window -> the plan of the layers with that window (add_window)
    nope: "AttnPlan | None" = None  # positional.layers' N layers (NoPE), over the same positions
    long: "AttnPlan | None" = None  # the full-attention layers at positional.global_base (Gemma 3)
    log_n: torch.Tensor | None = None  # (Tq, 1) ln(q_pos + 1), which model.ssmax multiplies by each head's s
    _key_order: tuple | None = field(default=None, repr=False)

    def queries(self, q):
        """Queries (B, H, Tq, Dh) rotated at q_pos."""
        return self.pe.rotate(q, self.q_pos, self.q_rot)

    def keys(self, k):
        """Keys (B, Hkv, Tk, Dh) rotated at k_pos."""
        return self.pe.rotate_key(k, self.k_pos, self.k_rot)

    @property
    def key_order(self):
        """positional/base.py key_order, made once per plan. Cached by hand: functools.cached_property takes a
        lock before Python 3.12, which torch.compile cannot trace (a graph break)."""
        if self._key_order is None:
            self._key_order = (key_order(self.q_pos, self.k_pos),)
        return self._key_order[0]

    def new_keys(self, k):
        """A decoding step's own keys, at the queries' positions: what a dense KV cache stores, rotated once."""
        return self.pe.rotate_key(k, self.q_pos, self.q_rot)

    def attend(self, q, k, v, sink=None, content=None):
        return attend_plain(q, k, v, self, sink, content)

    def query_scale(self, ssmax):
        """The factor on this plan's queries: SSMax's s_h ln n (model.ssmax: ssmax holds each head's s), or None."""
        return None if ssmax is None else ssmax.float()[:, None, None] * self.log_n

    def add_window(self, window, n_head: int, backend: str, sink: bool, k_pos=None, k_rot=None):
        """windows[window]: the causal plan of this window's layers over the same queries and k_pos, default this
        plan's keys (a cache's ring gives its own k_pos and k_rot; causality hides its unfilled slots, which sit past
        every query)."""
        same = k_pos is None or k_pos is self.k_pos
        rot = self.window_rotation(None if same else k_pos, k_rot)
        plan = self.remade(self.k_pos if same else k_pos, n_head, backend, sink, window, rot, same)
        plan.log_n = self.log_n  # the same queries: the same query state
        self.windows = {**(self.windows or {}), window: plan}

    def window_rotation(self, k_pos, k_rot) -> tuple:
        """(q_rot, k_rot) of a window's layers over k_pos (None: this plan's keys)."""
        return self.q_rot, self.k_rot if k_pos is None else k_rot

    def remade(self, k_pos, n_head, backend, sink, window, rot, same_keys: bool) -> "AttnPlan":
        return make_plan(self.pe, self.q_pos, k_pos, True, n_head, backend, sink, window, rot)


@dataclass(frozen=True, order=True)
class Chunk:
    """model.chunk=C: a query sees only its own chunk of C positions, causally (Llama 4). A layer's window is an int
    W or a Chunk: never equal, so each has its own plan."""

    size: int


def outside(window, q_pos, k_pos):
    """True where a key at or before its query is hidden: W or more back for a window W, another chunk for a Chunk."""
    if isinstance(window, Chunk):
        return q_pos // window.size != k_pos // window.size  # floor division: chunks stay aligned below position 0
    return q_pos - k_pos >= window


def hiding(window):
    """outside() for this window, or None for full attention."""
    return None if window is None else functools.partial(outside, window)


def dense_bias(pe, q_pos, k_pos, causal: bool, n_head: int, window: int | None = None) -> torch.Tensor | None:
    qp, kp = q_pos[None, :, None], k_pos[None, None, :]
    bias = None
    if pe.score_bias is not None:
        h = torch.arange(n_head, device=q_pos.device)[:, None, None]
        bias = pe.score_bias(h, qp, kp).float().expand(n_head, len(q_pos), len(k_pos))
    if causal:
        hidden = kp > qp
        if window is not None:
            hidden = hidden | outside(window, qp, kp)
        if bias is None:
            bias = torch.zeros(hidden.shape, device=q_pos.device)
        bias = bias.masked_fill(hidden, float("-inf"))
    return bias


def check_backend(pe, backend: str) -> None:
    """Refuse flex for a scheme that gives the weights itself: they read every score, flex's score_mod sees one."""
    if pe.content_weights is not None and backend == "flex":
        raise ValueError(
            f"model.attn_backend=flex: positional={pe.name} weighs keys by every score of the query, which flex's "
            f"score_mod does not see; pass model.attn_backend=auto (a dense mask)"
        )


def make_plan(pe, q_pos, k_pos, causal: bool, n_head: int, backend="auto", sink=False, window=None, rot=None):
    """q_pos is k_pos (the same tensor) marks a full forward. sink: the layers pass a sink logit, an extra key column
    that is_causal has no room for (or another reason to keep a mask: model/variant.py). rot: (q_rot, k_rot), default
    the scheme's own."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend '{backend}'; choose one of: {', '.join(BACKENDS)}")
    plain = pe.score_bias is None and pe.content_bias is None and not sink and (not causal or q_pos is k_pos)
    plain = plain and window is None and pe.content_weights is None
    check_backend(pe, backend)
    if backend == "auto":  # content weights read every score: a dense mask
        flex = q_pos.is_cuda and not plain and pe.content_weights is None and len(q_pos) >= FLEX_MIN_QUERIES
        backend = "flex" if flex else "sdpa"
    if rot is None:
        q_rot = pe.rotation(q_pos)
        rot = (q_rot, q_rot if k_pos is q_pos else pe.rotation(k_pos))
    if backend == "flex":
        from .flex import flex_mask  # CUDA's backend: a CPU run never loads it

        mask = Mask(**flex_mask(pe, q_pos, k_pos, causal, hiding(window)))
    elif backend == "sdpa" and plain:
        mask = Mask(is_causal=causal)
    else:
        own = pe.content_weights is not None  # content_attention takes every key for every query at once
        blocks = diagonal_blocks(len(q_pos)) if backend == "sdpa" and causal and q_pos is k_pos and not own else None
        mask = Mask(bias=dense_bias(pe, q_pos, k_pos, causal, n_head, window), blocks=blocks)
    return AttnPlan(pe, q_pos, k_pos, backend, mask, *rot, window=window)


def diagonal_blocks(n: int) -> list[tuple[int, int]] | None:
    """Query blocks (start, end) of a causal forward with a dense bias, each one SDPA call over the keys it sees:
    T5 6% faster per training step on the 2-core CPU at T=256 (bench/cpu_bench.py), ALiBi within noise."""
    size = max(BLOCK_MIN_ROWS, -(-n // 8))
    return None if n <= size else [(s, min(s + size, n)) for s in range(0, n, size)]


def content_grid(content, batch: int, n_head: int, n_q: int, n_k: int, device) -> torch.Tensor:
    """A layer's content bias fn(b, h, i, j) over the (B, H, Tq, Tk) index grid, fp32."""
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(n_head, device=device).view(1, -1, 1, 1)
    i = torch.arange(n_q, device=device).view(1, 1, -1, 1)
    j = torch.arange(n_k, device=device).view(1, 1, 1, -1)
    return content(b, h, i, j).float().expand(batch, n_head, n_q, n_k)


def attend(q, k, v, plan: AttnPlan, sink=None, content=None) -> torch.Tensor:
    """q (B, H, Tq, Dq), k (B, Hkv, Tk, Dq), v (B, Hkv, Tk, Dh), rotated by the plan -> (B, H, Tq, Dh). sink: the
    layer's sink logits (H,); content: its content bias fn(b, h, i, j) (Shaw, FoX), per layer, so not in the plan."""
    return plan.attend(q, k, v, sink, content)


def attend_plain(q, k, v, plan: AttnPlan, sink=None, content=None) -> torch.Tensor:
    if plan.backend == "flex":
        from .flex import attend_flex

        return attend_flex(q, k, v, plan, sink, content)
    bias, gqa = plan.mask.bias, q.size(1) != k.size(1)
    if content is not None:
        grid = content_grid(content, q.size(0), q.size(1), q.size(2), k.size(2), q.device)
        bias = grid if bias is None else bias + grid
    if plan.backend == "reference":
        return reference_attention(q, k, v, bias, sink)
    # 4-D: on the CPU a 3-D mask sends SDPA to its math path (the whole B x H x T x T matrix), a 4-D one to flash
    mask = None if bias is None else (bias if bias.dim() == 4 else bias[None]).to(q.dtype)
    n = 0  # keys before the first real one
    if sink is not None:
        if plan.mask.is_causal:  # is_causal has no room for the slot's column
            raise ValueError("attend got a sink logit but its plan was made without sink=True")
        k, v, mask = with_nothing_slot(k, v, mask, sink.to(q.dtype), q.size(2))
        n = 1
    if plan.mask.blocks:  # keys past a block's last query are masked for all of it: leave them out
        reach = plan.window.size if isinstance(plan.window, Chunk) else plan.window  # positions a query sees

        def block(s, e):  # queries s..e-1 see keys 0..e-1, which follow the n leading slots
            t = n + e  # and a window drops the keys before s - W + 1 too (all of them without a leading slot)
            lo = max(0, s - reach + 1) if plan.window and not n else 0
            return F.scaled_dot_product_attention(
                q[:, :, s:e], k[:, :, lo:t], v[:, :, lo:t], attn_mask=mask[:, :, s:e, lo:t], enable_gqa=gqa
            )

        return torch.cat([block(s, e) for s, e in plan.mask.blocks], dim=2)
    return sdpa(q, k, v, attn_mask=mask, is_causal=plan.mask.is_causal, enable_gqa=gqa)


def sdpa(q, k, v, **kw):
    """F.scaled_dot_product_attention, without cuDNN for a few query rows in eager CUDA code (NO_CUDNN)."""
    if q.is_cuda and q.size(2) < FLEX_MIN_QUERIES and not torch.compiler.is_compiling():
        with sdpa_kernel(NO_CUDNN):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    return F.scaled_dot_product_attention(q, k, v, **kw)


def content_attention(q, k, v, plan: AttnPlan, state=None, layer=None) -> torch.Tensor:
    """Attention under the scheme's own weights (positional/base.py content_weights) over the plan's dense mask: one
    fp32 B x H x Tq x Tk tensor per layer, on a GPU too. What a row leaves goes to layer.rest (H, Dh), if any."""
    bias = plan.mask.bias
    if bias is None:  # not causal, nothing hidden
        bias = q.new_zeros(1, q.size(2), k.size(2), dtype=torch.float32)
    weights = plan.pe.content_weights(q, k, bias, state, layer, plan)
    out = weighted_values(weights, v, torch.float32)
    if (rest := getattr(layer, "rest", None)) is not None:
        out = out + (1.0 - weights.sum(-1, keepdim=True)) * rest.float()[:, None, :]
    return out.to(q.dtype)


def with_nothing_slot(k, v, mask, sink, n_queries: int):
    """Prepend a zero key and value, and a mask column of sink logits: SDPA's softmax then has exp(s_h) in its
    denominator and the output gains nothing. Key 0, not last, keeps a diagonal block's keys one prefix slice."""
    k = torch.cat((k.new_zeros(*k.shape[:2], 1, k.size(3)), k), dim=2)  # keys may be wider than values (PoPE, ReRoPE)
    v = torch.cat((v.new_zeros(*v.shape[:2], 1, v.size(3)), v), dim=2)
    n_head, n_keys = sink.size(0), k.size(2) - 1
    batch = 1 if mask is None else mask.size(0)  # a content bias gives every sequence its own mask
    body = (sink.new_zeros(1, 1, 1, 1) if mask is None else mask).expand(batch, n_head, n_queries, n_keys)
    column = sink.view(1, n_head, 1, 1).expand(batch, n_head, n_queries, 1)
    return k, v, torch.cat((column, body), dim=-1)


def softmax_weights(scores, bias, sink=None) -> torch.Tensor:
    """fp32 softmax of scores + bias; with sink logits (H,), rows sum to one less the nothing slot's share."""
    if bias is not None:
        scores = scores + bias
    if sink is None:
        return scores.softmax(dim=-1)
    column = sink.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.cat((column, scores), dim=-1).softmax(dim=-1)[..., 1:]


def attention_weights(q, k, bias, sink=None) -> torch.Tensor:
    """fp32 softmax probabilities (B, H, Tq, Tk) of q over k (GQA heads shared), plus bias."""
    return softmax_weights(dot_scores(q, k), bias, sink)


def weighted_values(weights, v, dtype):
    """weights (B, H, Tq, Tk) fp32 times the values (B, Hkv, Tk, Dh), each value head shared by its group."""
    return (weights @ v.repeat_interleave(weights.size(1) // v.size(1), dim=1).float()).to(dtype)


def reference_attention(q, k, v, bias, sink=None):
    return weighted_values(attention_weights(q, k, bias, sink), v, q.dtype)
