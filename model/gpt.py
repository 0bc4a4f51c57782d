"""A nanochat-style decoder whose positional scheme is one swappable module.

python train.py model=tiny positional=alibi
python train.py model.qk_norm=learned model.sink_logit=true      (the options that let a head form a sink)
python train.py model.attn_gate=true                              (a gate on each head's output, as Qwen3-Next)
python train.py model.window=64 model.window_pattern=SSSL         (sliding windows in 3 layers of 4, as nanochat)
python train.py positional=irope                                  (RoPE, and NoPE in every 4th layer, as Llama 4)
python eval.py checkpoint=out/rope eval.rope_scaling=rerope       (an evaluation variant: model/variant.py)
Functional RMSNorm, QK-norm, ReLU^2 MLP, untied embeddings, GQA, logit softcap, no biases, zero-initialised output
projections. The scheme (positional/) acts on the embeddings, queries and keys, or scores; this file never asks which
scheme it is. An evaluation variant is passed into forward or held by the KV cache: the model never changes.
"""

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

import positional
import settings
from positional import PositionAxesError
from settings import Rule, choices, setting

from .attention import BACKENDS, Chunk, attend, check_backend, content_attention, make_plan
from .fused import head_loss, relu_square, softcapped_logits
from .fused import rms_norm as norm

# rms: gain-free, logits within +-sqrt(head dim) | learned: a gain per head and dim, 1 at init | none
QKNorm = choices("QKNorm", "rms", "learned", "none")
Backend = choices("Backend", *BACKENDS)  # model/attention.py: auto picks per device


@dataclass
class ModelConfig:
    """The `model` config node. Defaults are model=tiny (~1.8M parameters, a few thousand tokens/s on 2 CPU cores)."""

    n_layer: int = setting(4, "pass a positive layer count, at most 1024", ge=1, le=1024)
    n_head: int = setting(4, "pass a positive head count, at most 4096", ge=1, le=4096)
    n_kv_head: int = setting(2, "pass a positive head count, at most 4096", ge=1, le=4096)
    d_model: int = setting(128, "pass a positive width, a multiple of model.n_head", ge=1, le=2**17)
    mlp_ratio: int = setting(4, "pass a positive ratio, at most 64", ge=1, le=64)
    softcap: float = setting(15.0, "pass a positive logit cap", gt=0)
    # plain-string defaults: a GPTConfig built in code stays picklable with weights_only=True, as checkpoints must
    attn_backend: Backend = "auto"
    qk_norm: QKNorm = "rms"
    sink_logit: bool = False  # true: a learned per-head logit for attending to nothing (gpt-oss), in every backend
    # true: each head's output times sigmoid(x w_h), x the block's normed input (Qiu et al. 2025's headwise gate)
    attn_gate: bool = False
    window: int | None = setting(  # W: sliding-window attention over the W most recent keys in the S layers
        None, "pass a positive window in tokens, or null for full attention", ge=1, le=2**24
    )
    window_pattern: str = setting(  # tiled over the layers: S window, L full (SSSL: three windowed, as nanochat)
        "S", "e.g. SSSL", match=r"[SL]+", must="hold only S (sliding window) and L (full)"
    )
    chunk: int | None = setting(  # C: the S layers attend within fixed chunks of C positions (Llama 4), not a window
        None, "pass a positive chunk in tokens, or null for none", ge=1, le=2**24
    )
    ssmax: bool = False  # true: Scalable-Softmax, logits x s_h ln n with s_h learned per head (model/log_scaling.py)

    RULES: ClassVar = (
        Rule(("d_model", "n_head"), lambda d, h: d % h == 0, "{1} does not divide {0}; pick a width it divides"),
        Rule(
            ("n_head", "n_kv_head"),
            lambda h, kv: h % kv == 0,
            "{1} does not divide {0}: each key/value head serves a group of query heads (GQA); pick a divisor",
        ),
        Rule(
            ("window", "chunk"),
            lambda window, chunk: window is None or chunk is None,
            "{0} and {1} both say how the S layers of model.window_pattern see; pass one of them and null the other",
        ),
    )


