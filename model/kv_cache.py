"""KV caches for decoding: a dense cache, and a fixed-size sink cache that streams without end (StreamingLLM).

python sample.py checkpoint=out/rope cache=dense            (DenseCache)
python sample.py checkpoint=out/rope cache=sink cache.window=252   (SinkCache: 4 sinks + 252 recent tokens)
Both preallocate (layers, batch, kv heads, capacity, head dim) and never reallocate while decoding. The model
drives a cache through three calls: room() (how many tokens the next exact step may append), advance(n)
(reserve slots, return the new tokens' positions and every cached key's position) and update(layer, k, v, plan)
(store this step's keys and values, return all cached keys, rotated by the plan's scheme and rotation state (a
layer's own: positional.layers), and values),
and for a scheme with per-token state (positional/base.py layer_module: FoX's log forget gates) update_state(layer,
state) (store it beside the new keys, return every cached key's, in slot order; the scheme orders them by position),
and for a scheme with a far rotation (ReRoPE, positional/rerope.py) update_far(layer, k, plan) (after update(): every
cached key at the far rotation). The dense cache keeps the new keys at both rotations, 1.5x its memory, as a far
key's rotation depends on its own position alone and so never changes: re-rotating every cached key per step
would cost as much as attending to it. The sink cache rotates the raw keys it keeps, at in-cache positions.
A slot's position is its index in the cache minus the scheme's prefix length, so a full forward and a cache
agree on positions.
Multi-axis schemes (rope2d, mrope: positional/base.py axes > 1): advance(n, ids) also takes the new tokens' position
ids (axes, n), kept per slot (default: the token's place in the stream on every axis, a text token), and
position_ids() returns the ids the scheme rotates this step's queries and every cached key at; the slot positions
above still order the tokens (mask, windows). A sink cache re-indexes ids as it does positions: the sinks keep theirs
and the window's are shifted, by one amount on every axis, so that its smallest id sits right after the sink slots:
offsets within the window are kept, and a text stream gets exactly the 1D in-cache positions.
Sliding-window layers (model.window): the dense cache keeps each a ring of the W most recent keys (rotated, at
their positions) instead of a full row, so such a layer never holds more than W keys between steps; a step's
queries see the ring plus the step's own keys, masked to the window. The sink cache keeps every layer's keys
(constant memory anyway) and the window mask applies to their in-cache positions.
"""

import torch

from positional import SCHEMES


class CacheError(ValueError):
    pass


EMPTY = 1 << 40  # the position of a ring slot not yet written: after every query, so causally masked


