"""KV caches for decoding: a dense cache, and a fixed-size sink cache that streams without end (StreamingLLM);
generate() samples tokens through either.

python sample.py checkpoint=out/rope cache=dense            (DenseCache)
python sample.py checkpoint=out/rope cache=sink cache.window=252   (SinkCache: 4 sinks + 252 recent tokens)
python sample.py checkpoint=out/rope temperature=0.8 top_k=50      (generate; train.py prints a sample at the end)
Both preallocate and never reallocate. The model asks room() (how many tokens the next exact step may take), then
advance(n) returns a Step, through which each layer stores its keys, values and per-token state and gets back all it
attends over. A slot's position is its index minus the scheme's prefix length, as in a full forward.
"""

from dataclasses import dataclass

import torch
from torch import nn

from positional import SCHEMES
from settings import UserError

from .attention import Chunk
from .gpt import sample_next


class CacheError(UserError, ValueError):
    pass


EMPTY = 1 << 40  # the position of a ring slot not yet written: after every query, so causally masked


@dataclass
class Step:
    """One advance(): where its tokens go and every position its plan reads, so no write waits on the cache."""

    cache: "_Cache"
    slots: slice  # the slots its tokens take (a full sink cache: the one slot it overwrites)
    q_pos: torch.Tensor  # the new tokens' positions, which order them (mask, windows)
    k_pos: torch.Tensor  # every cached key's, in slot order
    q_ids: torch.Tensor  # what the scheme rotates at: the positions, or a multi-axis scheme's (axes, n)
    k_ids: torch.Tensor
    window_k_pos: torch.Tensor | None = None  # a dense cache's window rings: the keys window layers attend over
    ring_slots: torch.Tensor | None = None  # where a ring keeps the step's last W keys

    def update(self, layer: int, k, v, state, plan):
        """Store this step's keys, values and state; return all the layer attends over, keys rotated by plan."""
        return self.cache.write(self, layer, k, v, state, plan)


class _Cache:
    raw_keys = False  # True: keys stored before rotation and rotated at read, at their in-cache positions

    def __init__(self, model, batch_size: int, capacity: int, dtype=None, device=None, n_layer=None, variant=None):
        cfg, pe = model.cfg, model.pe
        self.variant = variant  # every key is rotated under it (model/variant.py)
        device = device or model.lm_head.weight.device
        dtype = dtype or model.lm_head.weight.dtype
        shape = (cfg.n_layer if n_layer is None else n_layer, batch_size, cfg.n_kv_head, capacity)
        parts = 0 if variant is None else variant.parts  # a split's rotations beside the own (ReRoPE, DCA)
        key_dim = cfg.head_dim if self.raw_keys else pe.rotated_dim() * (1 + parts)  # PoPE: wider
        self.k = torch.zeros(*shape, key_dim, dtype=dtype, device=device)
        self.v = torch.zeros(*shape, cfg.head_dim, dtype=dtype, device=device)
        state = (cfg.n_layer, batch_size, pe.state_dim, capacity)  # fp32: FoX sums it over the whole cache
        self.state = torch.zeros(state, device=device) if pe.state_dim else None
        self.pe, self.capacity, self.length = pe, capacity, 0
        self.offset = pe.n_prefix  # prefix tokens sit at negative positions
        self.slot_pos = torch.arange(capacity, device=device) - self.offset
        axes = pe.axes  # a multi-axis scheme's ids per slot (a sink cache shifts them at read)
        self.ids = torch.zeros(axes, capacity, dtype=torch.long, device=device) if axes > 1 else None
        self.explicit_ids = False  # static decoding reads slot positions only

    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.k, self.v, self.state) if t is not None)

    def write_state(self, step: Step, layer: int, state):
        """Store the new tokens' state (B, state_dim, n); return every cached token's, in slot order."""
        if state is None:
            return None
        self.state[layer, :, :, step.slots] = state
        return self.state[layer, :, :, : self.length]

    def step(self, slots: slice, ids, stream_pos, q_pos, k_pos) -> Step:
        """Store the new tokens' ids (axes, n) in their slots (None: their stream positions on every axis)."""
        if self.ids is None:
            if ids is not None:
                raise CacheError(f"positional={self.pe.name} reads one position per token; give the cache no ids")
            return Step(self, slots, q_pos, k_pos, q_pos, k_pos)
        self.ids[:, slots] = stream_pos if ids is None else ids
        self.explicit_ids |= ids is not None
        return Step(self, slots, q_pos, k_pos, self.ids[:, slots], self.ids[:, : self.length])

    def append(self, n: int, ids) -> Step:
        """The next n free slots, as a dense cache (and a sink cache until it is full) takes them."""
        slots = slice(self.length, self.length + n)
        self.length += n
        q_pos = self.slot_pos[slots]
        return self.step(slots, ids, q_pos, q_pos, self.slot_pos[: self.length])


