"""Attention backends behind one plan, built once per forward and shared by every layer.

make_plan picks the backend from the scheme and the positions:
  sdpa       scaled_dot_product_attention: is_causal when the mask is plain causal and there is no bias (flash
             on CUDA); otherwise with a dense (H, Tq, Tk) float bias that carries the mask as -inf (CPU, decode),
             a causal full forward split into query blocks along the diagonal (no call scores masked keys)
  flex       compiled flex_attention with the scheme's score_bias as score_mod and a block mask from positions
             (CUDA, bias or non-trivial mask, Tq >= 128): no dense H x T x T tensor is ever built
  reference  explicit softmax in fp32 over the dense bias, for tests
A key j is visible to query i iff k_pos[j] <= q_pos[i] (causal) or always (causal=False); in a sliding-window
layer (model.window=W) also only iff q_pos[i] - k_pos[j] < W. Layers with a window read plan.windows[W], a plan
of its own (one mask per distinct window) that shares the rotation state when it attends over the same keys.
A plan may also carry a per-query factor on the logits (q_scale, log_n: model/log_scaling.py), which the layers
multiply into their queries before attend(), so every backend sees the same scaled queries.
The N layers of positional.layers (NoPE in an iRoPE model) read plan.nope: a plan of their own scheme over the same
positions (its rotation state is NoPE's query temperature; its mask carries no scheme bias), with its own windows.

A content-dependent bias (positional/base.py content_bias: Shaw's q . a_clip(i-j), FoX's forget gates) differs per
layer, so it is not in the plan: each layer passes attend() its own fn(b, h, i, j) beside the plan, as it passes its
sink logit. The plan keeps what the layers share (positions, mask, static bias, flex block mask); the dense paths
add fn over the (B, H, Tq, Tk) index grid to the plan's bias, flex adds it in a per-layer score_mod that reads the
scheme's (B, H, Tq, ...) tables. Schemes without one take exactly the paths they took before.

A scaling with a far rotation (ReRoPE, positional/rerope.py: Scaling.far, w and k) scores a key at distance
q_pos - k_pos >= w by q_far . k_far instead: the same queries and keys rotated by a second state, made once per
forward beside the first (plan.far: Far). The layers rotate both and pass attend() far=(q_far, k_far); each key
still enters the softmax once, with the one score its distance selects, in every backend:
  sdpa             a causal forward, per query block: one SDPA call whose keys are the block's far keys and near
                   keys side by side, queries [q | q_far] against [0 | k_far] and [k | 0] (split_blocks); decoding
                   steps and short rows as the reference
  reference        both score matrices explicit in fp32 and torch.where between them
  flex             two calls: near keys (d < w) with q, k under plan.block_mask, far keys (d >= w) with q_far, k_far
                   under plan.far.block_mask, each skipping the blocks its mask hides. A softmax over two disjoint
                   key sets is each set's softmax weighted by its share of the total: with lse_n, lse_f the calls'
                   log-sum-exps and lse = logaddexp(lse_n, lse_f), out = out_n e^(lse_n - lse) + out_f e^(lse_f - lse)
                   exactly (a row with no far key has lse_f = -inf, weight 0; every real row has a near key, itself)

model.sink_logit=true gives each head a learned logit s_h for a "nothing" slot in the softmax denominator
(gpt-oss): weight_j = exp(score_j) / (exp(s_h) + sum_k exp(score_k)), values unchanged, so a head may attend to
nothing rather than park its mass on a real key. Every backend computes it exactly: SDPA and the reference
see the slot as key 0, a zero key and value whose score is s_h; flex rescales its output by
sigmoid(lse - s_h) = sum / (sum + exp(s_h)), lse = log sum_k exp(score_k) being what flex returns beside it.
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from positional import rerope

BACKENDS = ("auto", "sdpa", "flex", "reference")
BLOCK_MIN_ROWS = 64  # smallest query block of the dense causal path (32 was slower on the CPU: more calls)
FLEX_MIN_QUERIES = 128  # below this (decoding) a dense bias is small and flex's block machinery is not worth it
FLEX_BLOCK = 128  # flex_attention's block size: the shortest length flex is padded to
PAD_POSITION = 1 << 40  # padded keys sit at +PAD_POSITION, padded queries at -PAD_POSITION


@dataclass
class Far:
    """A scheme's far scores (ReRoPE): keys at distance q_pos - k_pos >= window score through the far rotation."""

    window: int
    leak: float  # far distances w + (d - w) / leak (positional/rerope.py)
    scaling: object  # the Scaling whose far rotation this is (its frequencies rotate the far positions too)
    q_pos: torch.Tensor  # the queries' far positions (rerope.far_positions) and their rotation state
    q_rot: object
    k_pos: torch.Tensor  # the keys'
    k_rot: object
    new_pos: torch.Tensor  # keys' far positions at the query positions: a dense cache's new keys, stored rotated
    new_rot: object
    mask: torch.Tensor | None = None  # dense paths: (Tq, Tk) bool, True where a key scores far
    block_mask: object = None  # flex: the far call's block mask (plan.block_mask then holds the near keys)
    spans: list | None = None  # sdpa, a causal forward: per query block, where its far and near keys lie (far_spans)


