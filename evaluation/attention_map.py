"""A picture of the attention sink: the attention map (queries x keys) of a few heads over one window.

python eval.py checkpoint=out/rope eval.mode=stream      (writes sink_attention.png beside stream.png)
The window is the training length from the middle of the held-out stream, with the stream's first token (its BOS) put
first, as a 1 + (W - 1) sink cache keeps it. Colour is log-scaled: a sink is a bright first column.
"""

import torch

from evaluation.plots import pyplot
from evaluation.sink_mass import attention_probs
from utils.files import save_figure


def pick_heads(per_head: list[list[float]], n: int = 4) -> list[tuple[int, int]]:
    """(layer, head) pairs: the largest first-token share in the first and last layer, then the largest overall, so a
    head with a sink and one without usually sit side by side."""
    scored = [(m, layer, h) for layer, heads in enumerate(per_head) for h, m in enumerate(heads)]
    first, last = (max(x for x in scored if x[1] == layer) for layer in (0, len(per_head) - 1))
    ranked = [(layer, h) for _, layer, h in [first, last, *sorted(scored, reverse=True)]]
    return sorted(list(dict.fromkeys(ranked))[:n])  # the first n distinct pairs


@torch.no_grad()
def plot_attention_maps(model, tokens, window, per_head, path, heads=None, dpi=110, label=None, first=None):
    """Write the attention maps of 4 heads (pick_heads), or of `heads`, over `window` tokens from the middle of tokens.
    per_head: each layer's mean attention on the first token; first: a token id put first in the window."""
    plt = pyplot()
    start = max(0, (len(tokens) - window) // 2)
    row = tokens[start : start + window].clone()
    if first is not None:
        row[0] = first
    probs = attention_probs(model, row[None])
    heads = pick_heads(per_head) if heads is None else [tuple(pair) for pair in heads]
    fig, axes = plt.subplots(1, len(heads), figsize=(3.2 * len(heads) + 1, 3.6), squeeze=False, layout="constrained")
    for ax, (layer, h) in zip(axes[0], heads, strict=True):
        p = probs[layer][0, h].cpu().clamp(min=1e-4)
        p = p.masked_fill(torch.ones_like(p, dtype=torch.bool).triu(1), float("nan"))  # keys after the query
        image = ax.imshow(p.numpy(), norm="log", vmin=1e-4, vmax=1, cmap="magma", interpolation="nearest")
        ax.set_title(f"layer {layer} head {h}: mean {per_head[layer][h]:.2f} on key 0", fontsize=9)
        ax.set_xlabel("key")
    axes[0, 0].set_ylabel("query")
    key0 = "the stream's first token" if first is not None else "the window's first token"
    key0 = "the learned sink token" if model.pe.n_prefix else key0
    title = f"{label or model.pe.name}: attention over one {window}-token window (key 0: {key0}; log colour)"
    fig.suptitle(title, fontsize=10)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="attention")
    save_figure(fig, path, dpi=dpi)
    return heads