class DenseCache(_Cache):
    """Every token kept, its key rotated once, as its position never changes. Under a split (ReRoPE, DCA) each of its
    rotations side by side (ReRoPE: 1.5x the memory, DCA 2x), as re-rotating every key per step would cost as much as
    attending to it. A window layer keeps a ring of its W most recent keys (C for a chunk), masked to the window."""

    def __init__(self, model, batch_size: int, capacity: int, dtype=None, device=None, variant=None):
        if model.pe.max_positions is not None:
            capacity = min(capacity, model.pe.max_positions + model.pe.n_prefix)
        cfg = model.cfg
        windowed = [i for i in range(cfg.n_layer) if cfg.layer_window(i) is not None]
        full = [i for i in range(cfg.n_layer) if i not in windowed]
        if windowed and model.pe.state_dim:  # a ring would have to keep the gates too
            key = "model.chunk" if cfg.chunk is not None else "model.window"
            raise CacheError(
                f"cache=dense keeps a ring of keys for {key} layers but not positional={model.pe.name}'s "
                f"per-token state; use cache=sink, or a model without {key}"
            )
        super().__init__(model, batch_size, capacity, dtype, device, n_layer=len(full), variant=variant)
        self.row = {layer: r for r, layer in enumerate(full)}  # a full layer's row of self.k
        self.ring = {layer: r for r, layer in enumerate(windowed)}  # a window layer's ring in self.wk
        # a chunked layer's keys lie within C positions of its query (Chunk): a ring of C, the mask hides the older
        self.window = cfg.window if cfg.chunk is None else cfg.chunk
        self.wk = self.wv = None
        if windowed:
            shape = (len(windowed), *self.k.shape[1:3], self.window)
            self.wk = self.k.new_zeros(*shape, self.k.size(-1))
            self.wv = self.v.new_zeros(*shape, self.v.size(-1))
            self.ring_pos = torch.full((self.window,), EMPTY, device=self.k.device)

    def nbytes(self) -> int:
        return super().nbytes() + sum(t.nbytes for t in (self.wk, self.wv) if t is not None)

    def room(self) -> int:
        if self.length >= self.capacity:
            limit = self.pe.max_positions
            why = f"positional={self.pe.name} covers {limit} positions" if limit else "the cache is full"
            raise CacheError(f"dense cache full at {self.capacity} tokens ({why}); use cache=sink to stream further")
        return self.capacity - self.length

    def advance(self, n: int, ids=None) -> Step:
        if n > self.room():
            raise CacheError(f"dense cache has room for {self.room()} more tokens, {n} were given")
        step = self.append(n, ids)
        if self.ring:  # window layers see the ring as it was plus this step's keys; it keeps the last W
            kept = step.q_pos[-self.window :]
            step.ring_slots = (kept + self.offset) % self.window
            step.window_k_pos = torch.cat((self.ring_pos, step.q_pos))
            self.ring_pos[step.ring_slots] = kept
        return step

    def write(self, step: Step, layer: int, k, v, state, plan):
        keys = self._store(step, layer, plan.new_keys(k), self.k, self.wk)  # rotated once, at their own positions
        return keys, self._store(step, layer, v, self.v, self.wv), self.write_state(step, layer, state)

    def _store(self, step: Step, layer: int, x, rows, rings):
        """Write keys or values into a full layer's row or a window layer's ring; return all the layer attends over."""
        x, width = x.to(rows.dtype), x.size(-1)  # under a split, a NoPE layer's keys fill the first columns alone
        if layer in self.ring:
            r, kept = self.ring[layer], slice(max(0, x.size(2) - self.window), None)
            out = torch.cat((rings[r, ..., :width], x), dim=2)
            rings[r, :, :, step.ring_slots, :width] = x[:, :, kept]
            return out
        layer = self.row[layer]
        rows[layer, :, :, step.slots, :width] = x
        return rows[layer, :, :, : self.length, :width]


