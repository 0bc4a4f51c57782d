"""Streaming perplexity, StreamingLLM's test: one long stream of held-out text fed token by token.

python eval.py checkpoint=out/rope eval.mode=stream eval.stream_tokens=12800 cache.window=252
Methods, each scoring the same stream:
  dense      every token kept, as far as eval.dense_limit (memory) or the scheme's table allows
  window     a plain window of the W = sinks + window most recent tokens (0 + W)
  sinks      the first `sinks` tokens plus the window most recent (sinks + window, the same memory)
  recompute  each token predicted by a fresh forward over the W tokens before it, at positions 0..W-1 (the oracle;
             with positional=sink its learned sink leads every window, as in training)
Also reports how much attention the model puts on the first token of a window (evaluation/sink_mass.py).
Reports NLL and perplexity per block of eval.block tokens as stream.json, a table and stream.png.
"""

import json
import math
import time

import numpy as np
import torch

from evaluation.heldout import held_out_documents
from evaluation.sink_mass import first_token_attention
from model.kv_cache import CacheError, DenseCache, SinkCache
from utils import checkpoint
from utils.errors import UserError
from utils.progress import progress


def held_out_stream(ckpt: dict, n_tokens: int, allow_prepare: bool) -> np.ndarray:
    """The held-out documents end to end (each after its BOS), n_tokens + 1 of them."""
    docs = held_out_documents(ckpt, allow_prepare)
    stream = np.concatenate(docs)
    if len(stream) < n_tokens + 1:
        raise UserError(f"eval.stream_tokens={n_tokens} is more than the {len(stream) - 1} held-out tokens; ask fewer")
    return stream[: n_tokens + 1]


@torch.no_grad()
def stream_nll(model, tokens: torch.Tensor, cache, rt, desc: str = "stream") -> tuple[np.ndarray, str | None]:
    """NLL of tokens[1:] predicted one token at a time through `cache`; stops early if the cache refuses."""
    nll = []
    try:
        for t in progress(range(len(tokens) - 1), desc, unit="tok"):
            with rt.autocast():
                logits = model.decode(tokens[None, t : t + 1], cache)[0, -1].float()
            nll.append(torch.nn.functional.cross_entropy(logits, tokens[t + 1]).item())
    except CacheError as e:
        return np.array(nll), str(e)
    return np.array(nll), None


@torch.no_grad()
def recompute_nll(model, tokens: torch.Tensor, window: int, rt, batch: int = 64) -> np.ndarray:
    """Token t + 1 predicted from a fresh forward over tokens max(0, t - window + 1)..t."""
    n = len(tokens) - 1
    nll = np.zeros(n)
    full = [t for t in range(n) if t + 1 >= window]
    for t in range(min(n, window - 1)):  # the start of the stream: one growing window each
        with rt.autocast():
            logits = model(tokens[None, : t + 1])[0, -1].float()
        nll[t] = torch.nn.functional.cross_entropy(logits, tokens[t + 1]).item()
    for i in progress(range(0, len(full), batch), "recompute", unit="batch"):
        ends = full[i : i + batch]
        rows = torch.stack([tokens[t + 1 - window : t + 1] for t in ends])
        with rt.autocast():
            logits = model(rows)[:, -1].float()
        targets = torch.stack([tokens[t + 1] for t in ends])
        nll[ends] = torch.nn.functional.cross_entropy(logits, targets, reduction="none").cpu().numpy()
    return nll


def blocks(nll: np.ndarray, size: int) -> list[float]:
    return [float(nll[i : i + size].mean()) for i in range(0, len(nll), size)]


