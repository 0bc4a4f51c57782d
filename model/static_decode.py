"""One-token decoding with fixed shapes, compiled once and replayed: CUDA graphs for batch-1 generation.

python bench/decode_bench.py --checkpoint out/rope --static     (rows "sink static", "dense static")
python sample.py checkpoint=out/rope static=true
Every step attends over the whole preallocated cache, so shapes and addresses never change and it compiles once:
the new key goes to its slot by index_copy_, unwritten slots sit past every query (causally masked), and the host
copies the cache's bookkeeping into three small tensors the compiled step reads.
"""

import torch

from .kv_cache import CacheError

HIDDEN = 2**30  # the position of an empty slot: after every query, so causally masked


class StaticDecoder:
    """decoder(tok (B, 1)) -> next-token logits (B, V), through `cache` (already prefilled by model.decode)."""

    def __init__(self, model, cache, compile: bool = True):
        if getattr(cache, "ring", None):
            raise CacheError(
                "static decoding keeps no window rings; pass static=false (for model.window, cache=sink serves too)"
            )
        self.model, self.cache = model, cache
        device = cache.k.device
        self.q_pos = torch.zeros(1, dtype=torch.long, device=device)
        self.k_pos = torch.full((cache.capacity,), HIDDEN, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        if device.type == "cuda":  # CUDA graphs need these at fixed addresses, written in place between replays
            for t in (self.q_pos, self.k_pos, self.slot, cache.k, cache.v, cache.state):
                if t is not None:
                    torch._dynamo.mark_static_address(t)
        mode = "reduce-overhead" if device.type == "cuda" else "default"
        self.step = torch.compile(self._step, mode=mode, fullgraph=True) if compile else self._step

    def __call__(self, tok: torch.Tensor) -> torch.Tensor:
        if self.cache.length == 0:  # eager decode puts the scheme's learned sink tokens first
            return self.model.decode(tok, self.cache)[:, -1]
        if self.cache.explicit_ids:  # the step below reads slot positions, not the ids a decode(pos=...) stored
            raise CacheError(
                "static decoding reads one position per token; this cache holds multi-axis ids: static=false"
            )
        step = self.cache.advance(1)  # the eager cache's bookkeeping: raises CacheError when full
        self.q_pos.copy_(step.q_pos)
        self.slot.fill_(step.slots.start)
        self.k_pos[: len(step.k_pos)] = step.k_pos  # filled slots only ever grow, so the rest stay HIDDEN
        return self.step(tok)

    def _step(self, tok):
        m = self.model
        h = m.pe.embed(m.wte(tok), self.q_pos)
        plan = m.plan(self.q_pos, self.k_pos, True, backend="sdpa", variant=self.cache.variant)
        for block in m.blocks:
            h = block(h, plan, self)
        return m._head(h)[:, -1]

    def update(self, layer: int, k, v, state, plan):
        """kv_cache.Step's interface: store this token (key raw for a sink cache), return every slot."""
        cache = self.cache
        if not cache.raw_keys:
            k = plan.new_keys(k)  # the layer's own scheme (positional.layers), far rotation included
        rows = cache.k[layer, ..., : k.size(-1)]  # under a split, a NoPE layer's keys fill the first columns alone
        rows.index_copy_(2, self.slot, k.to(cache.k.dtype))
        cache.v[layer].index_copy_(2, self.slot, v.to(cache.v.dtype))
        keys = plan.keys(rows) if cache.raw_keys else rows
        if state is not None:  # FoX's log forget gates: an empty slot's position is HIDDEN, so it sorts last
            cache.state[layer].index_copy_(2, self.slot, state.to(cache.state.dtype))
            state = cache.state[layer]
        return keys, cache.v[layer], state
