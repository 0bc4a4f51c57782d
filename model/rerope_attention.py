"""ReRoPE's two-window attention: keys past a window scored through a second rotation, in every backend.

python eval.py checkpoint=out/rope eval.rope_scaling=rerope          (positional/rerope.py: which distances)
python sample.py checkpoint=out/rope rope_scaling=leaky_rerope       (through either KV cache)
A key at distance d >= w (Scaling.far = (w, leak)) scores q_far . k_far: queries and keys rotated at
rerope.far_positions. The plan holds a Far whose queries() and keys() return [near | far] side by side, so a dense
cache stores a key's far rotation beside its near one (it depends on the key's position alone) and a sink cache
rotates both at read. Each key enters the softmax once, with the score its distance selects:
  sdpa       a causal forward: per query block, one SDPA call over its far and near keys (split_blocks); decoding
             steps and short rows as the reference
  reference  both score matrices in fp32, torch.where between them
  flex       two calls, near keys with q, k and far keys with q_far, k_far, each weighted by its share of the softmax:
             out = out_n e^(lse_n - lse) + out_f e^(lse_f - lse), lse = logaddexp(lse_n, lse_f) (a row with no far
             key has lse_f = -inf; every row has a near key, itself)
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from positional import rerope

from .attention import dot_scores, hiding, sdpa, softmax_weights, weighted_values, with_nothing_slot
from .flex import block_mask, flex_call, flex_positions, visible_mod, without_nothing


@dataclass
class Far:
    """Far scores' rotation states, and (once masked for a plan) which keys take them, in its backend's form."""

    window: int  # w: keys at distance >= w score far
    leak: float  # far distances w + (d - w) / leak
    scaling: object  # the Scaling whose frequencies rotate the far positions too
    q_pos: torch.Tensor  # the queries' far positions and their rotation state
    q_rot: object
    k_pos: torch.Tensor  # the keys'
    k_rot: object
    new_pos: torch.Tensor  # keys' far positions at the query positions: a decoding step's own keys
    new_rot: object
    mask: torch.Tensor | None = None  # dense paths: (Tq, Tk) bool, True where a key scores far
    spans: list | None = None  # sdpa, a causal forward: per query block, where its far and near keys lie
    block_mask: object = None  # flex: the far call's block mask (the plan's own then holds the near keys)

    @classmethod
    def at(cls, pe, q_pos, k_pos, scaling) -> "Far":
        """The far rotation states at these positions (q_pos is k_pos: a full forward, whose keys are its queries)."""
        w, leak = scaling.far
        fq, fn = rerope.far_positions(q_pos, False, w, leak), rerope.far_positions(q_pos, True, w, leak)
        new_rot = pe.rotation(fn, scaling)
        far = cls(w, leak, scaling, fq, pe.rotation(fq, scaling), fn, new_rot, fn, new_rot)
        return far if k_pos is q_pos else far.over(pe, q_pos, k_pos)

    def over(self, pe, q_pos, k_pos=None) -> "Far":
        """The same queries' far states over other keys (None: the same keys), unmasked (make_plan masks it)."""
        far = replace(self, mask=None, spans=None, block_mask=None)
        if k_pos is not None:
            far.k_pos = rerope.far_positions(k_pos, True, self.window, self.leak)
            far.k_rot = pe.rotation(far.k_pos, self.scaling)
        return far

    def queries(self, pe, q):
        return pe.rotate(q, self.q_pos, self.q_rot)

    def keys(self, pe, k):
        return pe.rotate_key(k, self.k_pos, self.k_rot)

    def new_keys(self, pe, k):
        return pe.rotate_key(k, self.new_pos, self.new_rot)

    def masked(self, plan) -> "Far":
        """A copy that knows which of plan's keys take far scores, in the form plan's backend reads."""
        far, q_pos, k_pos, w = replace(self), plan.q_pos, plan.k_pos, self.window
        if plan.backend == "flex":
            far.block_mask = split_block_mask(q_pos, k_pos, w, plan.window, True, far=True)
            return far
        far.mask = q_pos[:, None] - k_pos[None, :] >= w
        if plan.mask.blocks:
            far.spans = far_spans(q_pos, k_pos, plan.mask.blocks, w)
        return far

    def attend(self, q, k, v, plan, bias, sink=None):
        """q and k [near | far] side by side (plan.queries, plan.keys) -> (B, H, Tq, Dh)."""
        if plan.backend == "flex":
            return self.flex(q, k, v, plan, sink)
        if plan.mask.blocks and plan.backend == "sdpa":
            return split_blocks(q, k, v, plan, bias, sink)
        (q, q_far), (k, k_far) = q.chunk(2, dim=-1), k.chunk(2, dim=-1)
        scores = torch.where(self.mask, dot_scores(q_far, k_far), dot_scores(q, k))
        return weighted_values(softmax_weights(scores, bias, sink), v, q.dtype)

    def flex(self, q, k, v, plan, sink=None):
        """The near keys' call and the far keys', each weighted by its share of the whole softmax."""
        (q, q_far), (k, k_far) = q.chunk(2, dim=-1), k.chunk(2, dim=-1)
        out, lse = flex_call(q, k, v, plan, plan.mask.block_mask, plan.mask.score_mod, lse=True)
        out_far, lse_far = flex_call(q_far, k_far, v, plan, self.block_mask, plan.mask.score_mod, lse=True)
        total = torch.logaddexp(lse, lse_far)
        near_w, far_w = (lse - total).exp().unsqueeze(-1), (lse_far - total).exp().unsqueeze(-1)
        out = (out.float() * near_w + out_far.float() * far_w).to(out.dtype)
        return out if sink is None else without_nothing(out, total, sink)