def run_stream(path, cfg, rt, out_dir):
    model, ckpt = checkpoint.load_model(path, rt.device)
    pe, train_length, ev = model.pe, ckpt["seq_len"], cfg.eval
    sinks = (pe.n_prefix or 4) if cfg.cache.sinks is None else cfg.cache.sinks
    window = train_length + pe.n_prefix - sinks if cfg.cache.window is None else cfg.cache.window
    size = sinks + window
    tokens = torch.from_numpy(held_out_stream(ckpt, ev.stream_tokens, ev.prepare).astype(np.int64)).to(rt.device)
    methods = {
        "dense": lambda: DenseCache(model, 1, min(ev.dense_limit, ev.stream_tokens) + pe.n_prefix),
        f"window 0+{size}": lambda: SinkCache(model, 1, 0, size),
        f"sinks {sinks}+{window}": lambda: SinkCache(model, 1, sinks, window),
    }
    results, t_all = {}, time.time()
    for name, make in methods.items():
        t = time.time()
        try:
            nll, stopped = stream_nll(model, tokens, make(), rt, name)
        except CacheError as e:  # absolute schemes refuse sink caches
            results[name] = {"nll": [], "tokens": 0, "note": f"n/a: {e}"}
            print(f"  {name:>16}: n/a ({e})", flush=True)
            continue
        results[name] = {
            "nll": blocks(nll, ev.block),
            "tokens": len(nll),
            "seconds": round(time.time() - t, 1),
            "note": f"stopped at {len(nll)} tokens: {stopped}" if stopped else None,
        }
        print(
            f"  {name:>16}: mean ppl {math.exp(nll.mean()):.2f} over {len(nll):,} tokens ({time.time() - t:.0f} s)",
            flush=True,
        )
    sink = first_token_attention(model, tokens, train_length)
    print(
        "  attention on the first token, per layer: "
        + " ".join(f"{m:.3f}" for m in sink["mean"])
        + f" (largest head {max(sink['max_head']):.3f}; a uniform share is {sink['uniform']:.4f})",
        flush=True,
    )
    if pe.max_positions is None or size <= pe.max_positions:
        t = time.time()
        nll = recompute_nll(model, tokens, size - pe.n_prefix, rt)  # the model adds its learned sinks itself
        results[f"recompute {size}"] = {
            "nll": blocks(nll, ev.block),
            "tokens": len(nll),
            "seconds": round(time.time() - t, 1),
            "note": None,
        }
        print(f"  {'recompute':>16}: mean ppl {math.exp(nll.mean()):.2f} ({time.time() - t:.0f} s)", flush=True)
    result = {
        "checkpoint": str(checkpoint.checkpoint_path(path)),
        "scheme": pe.name,
        "train_length": train_length,
        "stream_tokens": ev.stream_tokens,
        "block": ev.block,
        "sinks": sinks,
        "window": window,
        "device": str(rt.device),
        "seconds": round(time.time() - t_all, 1),
        "methods": results,
        "first_token_attention": sink,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "stream.json").write_text(json.dumps(result, indent=1))
    print(stream_table(result))
    plot_stream(result, out_dir / "stream.png")
    print(f"written {out_dir}/stream.json and stream.png ({result['seconds']} s)")
    return result


def stream_table(result: dict, rows: int = 10) -> str:
    """Perplexity per block at up to `rows` evenly spaced blocks, a column per method."""
    names = list(result["methods"])
    n_blocks = max(len(m["nll"]) for m in result["methods"].values())
    picks = sorted({round(i * (n_blocks - 1) / (rows - 1)) for i in range(rows)}) if n_blocks > 1 else [0]
    width = max(len(n) for n in names) + 2
    lines = [
        f"{result['scheme']}: perplexity per block of {result['block']} tokens over a "
        f"{result['stream_tokens']:,}-token stream (trained at {result['train_length']})",
        f"{'tokens seen':>12}" + "".join(f"{n:>{width}}" for n in names),
    ]
    for b in picks:
        cells = []
        for n in names:
            nll = result["methods"][n]["nll"]
            cells.append(f"{math.exp(nll[b]):.1f}" if b < len(nll) else "-")
        lines.append(f"{(b + 1) * result['block']:>12,}" + "".join(f"{c:>{width}}" for c in cells))
    lines += [f"{n}: {m['note']}" for n, m in result["methods"].items() if m.get("note")]
    return "\n".join(lines)


def plot_stream(result: dict, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, m in result["methods"].items():
        if m["nll"]:
            xs = [(i + 1) * result["block"] for i in range(len(m["nll"]))]
            ax.plot(xs, m["nll"], label=name)
    ax.axvline(result["train_length"], color="gray", ls=":", label=f"training length {result['train_length']}")
    ax.set(
        xscale="log",
        xlabel="tokens seen",
        ylabel=f"mean NLL per {result['block']}-token block (nats)",
        title=f"{result['scheme']}: streaming past the training length",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