def far_rotation(pe, q_pos, k_pos, scaling=None, parent: Far | None = None) -> Far:
    """The far rotation states at these positions under scaling (its far: ReRoPE's w and k); parent: a plan's own
    over the same queries, whose query states (and key states, where k_pos is None: the same keys) are shared."""
    if parent is None:
        w, leak = scaling.far
        fq, fn = rerope.far_positions(q_pos, False, w, leak), rerope.far_positions(q_pos, True, w, leak)
        parent = Far(w, leak, scaling, fq, pe.rotation(fq, scaling), fn, None, fn, pe.rotation(fn, scaling))
        k_pos = None if k_pos is q_pos else k_pos  # a full forward: its keys are its queries
        parent.k_rot = parent.new_rot
    far = replace(parent, mask=None, block_mask=None, spans=None)
    if k_pos is not None:
        far.k_pos = rerope.far_positions(k_pos, True, far.window, far.leak)
        far.k_rot = pe.rotation(far.k_pos, far.scaling)
    return far


@dataclass
class AttnPlan:
    pe: torch.nn.Module
    q_pos: torch.Tensor
    k_pos: torch.Tensor
    backend: str
    is_causal: bool = False
    bias: torch.Tensor | None = None  # (H or 1, Tq, Tk) float32, -inf where masked
    score_mod: object = None
    block_mask: object = None
    flex_pad: tuple[int, int] = (0, 0)  # query and key rows flex pads on (see flex_length)
    blocks: list | None = None  # query blocks along the diagonal (dense bias, causal full forward): see diagonal_blocks
    q_rot: object = None  # the scheme's rotation state (RoPE: cos, sin) at q_pos and k_pos, made once for every layer
    k_rot: object = None
    window: int | None = None  # this plan's sliding window (None: full causal attention)
    windows: dict | None = None  # window -> the plan of the layers with that window (see add_window)
    nope: "AttnPlan | None" = None  # the plan of positional.layers' N layers (NoPE), over the same positions
    q_scale: torch.Tensor | None = None  # (Tq, 1) eval-time log-length factor of the queries (model/log_scaling.py)
    log_n: torch.Tensor | None = None  # (Tq, 1) ln(q_pos + 1), which model.ssmax multiplies by each head's s
    far: Far | None = None  # a scheme's far scores (ReRoPE): their window, rotation states and masks


