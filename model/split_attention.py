"""Scores through several rotations of the same queries and keys, each key taking the one its positions select:
ReRoPE's far keys (positional/rerope.py Far) and Dual Chunk Attention's chunks (positional/dca.py Chunks).

python eval.py checkpoint=out/rope eval.rope_scaling=rerope          (or leaky_rerope, dca)
python sample.py checkpoint=out/rope rope_scaling=dca                (through either KV cache)
A split gives the plan's own rotation its positions (main: ReRoPE's are the tokens', DCA's j mod c), its other
parts' query and key positions, and select(q_pos, k_pos): the part each score takes (0: the plan's own). Parts'
queries() and keys() are [own | part 1 | ...] side by side, so a dense cache stores a key's every rotation (each
depends on the key's position alone) and a sink cache rotates them at read. Each key enters the softmax once:
  sdpa       a causal forward: per query block, one SDPA call over the keys each part takes (split_blocks);
             decoding steps and short rows as the reference
  reference  every part's score matrix in fp32, the selected one per (query, key)
  flex       a call per part over the keys it takes: out = sum_p out_p e^(lse_p - lse), lse = logsumexp_p(lse_p)
             (a part with no key in a row has lse_p = -inf; every row has a key of part 0, itself)
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from .attention import dot_scores, hiding, sdpa, softmax_weights, weighted_values, with_nothing_slot
from .flex import block_mask, flex_call, flex_positions, visible_mod, without_nothing


@dataclass
class Parts:
    """The other parts' rotation states and, once masked for a plan, each score's part in the form its backend reads."""

    split: object  # positional/rerope.py Far or positional/dca.py Chunks
    scaling: object  # the Scaling whose frequencies rotate every part
    q_pos: list  # per part past the own: the queries' positions and rotation states
    q_rot: list
    k_pos: list  # the keys'
    k_rot: list
    new_pos: list  # the keys' at the query positions: a decoding step's own keys
    new_rot: list
    part: torch.Tensor | None = None  # dense paths: (Tq, Tk) int8, the part each score takes
    spans: list | None = None  # sdpa, a causal forward: per query block, per part, the (lo, hi) of its keys
    block_masks: list | None = None  # flex: each other part's call's block mask (the plan's own holds part 0's)

    @classmethod
    def at(cls, pe, q_pos, k_pos, scaling) -> "Parts":
        """Their rotation states at these positions (q_pos is k_pos: a full forward, whose keys are its queries)."""
        split = scaling.split
        fq, fn = split.queries(q_pos), split.keys(q_pos)
        new_rot = [pe.rotation(p, scaling) for p in fn]
        parts = cls(split, scaling, fq, [pe.rotation(p, scaling) for p in fq], fn, new_rot, fn, new_rot)
        return parts if k_pos is q_pos else parts.over(pe, q_pos, k_pos)

    def over(self, pe, q_pos, k_pos=None) -> "Parts":
        """The same queries' states over other keys (None: the same keys), unmasked (make_plan masks it)."""
        parts = replace(self, part=None, spans=None, block_masks=None)
        if k_pos is not None:
            parts.k_pos = self.split.keys(k_pos)
            parts.k_rot = [pe.rotation(p, self.scaling) for p in parts.k_pos]
        return parts

    def own_rotation(self, pe, pos):
        """The plan's own rotation, at the split's main positions (DCA: j mod c)."""
        return pe.rotation(self.split.main(pos), self.scaling)

    def queries(self, pe, q) -> list:
        return [pe.rotate(q, p, r) for p, r in zip(self.q_pos, self.q_rot, strict=True)]

    def keys(self, pe, k) -> list:
        return [pe.rotate_key(k, p, r) for p, r in zip(self.k_pos, self.k_rot, strict=True)]

    def new_keys(self, pe, k) -> list:
        return [pe.rotate_key(k, p, r) for p, r in zip(self.new_pos, self.new_rot, strict=True)]

    def masked(self, plan) -> "Parts":
        """A copy that knows which part each of plan's keys takes, in the form plan's backend reads."""
        parts, q_pos, k_pos = replace(self), plan.q_pos, plan.k_pos
        if plan.backend == "flex":
            others = range(1, self.split.parts + 1)
            parts.block_masks = [part_block_mask(q_pos, k_pos, self.split, p, plan.window, True) for p in others]
            return parts
        parts.part = self.split.select(q_pos[:, None], k_pos[None, :]).to(torch.int8)  # Tq x Tk: a byte each
        if plan.mask.blocks:
            parts.spans = part_spans(q_pos, k_pos, parts.part, plan.mask.blocks, self.split.parts)
        return parts

    def attend(self, q, k, v, plan, bias, sink=None):
        """q and k [own | part 1 | ...] side by side (plan.queries, plan.keys) -> (B, H, Tq, Dh)."""
        if plan.mask.blocks and plan.backend == "sdpa":
            return split_blocks(q, k, v, plan, bias, sink)
        qs, ks = q.chunk(self.split.parts + 1, dim=-1), k.chunk(self.split.parts + 1, dim=-1)
        if plan.backend == "flex":
            return self.flex(qs, ks, v, plan, sink)
        scores = dot_scores(qs[0], ks[0])
        for p in range(1, len(qs)):
            scores = torch.where(self.part == p, dot_scores(qs[p], ks[p]), scores)
        return weighted_values(softmax_weights(scores, bias, sink), v, qs[0].dtype)

    def flex(self, qs, ks, v, plan, sink=None):
        """A call per part, each weighted by its share of the whole softmax."""
        masks = [plan.mask.block_mask, *self.block_masks]
        calls = [
            flex_call(a, b, v, plan, m, plan.mask.score_mod, lse=True) for a, b, m in zip(qs, ks, masks, strict=True)
        ]
        total = torch.logsumexp(torch.stack([lse for _, lse in calls]), dim=0)
        out = sum(o.float() * (lse - total).exp().unsqueeze(-1) for o, lse in calls).to(calls[0][0].dtype)
        return out if sink is None else without_nothing(out, total, sink)


