"""Does a model have an attention sink? The attention its queries put on the first token of a window.

python eval.py checkpoint=out/rope eval.mode=stream      (reported beside the streaming perplexity)
python train.py experiment=sinks                         (train.sink_metric: the trend over training)
StreamingLLM's window attention collapses when the evicted first token held a large share of every query's
attention; a model whose first token gets about 1/(keys visible) of it has no sink to lose. With
model.sink_logit=true the learned "nothing" slot is in every softmax denominator, so a share here is the true
share of the query's attention, and the rows sum to one less what went to nothing.
The windows are spread evenly along the stream eval.mode=stream feeds, which holds every held-out work
(evaluation/stream.py), so the measure is not one play's.
Sink heads (Gu et al. 2024, "When Attention Sink Emerges"): a head whose mean attention on the first token exceeds
SINK_THRESHOLD = 0.3 is counted as a sink head; the share of such heads is reported per layer and over all layers.
It is measured in windows of the training length (queries in each window's second half), where the model sees
what it saw in training. With positional=sink the "first token" is the learned sink token (key 0 of the forward,
before the window's first text token), the token StreamingLLM's 1 + (W - 1) cache keeps.
"""

import torch

from model.attention import attention_weights, content_grid, dense_bias

SINK_THRESHOLD = 0.3  # Gu et al. 2024: a head with more than this mean attention on the first token is a sink head


@torch.no_grad()
def layer_inputs(model, idx: torch.Tensor) -> list[tuple]:
    """Per layer, (its attention module, that module's input (B, T', D), the plan it reads) in a full forward over
    idx (T' counts the learned sink tokens of positional=sink first): what a diagnostic recomputes a layer from."""
    seen, hooks = [], []

    def capture(attn, args):
        seen.append((attn, args[0], attn.own_plan(args[1])))  # the layer's scheme (positional.layers) and window

    for block in model.blocks:
        hooks.append(block.attn.register_forward_pre_hook(capture))
    try:
        model(idx)
    finally:
        for h in hooks:
            h.remove()
    return seen


@torch.no_grad()
def attention_probs(model, idx: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the fp32 attention probabilities (B, H, T', T') of a full forward over idx (T' counts the
    learned sink tokens of positional=sink first), recomputed from each attention layer's input."""
    probs = []
    for attn, x, plan in layer_inputs(model, idx):
        q, k, _ = attn.project(x)
        q, k = plan.pe.rotate(q, plan.q_pos, plan.q_rot), plan.pe.rotate_key(k, plan.k_pos, plan.k_rot)
        bias = dense_bias(plan.pe, plan.q_pos, plan.k_pos, True, attn.n_head, plan.window)
        state = None if attn.pe_layer is None else attn.pe_layer(x)
        content = attn.content(q, state, plan)  # a bias that reads q or the input (Shaw, FoX): this layer's own
        if content is not None:
            bias = bias + content_grid(content, q.size(0), q.size(1), q.size(2), k.size(2), q.device)
        probs.append(attention_weights(q, k, bias, attn.sink))
    return probs


def sink_shares(per_head: list[list[float]], threshold: float = SINK_THRESHOLD) -> dict:
    """From each layer's per-head mean attention on the first token: the share of heads above threshold per layer,
    and over every head of every layer."""
    above = [sum(m > threshold for m in layer) for layer in per_head]
    total = sum(len(layer) for layer in per_head)
    return {
        "sink_share": [round(n / len(layer), 4) for n, layer in zip(above, per_head, strict=True)],
        "sink_share_all": round(sum(above) / total, 4),
    }


def first_token_attention(model, tokens: torch.Tensor, window: int, n_windows: int = 16) -> dict:
    """Mean attention on the first key (per layer, averaged over heads, its largest head, every head, and the share
    of heads above SINK_THRESHOLD) from the queries in the second half of n_windows windows of `window` tokens cut
    from tokens, against a uniform share. The first key is the learned sink token where the scheme has one."""
    starts = torch.linspace(0, len(tokens) - window, n_windows).long().tolist()
    return rows_first_token_attention(model, torch.stack([tokens[s : s + window] for s in starts]))


def rows_first_token_attention(model, idx: torch.Tensor) -> dict:
    """first_token_attention over the rows idx (B, window) as they are (train.sink_metric: held-out training rows)."""
    window = idx.size(1)
    half = window // 2 + model.pe.n_prefix
    per_layer = [p[:, :, half:, 0].mean(dim=(0, 2)) for p in attention_probs(model, idx)]  # (H,) each
    visible = torch.arange(half, window + model.pe.n_prefix, dtype=torch.float) + 1
    heads = [[round(float(m), 4) for m in h] for h in per_layer]
    return {
        "mean": [round(float(h.mean()), 4) for h in per_layer],
        "max_head": [round(float(h.max()), 4) for h in per_layer],
        "uniform": round(float((1 / visible).mean()), 4),
        "heads": heads,
        "threshold": SINK_THRESHOLD,
        "window": window,
        "first_token": "the learned sink token" if model.pe.n_prefix else "the window's first token",
        **sink_shares([h.tolist() for h in per_layer]),
    }


def describe(sink: dict) -> str:
    """Lines for the streaming table: the share of sink heads per layer, and the mean attention on the first token."""
    layers = " ".join(f"{s:.2f}" for s in sink["sink_share"])
    means = " ".join(f"{m:.3f}" for m in sink["mean"])
    return (
        f"sink heads (mean attention on {sink['first_token']} > {sink['threshold']}, Gu et al. 2024; windows of "
        f"{sink['window']} tokens), share per layer: {layers}; all layers: {sink['sink_share_all']:.2f}\n"
        f"mean attention on it, per layer: {means} (largest head {max(sink['max_head']):.3f}; "
        f"a uniform share is {sink['uniform']:.4f})"
    )
