"""Does a model have an attention sink? The attention its queries put on the first token of a window.

python eval.py checkpoint=out/rope eval.mode=stream      (reported beside the streaming perplexity)
StreamingLLM's window attention collapses when the evicted first token held a large share of every query's
attention; a model whose first token gets about 1/(keys visible) of it has no sink to lose.
"""

import math

import torch
import torch.nn.functional as F

from model.attention import dense_bias
from model.gpt import norm


@torch.no_grad()
def attention_probs(model, idx: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the fp32 attention probabilities (B, H, T', T') of a full forward over idx (T' counts the
    learned sink tokens of positional=sink first), recomputed from each attention layer's input."""
    probs, hooks = [], []

    def capture(attn, args):
        x, plan = args[0].float(), args[1]
        B, T, _ = x.shape
        q = norm(F.linear(x, attn.c_q.weight.float()).view(B, T, attn.n_head, -1).transpose(1, 2))
        k = norm(F.linear(x, attn.c_k.weight.float()).view(B, T, attn.n_kv_head, -1).transpose(1, 2))
        q, k = plan.pe.rotate(q, plan.q_pos), plan.pe.rotate(k, plan.k_pos)
        k = k.repeat_interleave(attn.n_head // attn.n_kv_head, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        scores = scores + dense_bias(plan.pe, plan.q_pos, plan.k_pos, True, attn.n_head)
        probs.append(scores.softmax(dim=-1))

    for block in model.blocks:
        hooks.append(block.attn.register_forward_pre_hook(capture))
    try:
        model(idx)
    finally:
        for h in hooks:
            h.remove()
    return probs


def first_token_attention(model, tokens: torch.Tensor, window: int, n_windows: int = 16) -> dict:
    """Mean attention on the first key (per layer, averaged over heads, and its largest head) from the queries in
    the second half of n_windows windows of `window` tokens cut from tokens, against a uniform share."""
    starts = torch.linspace(0, len(tokens) - window, n_windows).long().tolist()
    idx = torch.stack([tokens[s : s + window] for s in starts])
    half = window // 2 + model.pe.n_prefix
    per_layer = [p[:, :, half:, 0].mean(dim=(0, 2)) for p in attention_probs(model, idx)]  # (H,) each
    visible = torch.arange(half, window + model.pe.n_prefix, dtype=torch.float) + 1
    return {
        "mean": [round(float(h.mean()), 4) for h in per_layer],
        "max_head": [round(float(h.max()), 4) for h in per_layer],
        "uniform": round(float((1 / visible).mean()), 4),
    }