def split_block_mask(q_pos, k_pos, w: int, window: int | None, causal: bool, far: bool):
    """flex's block mask of the far keys (d >= w) or of the near ones (d < w), among those the plan shows
    (visible_mod; a far key, at d >= w >= 1, is at or before its query and never padding)."""
    q_pos, k_pos, _ = flex_positions(q_pos, k_pos)
    visible = visible_mod(q_pos, k_pos, causal or far, hiding(window))

    def split_mod(b, h, q_idx, kv_idx):
        distance = q_pos[q_idx] - k_pos[kv_idx]
        return visible(b, h, q_idx, kv_idx) & ((distance >= w) if far else (distance < w))

    return block_mask(split_mod, q_pos, k_pos)


def split_blocks(q, k, v, plan, bias, sink=None):
    """Per query block (rows s..e-1), one SDPA call with queries [q | q_far] against far keys [0 | k_far] (0..hi-1)
    and near keys [k | 0] (lo..e-1); the mask keeps each key in the copy its distance selects. Explicit scores took
    4.3x a plain forward at 4096 tokens, this about 2x (bench/cpu_bench.py)."""
    dh, far = q.size(-1) // 2, plan.far
    near_keys, far_keys = F.pad(k[..., :dh], (0, dh)), F.pad(k[..., dh:], (dh, 0))
    width = v.size(-1)  # values padded to the keys' width: SDPA's fused CPU kernel wants one head dim (2.4x faster)
    v = F.pad(v, (0, q.size(-1) - width))
    out = []
    for (s, e), (lo, hi) in zip(plan.mask.blocks, far.spans, strict=True):
        keys = torch.cat((far_keys[:, :, :hi], near_keys[:, :, lo:e]), dim=2)
        values = torch.cat((v[:, :, :hi], v[:, :, lo:e]), dim=2)
        chosen = far.mask[s:e]  # True: the far score
        keep = torch.cat((chosen[:, :hi], ~chosen[:, lo:e]), dim=-1)  # each key in the copy its distance selects
        mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(~keep, float("-inf"))[None, None]
        if bias is not None:
            b = torch.cat((bias[..., s:e, :hi], bias[..., s:e, lo:e]), dim=-1)
            mask = mask + (b if b.dim() == 4 else b[None]).to(q.dtype)
        if sink is not None:
            keys, values, mask = with_nothing_slot(keys, values, mask, sink.to(q.dtype), e - s)
        out.append(
            sdpa(
                q[:, :, s:e], keys, values, attn_mask=mask, scale=1 / math.sqrt(dh), enable_gqa=q.size(1) != k.size(1)
            )[..., :width]
        )
    return torch.cat(out, dim=2)


def far_spans(q_pos, k_pos, blocks, window: int) -> list[tuple[int, int]]:
    """Per query block (s, e) of a causal forward, (lo, hi): its far keys lie in 0..hi-1, its near keys in lo..e-1."""
    starts = torch.tensor([s for s, _ in blocks], device=q_pos.device)
    ends = torch.tensor([e - 1 for _, e in blocks], device=q_pos.device)
    lo = torch.searchsorted(k_pos, q_pos[starts] - window, right=True)
    hi = torch.searchsorted(k_pos, q_pos[ends] - window, right=True)
    return list(zip(lo.tolist(), hi.tolist(), strict=True))