class _Cache:
    raw_keys = False  # True: keys stored before rotation and rotated at read, at their in-cache positions

    def __init__(self, model, batch_size: int, capacity: int, dtype=None, device=None, n_layer=None, variant=None):
        cfg = model.cfg
        self.variant = variant  # the evaluation variant every key is rotated under (model/variant.py)
        device = device or model.lm_head.weight.device
        dtype = dtype or model.lm_head.weight.dtype
        shape = (cfg.n_layer if n_layer is None else n_layer, batch_size, cfg.n_kv_head, capacity, cfg.head_dim)
        key_dim = cfg.head_dim if self.raw_keys else model.pe.rotated_dim()  # rotated keys may be wider (PoPE)
        self.k = torch.zeros(shape[:-1] + (key_dim,), dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        state = (cfg.n_layer, batch_size, model.pe.state_dim, capacity)  # fp32: FoX sums it over the whole cache
        self.state = torch.zeros(state, device=device) if model.pe.state_dim else None
        self.pe, self.capacity, self.length = model.pe, capacity, 0
        self.kf = None  # the dense cache's keys at the far rotation (ReRoPE), made at the first step that needs them
        self.offset = model.pe.n_prefix  # prefix tokens sit at negative positions, the text starts at 0
        self.slot_pos = torch.arange(capacity, device=device) - self.offset
        axes = model.pe.axes  # a multi-axis scheme's ids per slot, as given (a sink cache shifts them at read)
        self.ids = torch.zeros(axes, capacity, dtype=torch.long, device=device) if axes > 1 else None
        self.explicit_ids = False  # whether some step was given ids (static decoding reads slot positions only)

    def nbytes(self) -> int:
        extra = [t.nbytes for t in (self.state, self.kf) if t is not None]
        return self.k.nbytes + self.v.nbytes + sum(extra)

    def update_state(self, layer: int, state):
        """Store the new tokens' per-token state (B, state_dim, n) as they are (a sink cache re-indexes at read, as it
        does keys); return every cached token's, in slot order."""
        self.state[layer, :, :, self._new] = state
        return self.state[layer, :, :, : self.length]

    def window_positions(self, q_pos, k_pos):
        """The positions of the keys window layers attend over this step: None, the same keys as every layer."""
        return None

    def _keep_ids(self, ids, stream_pos):
        """Store the new tokens' ids (axes, n) in their slots; None: their stream positions on every axis."""
        if self.ids is None:
            if ids is not None:
                raise CacheError(f"positional={self.pe.name} reads one position per token; give the cache no ids")
            return
        self.ids[:, self._new] = stream_pos if ids is None else ids
        self.explicit_ids |= ids is not None

    def position_ids(self):
        """(query ids, key ids) of the last advance(): what the scheme rotates at (1D schemes: the positions)."""
        if self.ids is None:
            return self._q_pos, self._k_pos
        return self.ids[:, self._new], self.ids[:, : self.length]

    @property
    def slot(self) -> int:
        """The first slot the last advance() reserved."""
        return self._new.start


class DenseCache(_Cache):
    """Every token kept; keys stored already rotated, since their positions never change."""

    def __init__(self, model, batch_size: int, capacity: int, dtype=None, device=None, variant=None):
        if model.pe.max_positions is not None and capacity > model.pe.max_positions + model.pe.n_prefix:
            capacity = model.pe.max_positions + model.pe.n_prefix  # the scheme cannot go further anyway
        cfg = model.cfg
        windowed = [i for i in range(cfg.n_layer) if cfg.layer_window(i) is not None]
        full = [i for i in range(cfg.n_layer) if i not in windowed]
        if windowed and model.pe.state_dim:  # a ring would have to keep the gates too, in its own slot order
            raise CacheError(
                f"cache=dense keeps a ring of keys for model.window layers but not positional={model.pe.name}'s "
                f"per-token state; use cache=sink, or a model without model.window"
            )
        super().__init__(model, batch_size, capacity, dtype, device, n_layer=len(full), variant=variant)
        self.row = {layer: r for r, layer in enumerate(full)}  # a full layer's row of self.k
        self.ring = {layer: r for r, layer in enumerate(windowed)}  # a window layer's ring in self.wk
        self.window = cfg.window
        self.wk = self.wv = self.wkf = None  # window rings of keys, values and far keys (ReRoPE), where needed
        if windowed:
            shape = (len(windowed), *self.k.shape[1:3], cfg.window)
            self.wk = self.k.new_zeros(*shape, self.k.size(-1))
            self.wv = self.v.new_zeros(*shape, self.v.size(-1))
            self.ring_pos = torch.full((cfg.window,), EMPTY, device=self.k.device)

    def nbytes(self) -> int:
        return super().nbytes() + sum(t.nbytes for t in (self.wk, self.wv, self.wkf) if t is not None)

    def room(self) -> int:
        if self.length >= self.capacity:
            limit = self.pe.max_positions
            why = f"positional={self.pe.name} covers {limit} positions" if limit else "the cache is full"
            raise CacheError(f"dense cache full at {self.capacity} tokens ({why}); use cache=sink to stream further")
        return self.capacity - self.length

    def advance(self, n: int, ids=None):
        if n > self.room():
            raise CacheError(f"dense cache has room for {self.room()} more tokens, {n} were given")
        self._new = slice(self.length, self.length + n)
        self.length += n
        q_pos = self.slot_pos[self._new]
        self._keep_ids(ids, q_pos)
        self._q_pos, self._k_pos = q_pos, self.slot_pos[: self.length]
        if self.ring:  # window layers see their ring as it was plus this step's keys; the ring keeps the last W
            self._window_k_pos = torch.cat((self.ring_pos, q_pos))
            kept = q_pos[-self.window :]
            self._ring_slots = (kept + self.offset) % self.window
            self.ring_pos[self._ring_slots] = kept
        return self._q_pos, self._k_pos

    def window_positions(self, q_pos, k_pos):
        return self._window_k_pos if self.ring else None

    def update(self, layer: int, k, v, plan):
        k = plan.pe.rotate_key(k, plan.q_pos, plan.q_rot)  # at the new keys' positions
        return self._store(layer, k, self.k, self.wk), self._store(layer, v, self.v, self.wv)

    def update_far(self, layer: int, k, plan):
        """The new keys at the far rotation (at their own positions, plan.far.new_rot) stored beside the others;
        every cached key's back. The rows are made at the first step with far scores, which must be the first."""
        if self.kf is None:
            if self.slot:
                raise CacheError("the far rotation (rerope) was set after this dense cache took tokens; build it after")
            self.kf = torch.zeros_like(self.k)
            self.wkf = None if self.wk is None else torch.zeros_like(self.wk)
        k = plan.pe.rotate_key(k, plan.far.new_pos, plan.far.new_rot)
        return self._store(layer, k, self.kf, self.wkf)

    def _store(self, layer: int, x, rows, rings):
        """Write the new tokens' x (keys or values) into a full layer's row, or a window layer's ring (which then
        returns its ring as it was plus the new ones); return all the layer attends over."""
        x = x.to(rows.dtype)
        if layer in self.ring:
            r, kept = self.ring[layer], slice(max(0, x.size(2) - self.window), None)
            out = torch.cat((rings[r], x), dim=2)
            rings[r, :, :, self._ring_slots] = x[:, :, kept]
            return out
        layer = self.row[layer]
        rows[layer, :, :, self._new] = x
        return rows[layer, :, :, : self.length]


class SinkCache(_Cache):
    """The first `sinks` tokens forever plus a ring of the `window` most recent ones (sinks=0: a plain window).

    Keys are stored before rotation and rotated at read time with positions inside the cache, as StreamingLLM
    does: sinks at 0..sinks-1, then the window oldest to newest. Until it is full it equals a dense cache.
    """

    raw_keys = True

    def __init__(self, model, batch_size: int, sinks: int, window: int, dtype=None, device=None, variant=None):
        if not model.pe.relative:
            raise CacheError(
                f"cache=sink needs a relative scheme ({', '.join(n for n, c in SCHEMES.items() if c.relative)}); "
                f"positional={model.pe.name} bakes absolute positions into the cached keys, so use cache=dense"
            )
        if window < 1 or sinks < 0:
            raise CacheError(f"cache.window must be >= 1 and cache.sinks >= 0, got window={window} sinks={sinks}")
        super().__init__(model, batch_size, sinks + window, dtype, device, variant=variant)
        self.sinks, self.window = sinks, window
        self.seen = 0  # tokens fed so far, prefix included
        self._ring = torch.arange(window, device=self.slot_pos.device)

    def room(self) -> int:
        return self.capacity - self.seen if self.seen < self.capacity else 1

    def advance(self, n: int, ids=None):
        if n > self.room():
            raise CacheError(f"sink cache can take {self.room()} tokens in this step, {n} were given")
        if self.seen + n <= self.capacity:  # still filling: exactly a dense cache
            self._new = slice(self.seen, self.seen + n)
            self.seen += n
            self.length = self.seen
            self._q_pos, self._k_pos = self.slot_pos[self._new], self.slot_pos[: self.length]
            self._keep_ids(ids, self._q_pos)
            return self._q_pos, self._k_pos
        slot = self.sinks + (self.seen - self.sinks) % self.window  # overwrite the oldest window token
        self._new = slice(slot, slot + 1)
        self.seen += 1
        self._keep_ids(ids, self.seen - 1 - self.offset)  # a text token's id: its place in the stream
        oldest = self.seen - self.window  # token index of the oldest token still in the window
        age_rank = (self._ring - (oldest - self.sinks)) % self.window
        ring_pos = self.sinks + age_rank
        self._k_pos = torch.cat((self.slot_pos[: self.sinks], ring_pos - self.offset))
        self._q_pos = self.slot_pos[self.capacity - 1 : self.capacity]
        return self._q_pos, self._k_pos

    def position_ids(self):
        """Past capacity, the ids re-indexed within the cache: the window's shifted on every axis by one amount,
        so that its smallest id sits right after the sinks (for text: the in-cache positions of advance())."""
        if self.ids is None or self.seen <= self.capacity:
            return super().position_ids()
        window = self.ids[:, self.sinks :]
        shift = window.min() - self.slot_pos[self.sinks]
        return self.ids[:, self._new] - shift, torch.cat((self.ids[:, : self.sinks], window - shift), dim=1)

    def update(self, layer: int, k, v, plan):
        self.k[layer, :, :, self._new] = k
        self.v[layer, :, :, self._new] = v
        keys = self.k[layer, :, :, : self.length]
        return plan.pe.rotate_key(keys, plan.k_pos, plan.k_rot), self.v[layer, :, :, : self.length]

    def update_far(self, layer: int, k, plan):
        """Every kept key (stored raw by update()) at the far rotation of its in-cache position."""
        return plan.pe.rotate_key(self.k[layer, :, :, : self.length], plan.far.k_pos, plan.far.k_rot)

    def token_indices(self) -> torch.Tensor:
        """Which tokens (0-based, prefix included) the cache holds, in slot order; for tests and inspection."""
        if self.seen <= self.capacity:
            return torch.arange(self.seen)
        oldest = self.seen - self.window
        ring = oldest + (self._ring.cpu() - (oldest - self.sinks)) % self.window
        return torch.cat((torch.arange(self.sinks), ring))


def cache_sizes(model, kind: str, train_length: int, sinks=None, window=None, max_len=None) -> dict:
    """The cache's sizes from the config's choices (cache=dense|sink, cache.sinks, cache.window, cache.max_len) and
    its capacity in tokens. Defaults match what the model saw in training: a sink cache holds as many tokens as a
    training sequence (the scheme's learned sink tokens, or 4 sinks, plus the rest as window); a dense cache goes
    as far as the scheme allows, or 16 x the training length."""
    prefix = model.pe.n_prefix
    if kind == "dense":
        capacity = (max_len or model.pe.max_positions or 16 * train_length) + prefix
        if model.pe.max_positions is not None:  # the scheme cannot go further anyway
            capacity = min(capacity, model.pe.max_positions + prefix)
        return {"capacity": capacity}
    if kind == "sink":
        sinks = (prefix or 4) if sinks is None else sinks
        window = train_length + prefix - sinks if window is None else window
        return {"sinks": sinks, "window": window, "capacity": sinks + window}
    raise CacheError(f"unknown cache '{kind}'; choose dense or sink")


def build_cache(model, kind: str, batch_size: int, sizes: dict, dtype=None, variant=None):
    """A cache of cache_sizes' sizes, for one evaluation variant (model/variant.py; None: the model as trained)."""
    if kind == "dense":
        return DenseCache(model, batch_size, sizes["capacity"], dtype, variant=variant)
    return SinkCache(model, batch_size, sizes["sinks"], sizes["window"], dtype, variant=variant)