def dense_bias(pe, q_pos, k_pos, causal: bool, n_head: int, window: int | None = None) -> torch.Tensor | None:
    qp, kp = q_pos[None, :, None], k_pos[None, None, :]
    bias = None
    if pe.score_bias is not None:
        h = torch.arange(n_head, device=q_pos.device)[:, None, None]
        bias = pe.score_bias(h, qp, kp).float().expand(n_head, len(q_pos), len(k_pos))
    if causal:
        hidden = kp > qp
        if window is not None:
            hidden = hidden | (qp - kp >= window)
        if bias is None:
            bias = torch.zeros(hidden.shape, device=q_pos.device)
        bias = bias.masked_fill(hidden, float("-inf"))
    return bias


def make_plan(
    pe,
    q_pos,
    k_pos,
    causal: bool,
    n_head: int,
    backend: str = "auto",
    sink: bool = False,
    window=None,
    rot=None,
    far=None,
    scaling=None,
) -> AttnPlan:
    """q_pos is k_pos (the same tensor) marks the plain causal case of a full forward. sink: the layers pass a
    sink logit to attend, which SDPA takes as an extra masked key column, so is_causal cannot serve. window: a
    sliding window of that many keys (causal only). scaling: an eval-time RoPE extension (a Scaling value; ReRoPE's
    adds far scores), None for the model as built. rot: (q_rot, k_rot) already made for these positions; far:
    likewise the far rotation states (Far), for a scaling with far scores."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend '{backend}'; choose one of: {', '.join(BACKENDS)}")
    far_window = None if scaling is None or scaling.far is None else scaling.far[0]
    plain = pe.score_bias is None and pe.content_bias is None and not sink and (not causal or q_pos is k_pos)
    plain = plain and window is None and far_window is None
    if backend == "auto":
        use_flex = q_pos.is_cuda and not plain and len(q_pos) >= FLEX_MIN_QUERIES
        backend = "flex" if use_flex else "sdpa"
    plan = AttnPlan(pe, q_pos, k_pos, backend, window=window)
    if rot is None:
        plan.q_rot = pe.rotation(q_pos, scaling)
        plan.k_rot = plan.q_rot if k_pos is q_pos else pe.rotation(k_pos, scaling)
    else:
        plan.q_rot, plan.k_rot = rot
    if far_window is not None:
        plan.far = far or far_rotation(pe, q_pos, k_pos, scaling)
    if backend == "flex":
        mods = _flex_mods(pe, q_pos, k_pos, causal, window, far_window)
        plan.score_mod, plan.block_mask, plan.flex_pad, far_blocks = mods
        if plan.far is not None:
            plan.far.block_mask = far_blocks
    elif backend == "sdpa" and plain:
        plan.is_causal = causal
    else:
        plan.bias = dense_bias(pe, q_pos, k_pos, causal, n_head, window)
        if backend == "sdpa" and causal and q_pos is k_pos:
            plan.blocks = diagonal_blocks(len(q_pos))
        if plan.far is not None:
            plan.far.mask = q_pos[:, None] - k_pos[None, :] >= far_window
            if plan.blocks:
                plan.far.spans = far_spans(q_pos, k_pos, plan.blocks, far_window)
    return plan


def add_window(
    plan: AttnPlan, window: int, n_head: int, backend: str, sink: bool, k_pos=None, scaling=None
) -> AttnPlan:
    """plan.windows[window]: the plan of the layers with this sliding window, over the same queries and over
    k_pos (default the plan's keys, whose rotation state it then shares; a cache's window ring holds others).
    Always causal: the window is a causal rule, and it also hides a ring's unfilled slots (past every query).
    scaling: the plan's own (make_plan)."""
    same = k_pos is None or k_pos is plan.k_pos
    k_pos = plan.k_pos if same else k_pos
    rot = (plan.q_rot, plan.k_rot if same else plan.pe.rotation(k_pos, scaling))
    far = None if plan.far is None else far_rotation(plan.pe, plan.q_pos, None if same else k_pos, parent=plan.far)
    windowed = make_plan(plan.pe, plan.q_pos, k_pos, True, n_head, backend, sink, window, rot, far, scaling)
    windowed.q_scale, windowed.log_n = plan.q_scale, plan.log_n  # the same queries: the same query state
    plan.windows = {**(plan.windows or {}), window: windowed}
    return plan


