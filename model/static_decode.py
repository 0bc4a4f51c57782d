"""One-token decoding with fixed shapes, compiled once and replayed: CUDA graphs for batch-1 generation.

python bench/decode_bench.py --checkpoint out/rope --static     (rows "sink static", "dense static")
python sample.py checkpoint=out/rope static=true
Eager decoding attends over the cache's filled slots, a length that grows every step, so a compiled step
would see a new shape each token. Here every step attends over the whole preallocated cache: the new key
goes to its slot by index_copy_, and slots not yet written get a position past every query, which the
causal mask hides. The host keeps the cache's bookkeeping (which slot, which positions) and copies it into
three small tensors the compiled step reads, so shapes and addresses never change and the step compiles
once (`torch.compile(mode="reduce-overhead")`, CUDA graphs on CUDA).
"""

import torch

from .kv_cache import CacheError

HIDDEN = 2**30  # the position of an empty slot: after every query, so causally masked


class StaticDecoder:
    """decoder(tok (B, 1)) -> next-token logits (B, V), through `cache` (already prefilled by model.decode)."""

    def __init__(self, model, cache, compile: bool = True):
        if getattr(cache, "ring", None):
            raise CacheError("static decoding keeps no window rings; use cache=sink or static=false for model.window")
        self.model, self.cache = model, cache
        device = cache.k.device
        self.q_pos = torch.zeros(1, dtype=torch.long, device=device)
        self.k_pos = torch.full((cache.capacity,), HIDDEN, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        if device.type == "cuda":  # CUDA graphs need these at fixed addresses, written in place between replays
            for t in (self.q_pos, self.k_pos, self.slot, cache.k, cache.v, cache.state, cache.kf):
                if t is not None:
                    torch._dynamo.mark_static_address(t)
        mode = "reduce-overhead" if device.type == "cuda" else "default"
        self.step = torch.compile(self._step, mode=mode, fullgraph=True) if compile else self._step

    def __call__(self, tok: torch.Tensor) -> torch.Tensor:
        if self.cache.length == 0:  # a fresh stream starts with the scheme's learned sink tokens: eager decode
            return self.model.decode(tok, self.cache)[:, -1]  # puts them first, as every later step expects
        if self.cache.explicit_ids:  # the step below reads slot positions, not the ids a decode(pos=...) stored
            raise CacheError(
                "static decoding reads one position per token; this cache holds multi-axis ids: static=false"
            )
        q_pos, k_pos = self.cache.advance(1)  # the eager cache's bookkeeping: raises CacheError when full
        self.q_pos.copy_(q_pos)
        self.slot.fill_(self.cache.slot)
        self.k_pos[: len(k_pos)] = k_pos  # filled slots only ever grow, so the rest stay HIDDEN
        return self.step(tok)

    def _step(self, tok):
        m = self.model
        h = m.pe.embed(m.wte(tok), self.q_pos)
        plan = m.plan(self.q_pos, self.k_pos, True, backend="sdpa", variant=self.cache.variant)
        for block in m.blocks:
            h = block(h, plan, self)
        return m._head(h)[:, -1]

    def update(self, layer: int, k, v, plan):
        """The cache interface the attention layers call: store this token, return every slot."""
        if not self.cache.raw_keys:
            k = plan.pe.rotate_key(k, plan.q_pos, plan.q_rot)  # the layer's own scheme (positional.layers)
        self.cache.k[layer].index_copy_(2, self.slot, k.to(self.cache.k.dtype))
        self.cache.v[layer].index_copy_(2, self.slot, v.to(self.cache.v.dtype))
        keys = self.cache.k[layer]
        if self.cache.raw_keys:
            keys = plan.pe.rotate_key(keys, plan.k_pos, plan.k_rot)
        return keys, self.cache.v[layer]

    def update_far(self, layer: int, k, plan):
        """The far rotation (ReRoPE) of this token's key to its slot (dense) or of every raw key (sink), every slot's
        back, as the eager caches do."""
        if self.cache.raw_keys:
            return plan.pe.rotate_key(self.cache.k[layer], plan.far.k_pos, plan.far.k_rot)
        k = plan.pe.rotate_key(k, plan.far.new_pos, plan.far.new_rot)
        self.cache.kf[layer].index_copy_(2, self.slot, k.to(self.cache.kf.dtype))
        return self.cache.kf[layer]

    def update_state(self, layer: int, state):
        """The scheme's per-token state (FoX's log forget gates): this token's to its slot, every slot's back
        (an empty slot's position is HIDDEN, past every query, so the scheme orders it last)."""
        self.cache.state[layer].index_copy_(2, self.slot, state.to(self.cache.state.dtype))
        return self.cache.state[layer]