class SinkCache(_Cache):
    """The first `sinks` tokens forever plus a ring of the `window` most recent ones (sinks=0: a plain window).
    Raw keys, rotated at read at in-cache positions as in StreamingLLM: sinks at 0..sinks-1, then the window oldest to
    newest (window layers mask those too). Until it is full it equals a dense cache."""

    raw_keys = True

    def __init__(self, model, batch_size: int, sinks: int, window: int, dtype=None, device=None, variant=None):
        if not model.pe.relative:
            raise CacheError(
                f"cache=sink needs a relative scheme ({', '.join(n for n, c in SCHEMES.items() if c.relative)}); "
                f"positional={model.pe.name} bakes absolute positions into the cached keys, so use cache=dense"
            )
        if window < 1 or sinks < 0:
            raise CacheError(f"cache.window must be >= 1 and cache.sinks >= 0, got window={window} sinks={sinks}")
        cfg = model.cfg
        if any(isinstance(cfg.layer_window(i), Chunk) for i in range(cfg.n_layer)):
            raise CacheError(
                f"cache=sink moves every kept key to an in-cache position, and model.chunk={cfg.chunk}'s chunks are "
                f"fixed spans of the stream's positions; use cache=dense"
            )
        super().__init__(model, batch_size, sinks + window, dtype, device, variant=variant)
        self.sinks, self.window = sinks, window
        self.seen = 0  # tokens fed so far, prefix included
        self._ring = torch.arange(window, device=self.slot_pos.device)

    def room(self) -> int:
        return self.capacity - self.seen if self.seen < self.capacity else 1

    def _age_rank(self, ring):
        """Each window slot's rank from oldest (0) to newest, once the cache is full."""
        return (ring - (self.seen - self.window - self.sinks)) % self.window

    def advance(self, n: int, ids=None) -> Step:
        if n > self.room():
            raise CacheError(f"sink cache can take {self.room()} tokens in this step, {n} were given")
        self.seen += n
        if self.seen <= self.capacity:  # still filling: exactly a dense cache
            return self.append(n, ids)
        slot = self.sinks + (self.seen - 1 - self.sinks) % self.window  # overwrite the oldest window token
        slots = slice(slot, slot + 1)
        k_pos = torch.cat((self.slot_pos[: self.sinks], self.sinks + self._age_rank(self._ring) - self.offset))
        stream_pos = self.seen - 1 - self.offset  # a text token's id: its place in the stream
        step = self.step(slots, ids, stream_pos, self.slot_pos[self.capacity - 1 : self.capacity], k_pos)
        if self.ids is not None:  # shifted on every axis so the window's smallest id follows the sinks
            window = self.ids[:, self.sinks :]
            shift = window.min() - self.slot_pos[self.sinks]
            step.q_ids, step.k_ids = step.q_ids - shift, torch.cat((self.ids[:, : self.sinks], window - shift), dim=1)
        return step

    def write(self, step: Step, layer: int, k, v, state, plan):
        self.k[layer, :, :, step.slots] = k
        self.v[layer, :, :, step.slots] = v
        keys = plan.keys(self.k[layer, :, :, : self.length])  # at in-cache positions
        return keys, self.v[layer, :, :, : self.length], self.write_state(step, layer, state)

    def token_indices(self) -> torch.Tensor:
        """Which tokens (0-based, prefix included) the cache holds, in slot order."""
        if self.seen <= self.capacity:
            return torch.arange(self.seen)
        ring = self.seen - self.window + self._age_rank(self._ring.cpu())
        return torch.cat((torch.arange(self.sinks), ring))


def cache_sizes(model, kind: str, train_length: int, sinks=None, window=None, max_len=None) -> dict:
    """The cache's sizes and capacity from cache=dense|sink and cache.*. Defaults: a sink cache holds a training
    sequence (the scheme's sink tokens, or 4 sinks, then the window); a dense one 16 x that, or the scheme's limit."""
    prefix, limit = model.pe.n_prefix, model.pe.max_positions
    if kind == "dense":
        capacity = max_len or limit or 16 * train_length
        return {"capacity": (capacity if limit is None else min(capacity, limit)) + prefix}
    if kind == "sink":
        sinks = (prefix or 4) if sinks is None else sinks
        window = train_length + prefix - sinks if window is None else window
        return {"sinks": sinks, "window": window, "capacity": sinks + window}
    raise CacheError(f"unknown cache '{kind}'; choose dense or sink")


def build_cache(model, kind: str, batch_size: int, sizes: dict, dtype=None, variant=None):
    if kind == "dense":
        return DenseCache(model, batch_size, sizes["capacity"], dtype, variant=variant)
    return SinkCache(model, batch_size, sizes["sinks"], sizes["window"], dtype, variant=variant)


def hold_matrices(model, dtype: torch.dtype):
    """Every nn.Linear weight in dtype, in place, for decoding under autocast, which would recast each fp32 weight
    every step: 6 bytes moved per weight where 2 suffice. The same products, as autocast computes in dtype anyway."""
    if dtype != torch.float32:
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.to(dtype)
    return model


@torch.no_grad()
def generate(model, prompt, cache, max_new_tokens: int, temperature=1.0, top_k=None, generator=None, decoder=None):
    """Yield (B,) token ids a step at a time, without end if max_new_tokens < 0. decoder(model, cache): the step
    after the prompt (model/static_decode.py StaticDecoder); None: eager model.decode."""
    logits = model.decode(prompt, cache)[:, -1]  # the prompt: eager, in as few chunks as the cache allows
    step = None if decoder is None else decoder(model, cache)
    n = 0
    while max_new_tokens < 0 or n < max_new_tokens:
        tok = sample_next(logits, temperature, top_k, generator)
        yield tok
        n += 1
        if n != max_new_tokens:
            logits = model.decode(tok[:, None], cache)[:, -1] if step is None else step(tok[:, None])