def diagonal_blocks(n: int) -> list[tuple[int, int]] | None:
    """Query blocks (start, end) for a causal forward with a dense bias. SDPA cannot combine is_causal with a
    bias, so one call takes every key for every query, the masked half too: query rows start..end only see keys
    0..end-1, so each block is one call over just those keys (and a learned bias gets no gradient for the rest).
    On the 2-core CPU at T=256 (python bench/cpu_bench.py): T5 6% faster per training step, ALiBi within noise."""
    size = max(BLOCK_MIN_ROWS, -(-n // 8))
    return None if n <= size else [(s, min(s + size, n)) for s in range(0, n, size)]


def content_grid(content, batch: int, n_head: int, n_q: int, n_k: int, device) -> torch.Tensor:
    """A layer's content bias fn(b, h, i, j) over every (batch, head, query row, key row): (B, H, Tq, Tk) fp32."""
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(n_head, device=device).view(1, -1, 1, 1)
    i = torch.arange(n_q, device=device).view(1, 1, -1, 1)
    j = torch.arange(n_k, device=device).view(1, 1, 1, -1)
    return content(b, h, i, j).float().expand(batch, n_head, n_q, n_k)


def attend(q, k, v, plan: AttnPlan, sink=None, content=None, far=None) -> torch.Tensor:
    """q (B, H, Tq, Dh), k and v (B, Hkv, Tk, Dh) -> (B, H, Tq, Dh); sink: the layer's sink logits (H,) or None;
    content: the layer's content bias fn(b, h, i, j) (positional/base.py) or None; far: (q_far, k_far), the queries
    and keys at the far rotation, for a plan with far scores (plan.far), else None."""
    gqa = q.size(1) != k.size(1)
    if (far is None) != (plan.far is None):
        raise ValueError("attend needs far=(q_far, k_far) exactly when its plan has far scores (plan.far)")
    if plan.backend == "flex":
        return _flex(q, k, v, plan, gqa, sink, content, far)
    bias = plan.bias
    if content is not None:
        grid = content_grid(content, q.size(0), q.size(1), q.size(2), k.size(2), q.device)
        bias = grid if bias is None else bias + grid
    if far is not None:
        return split_attention(q, k, v, far, plan, bias, sink)
    if plan.backend == "reference":
        return reference_attention(q, k, v, bias, sink)
    # 4-D: on the CPU a 3-D mask sends SDPA to its math path (the whole B x H x T x T matrix), a 4-D one to flash
    mask = None if bias is None else (bias if bias.dim() == 4 else bias[None]).to(q.dtype)
    n = 0  # keys before the first real one
    if sink is not None:
        if plan.is_causal:  # is_causal has no room for the slot's column: the plan must be made with sink=True
            raise ValueError("attend got a sink logit but its plan was made without sink=True")
        k, v, mask = with_nothing_slot(k, v, mask, sink.to(q.dtype), q.size(2))
        n = 1
    if plan.blocks:  # keys past a block's last query are masked for all of it: leave them out

        def block(s, e):  # queries s..e-1 see keys 0..e-1, which follow the n leading slots
            t = n + e  # and a window drops the keys before s - W + 1 too (all of them without a leading slot)
            lo = max(0, s - plan.window + 1) if plan.window and not n else 0
            return F.scaled_dot_product_attention(
                q[:, :, s:e], k[:, :, lo:t], v[:, :, lo:t], attn_mask=mask[:, :, s:e, lo:t], enable_gqa=gqa
            )

        return torch.cat([block(s, e) for s, e in plan.blocks], dim=2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=plan.is_causal, enable_gqa=gqa)


def with_nothing_slot(k, v, mask, sink, n_queries: int):
    """Keys and values with a zero key 0 (score 0) and zero value, and the 4-D mask with column 0 = the sink logit
    (B or 1, H, Tq, 1 + Tk): SDPA's softmax then has exp(s_h) in its denominator and adds nothing to the output.
    Key 0 rather than last, so a diagonal block's keys stay one prefix slice."""
    k = torch.cat((k.new_zeros(*k.shape[:2], 1, k.size(3)), k), dim=2)  # keys may be wider than values (PoPE, ReRoPE)
    v = torch.cat((v.new_zeros(*v.shape[:2], 1, v.size(3)), v), dim=2)
    n_head, n_keys = sink.size(0), k.size(2) - 1
    batch = 1 if mask is None else mask.size(0)  # a content bias gives every sequence its own mask
    body = (sink.new_zeros(1, 1, 1, 1) if mask is None else mask).expand(batch, n_head, n_queries, n_keys)
    column = sink.view(1, n_head, 1, 1).expand(batch, n_head, n_queries, 1)
    return k, v, torch.cat((column, body), dim=-1)


def split_attention(q, k, v, far, plan: AttnPlan, bias, sink=None):
    """The dense paths of a plan with far scores, far = (q_far, k_far). A causal forward's query blocks go to SDPA
    (split_blocks); otherwise (decoding steps, short rows, the reference) the explicit fp32 softmax, with the far
    score where plan.far.mask says."""
    if plan.blocks and plan.backend == "sdpa":
        return split_blocks(q, k, v, far, plan, bias, sink)
    return reference_attention(q, k, v, bias, sink, (*far, plan.far.mask))


def split_blocks(q, k, v, far, plan: AttnPlan, bias, sink=None):
    """Per query block (rows s..e-1), one SDPA call over the block's far keys (0..hi-1) and near keys (lo..e-1)
    side by side, each scored by its own rotation: queries [q | q_far] against far keys [0 | k_far] and near keys
    [k | 0], 2 Dh wide and scaled by 1/sqrt(Dh), so a far key scores q_far . k_far and a near one q . k. The mask
    keeps a key only in the copy its distance selects, so each is in the softmax once. SDPA's fused kernel does the
    rest: explicit scores took 4.3x a plain forward at 4096 tokens, this about 2x (bench/RESULTS.md)."""
    q_far, k_far = far
    dh, gqa = q.size(-1), q.size(1) != k.size(1)
    queries = torch.cat((q, q_far), dim=-1)
    far_keys, near_keys = F.pad(k_far, (dh, 0)), F.pad(k, (0, dh))
    width = v.size(-1)  # values padded to the keys' width: SDPA's fused CPU kernel wants one head dim (2.4x faster)
    v = F.pad(v, (0, queries.size(-1) - width))
    out = []
    for (s, e), (lo, hi) in zip(plan.blocks, plan.far.spans, strict=True):
        keys = torch.cat((far_keys[:, :, :hi], near_keys[:, :, lo:e]), dim=2)
        values = torch.cat((v[:, :, :hi], v[:, :, lo:e]), dim=2)
        chosen = plan.far.mask[s:e]  # True: the far score
        keep = torch.cat((chosen[:, :hi], ~chosen[:, lo:e]), dim=-1)  # each key in the copy its distance selects
        mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(~keep, float("-inf"))[None, None]
        if bias is not None:
            b = torch.cat((bias[..., s:e, :hi], bias[..., s:e, lo:e]), dim=-1)
            mask = mask + (b if b.dim() == 4 else b[None]).to(q.dtype)
        if sink is not None:
            keys, values, mask = with_nothing_slot(keys, values, mask, sink.to(q.dtype), e - s)
        out.append(
            F.scaled_dot_product_attention(
                queries[:, :, s:e], keys, values, attn_mask=mask, scale=1 / math.sqrt(dh), enable_gqa=gqa
            )[..., :width]
        )
    return torch.cat(out, dim=2)


def far_spans(q_pos, k_pos, blocks, window: int) -> list[tuple[int, int]]:
    """Per query block (s, e) of a causal forward (positions ascending), (lo, hi): its far keys lie in 0..hi-1 (those
    at least window before its last query) and its near keys in lo..e-1 (those less than window before its first)."""
    starts = torch.tensor([s for s, _ in blocks], device=q_pos.device)
    ends = torch.tensor([e - 1 for _, e in blocks], device=q_pos.device)
    lo = torch.searchsorted(k_pos, q_pos[starts] - window, right=True)
    hi = torch.searchsorted(k_pos, q_pos[ends] - window, right=True)
    return list(zip(lo.tolist(), hi.tolist(), strict=True))


def attention_weights(q, k, bias, sink=None, far=None) -> torch.Tensor:
    """The fp32 softmax probabilities (B, H, Tq, Tk) of queries q over keys k (GQA heads shared), plus bias. With
    sink logits (H,), the nothing slot's exp(s_h) is in the denominator: rows sum to one less its share. far:
    (q_far, k_far, where (Tq, Tk) bool): where true, the score is q_far . k_far instead (ReRoPE's far keys)."""
    scores = dot_scores(q, k)
    if far is not None:
        scores = torch.where(far[2], dot_scores(far[0], far[1]), scores)
    if bias is not None:
        scores = scores + bias
    if sink is None:
        return scores.softmax(dim=-1)
    column = sink.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.cat((column, scores), dim=-1).softmax(dim=-1)[..., 1:]


def dot_scores(q, k) -> torch.Tensor:
    """q . k / sqrt(Dh) in fp32, (B, H, Tq, Tk), each key head shared by its group of query heads (GQA)."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1).float()
    return q.float() @ k.transpose(-2, -1) / math.sqrt(q.size(-1))


def reference_attention(q, k, v, bias, sink=None, far=None):
    v = v.repeat_interleave(q.size(1) // v.size(1), dim=1).float()
    return (attention_weights(q, k, bias, sink, far) @ v).to(q.dtype)


def flex_length(n: int) -> int:
    """The length flex runs at: the next power of two from one 128-row block up. Compiled flex is specialised
    to its shapes and torch.compile keeps 8 versions per function, so every length maps onto a few."""
    return max(FLEX_BLOCK, 1 << (n - 1).bit_length())


def _flex(q, k, v, plan: AttnPlan, gqa: bool, sink=None, content=None, far=None):
    """flex_attention at the padded lengths; padded queries see no key (their rows are dropped), padded keys
    are seen by no query, and flex skips the blocks that are wholly padding. A content bias reads its tables at
    rows clamped to the real ones: a padded row's score is masked whatever it reads. far: (q_far, k_far), a second
    call over the far keys, merged with the first through their log-sum-exps (module docstring)."""
    pad_q, pad_k = plan.flex_pad
    n_q, n_k = q.size(2), k.size(2)
    score_mod = plan.score_mod
    if content is not None:
        positional = plan.score_mod

        def score_mod(score, b, h, q_idx, kv_idx):
            if positional is not None:
                score = positional(score, b, h, q_idx, kv_idx)
            return score + content(b, h, q_idx.clamp(max=n_q - 1), kv_idx.clamp(max=n_k - 1))

    def padded(x, pad):  # the separately compiled flex guards on strides too: padded or not, one layout
        x = F.pad(x, (0, 0, 0, pad)) if pad else x
        return x if torch.compiler.is_compiling() else x.contiguous()  # (inside a compiled model, no copies)

    q, k, v = padded(q, pad_q), padded(k, pad_k), padded(v, pad_k)
    flex = _fused(flex_attention, q.is_cuda)
    kw = {"score_mod": score_mod, "enable_gqa": gqa}
    if sink is None and far is None:
        return flex(q, k, v, **kw, block_mask=plan.block_mask)[:, :, :n_q]

    def call(q, k, block_mask):  # (out, lse) of the real query rows
        out, aux = flex(q, k, v, **kw, block_mask=block_mask, return_aux=AuxRequest(lse=True))
        return out[:, :, :n_q], aux.lse[:, :, :n_q]

    out, lse = call(q, k, plan.block_mask)
    if far is not None:  # the far keys' call, and each call weighted by its share of the whole softmax
        out_far, lse_far = call(padded(far[0], pad_q), padded(far[1], pad_k), plan.far.block_mask)
        total = torch.logaddexp(lse, lse_far)
        near_w, far_w = (lse - total).exp().unsqueeze(-1), (lse_far - total).exp().unsqueeze(-1)
        out, lse = (out.float() * near_w + out_far.float() * far_w).to(out.dtype), total
    if sink is None:
        return out
    # exp(z_j) / (e^s + S) = softmax_j * S / (S + e^s), S = e^lse, and S / (S + e^s) = sigmoid(lse - s)
    return out * torch.sigmoid(lse - sink.float()[:, None]).unsqueeze(-1).to(out.dtype)


def _flex_mods(pe, q_pos, k_pos, causal, window=None, far_window=None):
    """score_mod, block mask, padding and (a scheme with a far window) the far keys' block mask, over positions
    padded to flex_length: a padded query sits before every key and a padded key after every query, so the causal
    rule alone hides them (and a non-causal mask tests it). A window's mask hides whole blocks of far keys, which
    flex then skips. With a far window w, the first mask keeps only keys at distance < w, the second the rest."""
    pad_q, pad_k = flex_length(len(q_pos)) - len(q_pos), flex_length(len(k_pos)) - len(k_pos)
    q_pos = F.pad(q_pos, (0, pad_q), value=-PAD_POSITION)
    k_pos = F.pad(k_pos, (0, pad_k), value=PAD_POSITION)
    score_mod = None
    if pe.score_bias is not None:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + pe.score_bias(h, q_pos[q_idx], k_pos[kv_idx])

    block_mask = far_mask = None
    if causal or pad_k or far_window is not None:

        def mask_mod(b, h, q_idx, kv_idx):
            visible = k_pos[kv_idx] <= q_pos[q_idx]
            if window is not None:
                visible = visible & (q_pos[q_idx] - k_pos[kv_idx] < window)
            visible = visible if causal else k_pos[kv_idx] < PAD_POSITION
            return visible if far_window is None else visible & (q_pos[q_idx] - k_pos[kv_idx] < far_window)

        make = _fused(create_block_mask, q_pos.is_cuda)  # eager, it would build the dense Tq x Tk mask first
        block_mask = make(mask_mod, None, None, len(q_pos), len(k_pos), device=q_pos.device)
        if far_window is not None:

            def far_mod(b, h, q_idx, kv_idx):  # d >= w >= 1: causal, and never a padded key or query
                distance = q_pos[q_idx] - k_pos[kv_idx]
                far = distance >= far_window
                return far if window is None else far & (distance < window)

            far_mask = make(far_mod, None, None, len(q_pos), len(k_pos), device=q_pos.device)
    return score_mod, block_mask, (pad_q, pad_k), far_mask


_COMPILED = {}
COMPILE_ON_CPU = False  # tests set it: the compiled flex forward runs on the CPU too (it has no CPU backward)


def _fused(fn, cuda: bool):
    """fn compiled once per process for use outside a compiled region (eval, decoding, an uncompiled model).
    Inside one, fn itself is traced and fused with the rest of the graph; on CPU, eager fn is the test path.

    Static shapes, since flex runs at the lengths flex_length pads to: one version per (batch, padded lengths),
    where one per (batch, Tq, Tk) passed torch.compile's 8-version cap after a few lengths and then ran flex
    eagerly (dense scores). dynamic=True would need no padding, but on the CPU inductor's flex template fails to
    compile with symbolic lengths and GQA (torch 2.13), and the CPU is where this is tested."""
    if not (cuda or COMPILE_ON_CPU) or torch.compiler.is_compiling():
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=False)
    return _COMPILED[fn]
