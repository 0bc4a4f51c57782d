"""FlexAttention, the attention backend of CUDA runs: the scheme's score_bias as a score_mod, and a block mask.

python train.py model=d12          (on CUDA, model.attn_backend=auto picks flex for Tq >= 128: model/attention.py)
Positions are padded to a power of two from 128 (flex_length), so torch.compile keeps a few versions; a learned bias
in training is read from a dense table made by ordinary autograd (bias_table), not by flex's atomic backward adds.
"""

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

FLEX_BLOCK = 128  # flex_attention's block size: the shortest length flex is padded to
PAD_POSITION = 1 << 40  # padded keys sit at +PAD_POSITION, padded queries at -PAD_POSITION
# flex backward over a bias table, head size 128: 3 stages ask 236,544 bytes of shared memory, an H100 has 232,448
TABLE_KERNEL = {"bwd_num_stages": 2}


def flex_length(n: int) -> int:
    """The next power of two from 128: torch.compile keeps 8 versions per function, so lengths map onto a few."""
    return max(FLEX_BLOCK, 1 << (n - 1).bit_length())


def flex_call(q, k, v, plan, block_mask, score_mod, lse: bool = False):
    """flex_attention at the padded lengths -> out (and lse) of the real query rows; blocks of padding are skipped."""
    pad_q, pad_k = plan.mask.flex_pad
    n_q = q.size(2)

    def padded(x, pad):  # the separately compiled flex guards on strides too: padded or not, one layout
        x = F.pad(x, (0, 0, 0, pad)) if pad else x
        return x if torch.compiler.is_compiling() else x.contiguous()  # (inside a compiled model, no copies)

    q, k, v = padded(q, pad_q), padded(k, pad_k), padded(v, pad_k)
    kw = {"score_mod": score_mod, "block_mask": block_mask, "enable_gqa": q.size(1) != k.size(1)}
    kw["kernel_options"] = plan.mask.kernel_options
    flex = _fused(flex_attention, q.is_cuda)
    if not lse:
        return flex(q, k, v, **kw)[:, :, :n_q]
    out, aux = flex(q, k, v, **kw, return_aux=AuxRequest(lse=True))
    return out[:, :, :n_q], aux.lse[:, :, :n_q]


def without_nothing(out, lse, sink):
    """A flex output rescaled for the nothing slot: x S / (S + e^s) with S = e^lse, that is x sigmoid(lse - s)."""
    return out * torch.sigmoid(lse - sink.float()[:, None]).unsqueeze(-1).to(out.dtype)


def attend_flex(q, k, v, plan, sink=None, content=None):
    """flex_attention under the plan's mask; a content bias reads rows clamped to the real ones (padding is masked)."""
    n_q, n_k = q.size(2), k.size(2)
    score_mod = plan.mask.score_mod
    if content is not None:
        positional = plan.mask.score_mod

        def score_mod(score, b, h, q_idx, kv_idx):
            if positional is not None:
                score = positional(score, b, h, q_idx, kv_idx)
            return score + content(b, h, q_idx.clamp(max=n_q - 1), kv_idx.clamp(max=n_k - 1))

    if sink is None:
        return flex_call(q, k, v, plan, plan.mask.block_mask, score_mod)
    return without_nothing(*flex_call(q, k, v, plan, plan.mask.block_mask, score_mod, lse=True), sink)


def flex_positions(q_pos, k_pos):
    """Positions padded to flex_length (queries before every key, keys after every query), and the pads. Unpadded in
    a compiled model: padding there broke inductor's CUDA flex lowering (torch 2.11; sink over ALiBi, 257 keys)."""
    if torch.compiler.is_compiling():
        return q_pos, k_pos, (0, 0)
    pad_q, pad_k = flex_length(len(q_pos)) - len(q_pos), flex_length(len(k_pos)) - len(k_pos)
    q_pos = F.pad(q_pos, (0, pad_q), value=-PAD_POSITION)
    return q_pos, F.pad(k_pos, (0, pad_k), value=PAD_POSITION), (pad_q, pad_k)


def block_mask(mask_mod, q_pos, k_pos):
    make = _fused(create_block_mask, q_pos.is_cuda)  # eager, it would build the dense Tq x Tk mask first
    return make(mask_mod, None, None, len(q_pos), len(k_pos), device=q_pos.device)


def learned_bias(pe) -> bool:
    """Whether score_bias reads tensors that train now (T5's table, KERPLE's and FIRE's parameters)."""
    owner = getattr(pe, "inner", pe)  # a sink's bias is its inner scheme's
    return torch.is_grad_enabled() and pe.score_bias is not None and any(p.requires_grad for p in owner.parameters())


def bias_table(pe, q_pos, k_pos) -> torch.Tensor | None:
    """A learned bias in training as a dense (H, Tq, Tk) table: flex's backward adds score gradients atomically to
    what score_mod reads, and T5's 32 x H table piled a tile's adds on one address (0.038x RoPE's speed, H100)."""
    if not learned_bias(pe):
        return None
    h = torch.arange(pe.n_head, device=q_pos.device)[:, None, None]
    table = pe.score_bias(h, q_pos[None, :, None], k_pos[None, None, :]).float()
    return table.expand(pe.n_head, len(q_pos), len(k_pos)).contiguous()  # a bias alike for every head, per head


def bias_score_mod(pe, q_pos, k_pos, table=None):
    """flex's score_mod: the scheme's bias at padded positions, or its bias_table at clamped rows and columns."""
    if table is not None:
        n_q, n_k = table.shape[1:]

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + table[h, q_idx.clamp(max=n_q - 1), kv_idx.clamp(max=n_k - 1)]

        return score_mod

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + pe.score_bias(h, q_pos[q_idx], k_pos[kv_idx])

    return score_mod


def flex_mask(pe, q_pos, k_pos, causal, hidden=None) -> dict:
    """flex's score_mod, block mask and padding: the fields of model/attention.py's Mask. hidden(q_pos, k_pos): true
    where a window or chunk hides a key at or before its query."""
    table = bias_table(pe, q_pos, k_pos)
    q_pos, k_pos, pads = flex_positions(q_pos, k_pos)
    score_mod = None if pe.score_bias is None else bias_score_mod(pe, q_pos, k_pos, table)
    mask = {"score_mod": score_mod, "flex_pad": pads, "kernel_options": None if table is None else TABLE_KERNEL}
    if causal or pads[1]:
        mask["block_mask"] = block_mask(visible_mod(q_pos, k_pos, causal, hidden), q_pos, k_pos)
    return mask


def visible_mod(q_pos, k_pos, causal: bool, hidden=None):
    """The mask_mod over padded positions (flex_positions): keys at or before the query and not hidden by its window
    or chunk, or, not causal, every real key."""

    def mask_mod(b, h, q_idx, kv_idx):
        if not causal:
            return k_pos[kv_idx] < PAD_POSITION
        visible = k_pos[kv_idx] <= q_pos[q_idx]
        return visible if hidden is None else visible & ~hidden(q_pos[q_idx], k_pos[kv_idx])

    return mask_mod


_COMPILED = {}
COMPILE_ON_CPU = False  # tests set it: the compiled flex forward runs on the CPU too (it has no CPU backward)


def _fused(fn, cuda: bool):
    """fn compiled once, for use outside a compiled region. Static shapes at flex_length's lengths: one version per
    (batch, Tq, Tk) passed torch.compile's 8-version cap, and dynamic=True fails on the CPU (flex, GQA, torch 2.13)."""
    if not (cuda or COMPILE_ON_CPU) or torch.compiler.is_compiling():
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=False)
    return _COMPILED[fn]
