"""Does a model have an attention sink? The attention its queries put on the first token of a window.

python eval.py checkpoint=out/rope eval.mode=stream      (reported beside the streaming perplexity)
StreamingLLM's window attention collapses when the evicted first token held a large share of every query's
attention; a model whose first token gets about 1/(keys visible) of it has no sink to lose. With
model.sink_logit=true the learned "nothing" slot is in every softmax denominator, so a share here is the true
share of the query's attention, and the rows sum to one less what went to nothing.
The windows are spread evenly along the stream eval.mode=stream feeds, which holds every held-out work
(evaluation/stream.py), so the measure is not one play's.
"""

import torch

from model.attention import attention_weights, dense_bias


@torch.no_grad()
def attention_probs(model, idx: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the fp32 attention probabilities (B, H, T', T') of a full forward over idx (T' counts the
    learned sink tokens of positional=sink first), recomputed from each attention layer's input."""
    probs, hooks = [], []

    def capture(attn, args):
        x, plan = args[0], args[1]
        q, k, _ = attn.project(x)
        q, k = plan.pe.rotate(q, plan.q_pos, plan.q_rot), plan.pe.rotate(k, plan.k_pos, plan.k_rot)
        bias = dense_bias(plan.pe, plan.q_pos, plan.k_pos, True, attn.n_head)
        probs.append(attention_weights(q, k, bias, attn.sink))

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