@dataclass
class GPTConfig(ModelConfig):
    """ModelConfig plus what a run fills in (schema.model_config): the vocabulary and the scheme's options (a dict)."""

    vocab_size: int = field(kw_only=True)
    positional: dict = field(default_factory=lambda: {"name": "rope"}, kw_only=True)

    def __post_init__(self):
        if message := settings.problem(self, "model."):
            raise ValueError(message)
        self.positional = positional.options(positional.spec_of(self.positional))  # checked once, here
        # a per-layer setting that reaches no layer of this network
        pattern, base = self.positional.get("layers"), self.positional.get("global_base")
        if pattern and len(pattern) > self.n_layer:
            raise ValueError(
                f"positional.layers={pattern} is longer than the network, model.n_layer={self.n_layer}: a letter past "
                f"the last layer reaches none; pass at most {self.n_layer} letters"
            )
        if base is not None and not any(map(self.layer_long, range(self.n_layer))):
            raise ValueError(
                f"positional.global_base={settings.show(base)} is the base of the full-attention layers of the scheme, "
                f"and model.window_pattern={self.window_pattern} with model.window={settings.show(self.window)} and "
                f"model.chunk={settings.show(self.chunk)} leaves none; put an L in the pattern and set a window or "
                f"chunk, or pass positional.global_base=null"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def layer_window(self, layer: int) -> "int | Chunk | None":
        """model.window, or a Chunk of model.chunk, where the tiled pattern says S; else None (full attention)."""
        short = self.window_pattern[layer % len(self.window_pattern)] == "S"
        return (self.window if self.chunk is None else Chunk(self.chunk)) if short else None

    def layer_nope(self, layer: int) -> bool:
        pattern = positional.layer_pattern(self.positional)
        return pattern[layer % len(pattern)] == "N"

    def layer_long(self, layer: int) -> bool:
        """Whether positional.global_base gives this full-attention layer a RoPE base of its own (Gemma 3)."""
        long = self.positional.get("global_base") is not None
        return long and not self.layer_nope(layer) and self.layer_window(layer) is None

    def windows(self, nope: bool = False) -> list:
        """The distinct sliding windows and chunks of the scheme's layers (nope: of the N layers)."""
        layers = [i for i in range(self.n_layer) if self.layer_nope(i) == nope]
        return sorted({w for w in map(self.layer_window, layers) if w is not None})


def with_prefix(pos, n_prefix: int):
    """pos (T,) or (axes, T) with n_prefix sink-token positions just before the first. A gather, not a cat: inductor
    cannot inline a cat's masked loads into flex (torch 2.11, CUDA: 'function' object has no attribute 'graph')."""
    i = torch.arange(pos.size(-1) + n_prefix, device=pos.device)
    return pos[..., (i - n_prefix).clamp(min=0)] - (n_prefix - i).clamp(min=0)


def check_length(pos, n_tokens: int):
    if pos.size(-1) != n_tokens:
        raise PositionAxesError(f"positions of shape {tuple(pos.shape)} for {n_tokens} tokens: give one per token")


def schemes(cfg: GPTConfig) -> tuple:
    """(the scheme, NoPE for positional.layers' N layers, the scheme at positional.global_base for the full-attention
    layers), None where no layer uses one, refusing what the scheme cannot do in this network. Built alone on the meta
    device, they check a model config before any data is read, without building the network (utils/checks.py)."""
    pe, pe_nope = positional.build_layers(cfg.positional, cfg.n_head, cfg.head_dim, cfg.d_model, checked=True)
    if pe.content_weights is not None:  # no softmax slot, no flex score_mod
        if cfg.sink_logit:
            raise ValueError(
                f"model.sink_logit=true adds a slot to a softmax, and positional={pe.name} weighs the keys itself; "
                f"pass model.sink_logit=false"
            )
        check_backend(pe, cfg.attn_backend)
    long = any(map(cfg.layer_long, range(cfg.n_layer)))
    pe_long = positional.build_long(cfg.positional, cfg.n_head, cfg.head_dim, cfg.d_model, True) if long else None
    return pe, pe_nope, pe_long


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int, pe=None):
        super().__init__()
        self.layer_idx, self.n_head, self.n_kv_head, self.head_dim = layer_idx, cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.c_q = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=False)
        self.c_k = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.c_v = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.c_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=False)
        self.qk_norm, self.gate = cfg.qk_norm, nn.Linear(cfg.d_model, cfg.n_head, bias=False) if cfg.attn_gate else None
        if cfg.qk_norm == "learned":  # per head and dim: each head its own logit cap; ones: step 0 is qk_norm=rms
            self.q_gain = nn.Parameter(torch.ones(cfg.n_head, cfg.head_dim))
            self.k_gain = nn.Parameter(torch.ones(cfg.n_kv_head, cfg.head_dim))
        # zeros: the nothing slot starts as one more key with score 0, a 1/(n+1) share of n visible keys
        self.sink = nn.Parameter(torch.zeros(cfg.n_head)) if cfg.sink_logit else None
        self.ssmax = None
        if cfg.ssmax:  # each head's s in s ln n (model/log_scaling.py), a layer's own as in Nakanishi 2025
            from .log_scaling import SSMAX_INIT

            self.ssmax = nn.Parameter(torch.full((cfg.n_head,), SSMAX_INIT))
        self.pe_layer = None if pe is None else pe.layer_module()
        self.window, self.nope, self.long = (f(layer_idx) for f in (cfg.layer_window, cfg.layer_nope, cfg.layer_long))

    def project(self, x):
        """Queries, keys (QK-normed, unrotated) and values in one matmul; the weights stay three parameters (Muon)."""
        B, T, _ = x.shape
        w = torch.cat((self.c_q.weight, self.c_k.weight, self.c_v.weight))
        qkv = F.linear(x, w).split((self.c_q.out_features, self.c_k.out_features, self.c_v.out_features), -1)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in qkv)  # (B, heads, T, Dh)
        if self.qk_norm == "none":
            return q, k, v
        q, k = norm(q), norm(k)
        if self.qk_norm == "learned":  # cast, so autocast keeps q and k in bf16
            q, k = q * self.q_gain.to(q.dtype)[:, None], k * self.k_gain.to(k.dtype)[:, None]
        return q, k, v

    def own_plan(self, plan):
        plan = plan.nope if self.nope else plan.long if self.long else plan
        return plan if self.window is None else plan.windows[self.window]

    def forward(self, x, plan, step=None):
        """x (B, T, D) -> (B, T, D); step: a KV cache's Step, which stores this step's keys and returns all of them."""
        B, T, _ = x.shape
        plan = self.own_plan(plan)
        q, k, v = self.project(x)
        state = None if self.pe_layer is None else self.pe_layer(x)
        if step is None:
            k = plan.keys(k)
        else:
            k, v, state = step.update(self.layer_idx, k, v, state, plan)
        q = plan.queries(q)
        if (scale := plan.query_scale(self.ssmax)) is not None:  # on the queries: cached keys stay as they are
            q = q * scale.to(q.dtype)
        if plan.pe.content_weights is not None:  # CoPE, stick-breaking, PaTH
            y = content_attention(q, k, v, plan, state, self.pe_layer)
        else:
            y = attend(q, k, v, plan, self.sink, self.content(q, state, plan))
        if self.gate is not None:  # after the softmax: a head can give out nothing without a sink to park on
            y = y * torch.sigmoid(self.gate(x)).transpose(1, 2).to(y.dtype)[..., None]
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))

    @staticmethod
    def content(q, state, plan):
        return None if plan.pe.content_bias is None else plan.pe.content_bias(q, state, plan)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.c_proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        return self.c_proj(relu_square(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int, pe=None):
        super().__init__()
        self.attn, self.mlp = Attention(cfg, layer_idx, pe), MLP(cfg)

    def forward(self, x, plan, step=None):
        x = x + self.attn(norm(x), plan, step)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.pe, self.pe_nope, self.pe_long = schemes(cfg)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i, self.layer_scheme(i)) for i in range(cfg.n_layer))
        # each scheme's windows (True: the N layers'), found once, as plan() runs per token
        self.scheme_windows = {False: cfg.windows(False)}
        if any(map(cfg.layer_nope, range(cfg.n_layer))):
            self.scheme_windows[True] = cfg.windows(True)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()

    def layer_scheme(self, layer: int):
        c = self.cfg
        return self.pe_nope if c.layer_nope(layer) else self.pe_long if c.layer_long(layer) else self.pe

    @torch.no_grad()
    def _init_weights(self):
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        for block in self.blocks:
            # and the gate, where there is one: x w_h then spreads as a query's entries do
            for lin in filter(None, (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc, block.attn.gate)):
                bound = 3**0.5 * lin.in_features**-0.5  # uniform with std 1/sqrt(fan_in)
                nn.init.uniform_(lin.weight, -bound, bound)
            nn.init.zeros_(block.attn.c_proj.weight)
            nn.init.zeros_(block.mlp.c_proj.weight)

    def forward(self, idx, targets=None, pos=None, reduction: str = "mean", keep_from: int = 0, variant=None):
        """idx (B, T) at pos (T,) or (axes, T) -> logits (B, T, V) or the loss; mask and windows read token order.
        keep_from: only positions keep_from.. reach the head (the head dominates a short sliding window's forward)."""
        if pos is None:
            pos = torch.arange(idx.size(1), device=idx.device)
        check_length(self.pe.check_axes(pos), idx.size(1))
        x = self.wte(idx)
        n_prefix = self.pe.n_prefix
        if n_prefix:
            x = torch.cat((self.pe.prefix().to(x.dtype).expand(x.size(0), -1, -1), x), dim=1)
            pos = with_prefix(pos, n_prefix)
        order = pos if pos.dim() == 1 else torch.arange(-n_prefix, pos.size(-1) - n_prefix, device=pos.device)
        x = self.pe.embed(x, pos)
        plan = self.plan(order, order, True, ids=(pos, pos), variant=variant)
        for block in self.blocks:
            x = block(x, plan)
        return self._head(x[:, n_prefix + keep_from :], targets, reduction)

    def decode(self, idx, cache, pos=None):
        """Feed idx (B, T) through a KV cache -> logits (B, T, V), in as few exact steps as cache.room() allows (a
        full sink cache re-indexes every token, so takes one a step). pos: a multi-axis scheme's (axes, T)."""
        if pos is not None:
            if pos.dim() != 2 or self.pe.axes == 1:
                raise PositionAxesError(
                    f"decode takes pos=(axes, T) only for a multi-axis scheme; positional={self.pe.name} with "
                    f"positions of shape {tuple(pos.shape)}: a cache gives one-axis positions itself, pass pos=None"
                )
            check_length(self.pe.check_axes(pos), idx.size(1))
        x = self.wte(idx)
        skip = 0
        if cache.length == 0 and self.pe.n_prefix:
            skip = self.pe.n_prefix
            x = torch.cat((self.pe.prefix().to(x.dtype).expand(x.size(0), -1, -1), x), dim=1)
            pos = None if pos is None else with_prefix(pos, skip)
        outs, start = [], 0
        while start < x.size(1):
            n = min(cache.room(), x.size(1) - start)
            step = cache.advance(n, None if pos is None else pos[:, start : start + n])
            h = self.pe.embed(x[:, start : start + n], step.q_ids)
            ids = (step.q_ids, step.k_ids)
            plan = self.plan(step.q_pos, step.k_pos, n > 1, step.window_k_pos, ids=ids, variant=cache.variant)
            for block in self.blocks:
                h = block(h, plan, step)
            outs.append(h)
            start += n
        return self._head(torch.cat(outs, dim=1)[:, skip:])

    def plan(self, q_pos, k_pos, causal: bool, window_k_pos=None, backend=None, ids=None, variant=None):
        """The plan every layer shares, with plan.windows (over window_k_pos: a cache's rings), plan.nope and
        plan.long. q_pos, k_pos (T,) order the tokens; ids (query ids, key ids) are what the scheme rotates at.
        variant: an evaluation variant (model/variant.py), which gives each scheme's rotation and plans."""
        c = self.cfg
        backend = backend or c.attn_backend
        log_n = None
        if c.ssmax:
            from .log_scaling import log_positions

            log_n = log_positions(q_pos)
        q_ids, k_ids = (q_pos, k_pos) if ids is None else ids

        def scheme_plan(pe, windows, nope: bool = False):
            rotation, make = (
                (pe.rotation, make_plan) if variant is None else variant.hooks(pe, q_pos, k_pos, nope, q_ids, k_ids)
            )
            rot = None
            if not nope:  # the N layers: NoPE's own state at q_pos and k_pos
                q_rot = rotation(q_ids)
                rot = (q_rot, q_rot if k_ids is q_ids else rotation(k_ids))
            plan = make(pe, q_pos, k_pos, causal, c.n_head, backend, c.sink_logit, rot=rot)
            plan.log_n = log_n  # before add_window, which hands it on
            ring_rot = None if window_k_pos is None else rotation(window_k_pos)
            for w in windows:
                plan.add_window(w, c.n_head, backend, c.sink_logit, window_k_pos, ring_rot)
            return plan

        plan = scheme_plan(self.pe, self.scheme_windows[False])
        if True in self.scheme_windows:
            plan.nope = scheme_plan(self.pe_nope, self.scheme_windows[True], nope=True)
        if self.pe_long is not None:
            plan.long = scheme_plan(self.pe_long, [])
        return plan

    def _head(self, x, targets=None, reduction="mean"):
        if targets is None:
            return softcapped_logits(norm(x), self.lm_head.weight, self.cfg.softcap)
        return head_loss(norm(x), self.lm_head.weight, targets, self.cfg.softcap, reduction)

    def flops_per_token(self, seq: int) -> float:
        """Training FLOPs per token: 6 x matmul parameters + 12 L H Dh T for attention (PoPE's 2Dh keys: 18)."""
        c = self.cfg
        width = self.pe.rotated_dim() + c.head_dim  # q.k, then probabilities x values
        return 6 * self.num_params(matmul_only=True) + 6 * c.n_layer * c.n_head * width * seq

    def num_params(self, matmul_only: bool = False) -> int:
        if matmul_only:
            return sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return sum(p.numel() for p in self.parameters())


def sample_next(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """logits (B, V) -> token ids (B,). temperature 0 is argmax; top_k keeps only the k most likely tokens."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
