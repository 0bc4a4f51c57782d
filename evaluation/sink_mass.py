"""Does a model have an attention sink? The attention its queries put on the first token of a window.

python eval.py checkpoint=out/rope eval.mode=stream      (reported beside the streaming perplexity)
python train.py experiment=sinks                         (train.sink_metric: the trend over training)
StreamingLLM's window attention collapses when the evicted first token held a large share of every query's attention;
a model whose first token gets about 1/(keys visible) of it has no sink to lose. Measured in windows of the training
length (queries in each window's second half), each opened by the stream's first token as a 1 + (W - 1) sink cache
keeps it. With model.sink_logit=true the "nothing" slot is in every softmax denominator: the shares are true ones.
"""

import torch

from model.attention import attention_weights, content_grid, dense_bias

SINK_THRESHOLD = 0.3  # Gu et al. 2024, "When Attention Sink Emerges": above it, a head is a sink head


@torch.no_grad()
def layer_inputs(model, idx: torch.Tensor) -> list[tuple]:
    """Per layer, (its attention module, its input (B, T', D), its plan) in a full forward over idx; T' counts the
    learned sink tokens of positional=sink."""
    seen = []
    capture = lambda attn, args: seen.append((attn, args[0], attn.own_plan(args[1])))
    hooks = [block.attn.register_forward_pre_hook(capture) for block in model.blocks]
    try:
        model(idx)
    finally:
        for h in hooks:
            h.remove()
    return seen


@torch.no_grad()
def attention_probs(model, idx: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the fp32 attention probabilities (B, H, T', T') of a forward over idx, recomputed from its input."""
    probs = []
    for attn, x, plan in layer_inputs(model, idx):
        q, k, _ = attn.project(x)
        q, k = plan.queries(q), plan.keys(k)
        bias = dense_bias(plan.pe, plan.q_pos, plan.k_pos, True, attn.n_head, plan.window)
        state = None if attn.pe_layer is None else attn.pe_layer(x)
        if plan.pe.content_weights is not None:  # CoPE, stick-breaking, PaTH give the weights themselves
            probs.append(plan.pe.content_weights(q, k, bias, state, attn.pe_layer, plan))
            continue
        content = attn.content(q, state, plan)  # a bias that reads q or the input (Shaw, FoX): this layer's own
        if content is not None:
            bias = bias + content_grid(content, q.size(0), q.size(1), q.size(2), k.size(2), q.device)
        probs.append(attention_weights(q, k, bias, attn.sink))
    return probs


def sink_shares(per_head: list[list[float]], name: str = "sink") -> dict:
    """<name>_share(_all): the share of heads whose mean attention is above SINK_THRESHOLD, per layer (and over all)."""
    above = [sum(m > SINK_THRESHOLD for m in layer) for layer in per_head]
    return {
        f"{name}_share": [round(n / len(layer), 4) for n, layer in zip(above, per_head, strict=True)],
        f"{name}_share_all": round(sum(above) / sum(len(layer) for layer in per_head), 4),
    }


def first_token_attention(model, tokens: torch.Tensor, window: int, n_windows: int = 16, first=None) -> dict:
    """rows_first_token_attention over n_windows windows of `window` tokens cut evenly from tokens; first: a token id
    put first in every window (the stream's BOS)."""
    starts = torch.linspace(0, len(tokens) - window, n_windows).long().tolist()
    rows = torch.stack([tokens[s : s + window] for s in starts])
    if first is not None:
        rows[:, 0] = first
    result = rows_first_token_attention(model, rows)
    if first is not None and not model.pe.n_prefix:
        result["first_token"] = "the stream's first token"
    return result


def rounded(values) -> list[float]:
    return [round(float(v), 4) for v in values]


def rows_first_token_attention(model, idx: torch.Tensor) -> dict:
    """Attention on the first key from the second-half queries of the rows idx (B, window): per layer the mean over
    heads, the largest head, every head and the share of sink heads, against a uniform share. With model.sink_logit=true
    also each head's share to the nothing slot: the gpt-oss sink, which no cache can evict."""
    window, n_prefix = idx.size(1), model.pe.n_prefix
    half = window // 2 + n_prefix
    probs = [p[:, :, half:] for p in attention_probs(model, idx)]  # the second half's queries
    per_layer = [p[..., 0].mean(dim=(0, 2)) for p in probs]  # (H,) each
    visible = torch.arange(half, window + n_prefix, dtype=torch.float) + 1
    result = {
        "mean": rounded(h.mean() for h in per_layer),
        "max_head": rounded(h.max() for h in per_layer),
        "uniform": round(float((1 / visible).mean()), 4),
        "heads": [rounded(h) for h in per_layer],
        "threshold": SINK_THRESHOLD,
        "window": window,
        "first_token": "the learned sink token" if n_prefix else "the window's first token",
        **sink_shares([h.tolist() for h in per_layer]),
    }
    if model.cfg.sink_logit:
        nothing = [rounded((1 - p.sum(-1)).mean(dim=(0, 2))) for p in probs]
        result.update(nothing_heads=nothing, nothing_max_head=[max(h) for h in nothing])
        result.update(sink_shares(nothing, name="nothing"))
    return result


@torch.no_grad()
def nothing_cost(model, idx: torch.Tensor, targets: torch.Tensor) -> float:
    """For model.sink_logit=true: the mean loss (nats per token) with the nothing slot taken away (every sink logit
    -inf) less the loss with it: what evicting a sink that held exactly the model's no-op attention would cost."""
    base = model(idx, targets).item()
    saved = [block.attn.sink.detach().clone() for block in model.blocks]
    try:
        for block in model.blocks:
            block.attn.sink.fill_(float("-inf"))
        return model(idx, targets).item() - base
    finally:
        for block, keep in zip(model.blocks, saved, strict=True):
            block.attn.sink.copy_(keep)


def describe(sink: dict) -> str:
    """Lines for the streaming table: the share of sink heads per layer and the mean attention on the first token."""
    layers = " ".join(f"{s:.2f}" for s in sink["sink_share"])
    means = " ".join(f"{m:.3f}" for m in sink["mean"])
    text = (
        f"sink heads (mean attention on {sink['first_token']} > {sink['threshold']}, Gu et al. 2024; windows of "
        f"{sink['window']} tokens), share per layer: {layers}; all layers: {sink['sink_share_all']:.2f}\n"
        f"mean attention on it, per layer: {means} (largest head {max(sink['max_head']):.3f}; "
        f"a uniform share is {sink['uniform']:.4f})"
    )
    if "nothing_heads" in sink:
        largest = " ".join(f"{m:.3f}" for m in sink["nothing_max_head"])
        text += (
            f"\nthe nothing slot (model.sink_logit), largest head per layer: {largest}; heads above "
            f"{sink['threshold']} on it: {sink['nothing_share_all']:.2f}"
        )
    return text