def part_block_mask(q_pos, k_pos, split, part: int, window: int | None, causal: bool):
    """flex's block mask of the keys whose scores take this part, among those the plan shows (visible_mod; a key of
    another part than 0 is before its query and never padding)."""
    q_pos, k_pos, _ = flex_positions(q_pos, k_pos)
    visible = visible_mod(q_pos, k_pos, causal or part > 0, hiding(window))

    def part_mod(b, h, q_idx, kv_idx):
        return visible(b, h, q_idx, kv_idx) & (split.select(q_pos[q_idx], k_pos[kv_idx]) == part)

    return block_mask(part_mod, q_pos, k_pos)


def split_blocks(q, k, v, plan, bias, sink=None):
    """Per query block (rows s..e-1), one SDPA call with queries [q | q_1 | ...] against each part's keys, placed in
    its own slot of that width (zeros elsewhere) and cut to the keys it takes there; the mask keeps each key in the
    copy its part selects. Explicit scores took 4.3x a plain forward at 4096 tokens, this about 2x for ReRoPE
    (bench/cpu_bench.py)."""
    parts = plan.parts
    n = parts.split.parts + 1
    dh = q.size(-1) // n
    slotted = [F.pad(kp, (p * dh, (n - 1 - p) * dh)) for p, kp in enumerate(k.chunk(n, dim=-1))]
    width = v.size(-1)  # values padded to the keys' width: SDPA's fused CPU kernel wants one head dim (2.4x faster)
    v = F.pad(v, (0, q.size(-1) - width))
    scale, gqa = 1 / math.sqrt(dh), q.size(1) != k.size(1)
    out = []
    for (s, e), spans in zip(plan.mask.blocks, parts.spans, strict=True):
        keys = torch.cat([slotted[p][:, :, lo:hi] for p, (lo, hi) in enumerate(spans)], dim=2)
        values = torch.cat([v[:, :, lo:hi] for lo, hi in spans], dim=2)
        keep = torch.cat([parts.part[s:e, lo:hi] == p for p, (lo, hi) in enumerate(spans)], dim=-1)
        mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(~keep, float("-inf"))[None, None]
        if bias is not None:
            b = torch.cat([bias[..., s:e, lo:hi] for lo, hi in spans], dim=-1)
            mask = mask + (b if b.dim() == 4 else b[None]).to(q.dtype)
        if sink is not None:
            keys, values, mask = with_nothing_slot(keys, values, mask, sink.to(q.dtype), e - s)
        out.append(sdpa(q[:, :, s:e], keys, values, attn_mask=mask, scale=scale, enable_gqa=gqa)[..., :width])
    return torch.cat(out, dim=2)


def part_spans(q_pos, k_pos, part, blocks, n_parts: int) -> list[list[tuple[int, int]]]:
    """Per query block (s, e) of a causal forward, per part, (lo, hi): the keys lo..hi-1 hold every key at or before
    a query of the block that takes that part (an empty span where none does)."""
    seen = k_pos[None, :] <= q_pos[:, None]
    spans = []
    for s, e in blocks:
        cols = [((part[s:e] == p) & seen[s:e]).any(0).nonzero() for p in range(n_parts + 1)]
        spans.append([(int(c[0]), int(c[-1]) + 1) if len(c) else (0, 0) for c in cols])
    return spans
