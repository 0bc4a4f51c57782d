"""Streaming perplexity, StreamingLLM's test: one long stream of held-out text fed token by token.

python eval.py checkpoint=out/rope eval.mode=stream eval.stream_tokens=12800 cache.window=252
Methods, each scoring the same stream (one document of each held-out work, end to end, each from its BOS):
  dense      every token kept, as far as eval.dense_limit (memory) or the scheme's table allows
  window     the W most recent tokens (0 + W); W = cache.sinks + cache.window, by default the training length plus
             the scheme's learned sink tokens
  sinks      the first s tokens plus the W - s most recent (s + (W - s)), for s = 1, 4 and cache.sinks
  recompute  each token predicted by a fresh forward over the W tokens before it (the oracle)
Intervals: a block's resamples its runs of eval.block / 16 tokens; a method's mean resamples the blocks with the same
draws for every method, so the differences (`pairs`) are paired.
"""

import math
import time
from functools import partial
from itertools import combinations

import numpy as np
import torch
from torch.nn.functional import cross_entropy

from evaluation import bootstrap, report
from evaluation.attention_map import plot_attention_maps
from evaluation.heldout import held_out_works
from evaluation.pieces import equal_shares, evenly
from evaluation.plots import plot_stream
from evaluation.sink_mass import describe, first_token_attention
from model.kv_cache import CacheError, DenseCache, SinkCache
from utils import checkpoint
from utils.errors import UserError
from utils.progress import progress, say


def held_out_stream(ckpt: dict, n_tokens: int, allow_prepare: bool) -> tuple[np.ndarray, list[dict]]:
    """n_tokens + 1 held-out tokens, an equal share from the opening of each distinct work (more from the others where
    one is short), end to end; and (work, tokens) of each part."""
    works = held_out_works(ckpt, allow_prepare)
    shares = equal_shares(n_tokens + 1, [len(doc) for _, doc in works])
    if sum(shares) < n_tokens + 1:
        raise UserError(f"eval.stream_tokens={n_tokens} is more than the {sum(shares) - 1} held-out tokens; ask fewer")
    parts = [(name, doc[:k]) for (name, doc), k in zip(works, shares, strict=True) if k]
    return np.concatenate([p for _, p in parts]), [{"work": name, "tokens": len(p)} for name, p in parts]


@torch.no_grad()
def stream_nll(model, tokens: torch.Tensor, cache, rt, desc: str = "stream") -> tuple[np.ndarray, str | None]:
    """NLL of tokens[1:] predicted one token at a time through `cache`, and why it stopped early (None: it did not)."""
    nll, stopped = [], None
    try:
        for t in progress(range(len(tokens) - 1), desc, unit="tok"):
            with rt.autocast():
                logits = model.decode(tokens[None, t : t + 1], cache)[0, -1].float()
            nll.append(cross_entropy(logits, tokens[t + 1]).item())
    except CacheError as e:
        stopped = str(e)
    return np.array(nll), stopped


@torch.no_grad()
def recompute_nll(model, tokens: torch.Tensor, window: int, rt, batch: int = 64) -> np.ndarray:
    """Token t + 1 predicted from a fresh forward over tokens max(0, t - window + 1)..t."""
    n = len(tokens) - 1
    nll = np.zeros(n)
    for t in range(min(n, window - 1)):  # the start of the stream: one growing window each
        with rt.autocast():
            logits = model(tokens[None, : t + 1])[0, -1].float()
        nll[t] = cross_entropy(logits, tokens[t + 1]).item()
    full = [t for t in range(n) if t + 1 >= window]
    for i in progress(range(0, len(full), batch), "recompute", unit="batch"):
        ends = full[i : i + batch]
        rows = torch.stack([tokens[t + 1 - window : t + 1] for t in ends])
        with rt.autocast():
            logits = model(rows)[:, -1].float()
        nll[ends] = cross_entropy(logits, tokens[[t + 1 for t in ends]], reduction="none").cpu().numpy()
    return nll


def method_entry(nll: np.ndarray, size: int, seconds: float, note: str | None) -> dict:
    """Mean NLL per block of `size` tokens, each with a 95% perplexity interval that resamples its runs of size / 16."""
    means, intervals = [], []
    for i in range(0, len(nll), size):
        sums, counts = bootstrap.contiguous_blocks(nll[i : i + size], max(1, size // 16))
        means.append(float(nll[i : i + size].mean()))
        intervals.append(bootstrap.ppl_interval(bootstrap.resample(sums, counts, bootstrap.block_draws(len(sums)))))
    return {"nll": means, "ci": intervals, "tokens": len(nll), "seconds": round(seconds, 1), "note": note}


def summarize(results: dict, raw: dict, size: int) -> list[dict]:
    """Add each method's mean over the stream with its interval; return the paired difference of every two methods that
    scored the same tokens."""
    draws = {}
    for name, nll in raw.items():
        sums, counts = bootstrap.contiguous_blocks(nll, size)
        draws[name] = bootstrap.resample(sums, counts, bootstrap.block_draws(len(sums), ["stream", len(nll)]))
        results[name]["mean"] = {"ppl": float(np.exp(nll.mean())), "ci": bootstrap.ppl_interval(draws[name])}
    return [
        {"a": x, "b": y, **bootstrap.difference(draws[x], draws[y])}
        for x, y in combinations(draws, 2)
        if len(raw[x]) == len(raw[y])
    ]


def run_stream(path, cfg, rt, out_dir):
    model, ckpt = checkpoint.load_model(path, rt.device)
    pe, train_length, ev = model.pe, ckpt["seq_len"], cfg.eval
    sinks = (pe.n_prefix or 4) if cfg.cache.sinks is None else cfg.cache.sinks
    window = train_length + pe.n_prefix - sinks if cfg.cache.window is None else cfg.cache.window
    size = sinks + window
    stream, parts = held_out_stream(ckpt, ev.stream_tokens, ev.prepare)
    tokens = torch.from_numpy(stream.astype(np.int64)).to(rt.device)
    dense = min(ev.dense_limit, ev.stream_tokens) + pe.n_prefix
    # (name, first tokens kept; None: dense). Sinks rows keep 1 (a learned sink, or StreamingLLM's minimum), 4 (its
    # default) and cache.sinks, each below W
    methods = [("dense", None), (f"window 0+{size}", 0)]
    methods += [(f"sinks {s}+{size - s}", s) for s in sorted(s for s in {1, 4, sinks} if 0 < s < size)]
    results, raw, t_all = {}, {}, time.time()
    for name, s in methods:
        t = time.time()
        try:
            cache = DenseCache(model, 1, dense) if s is None else SinkCache(model, 1, s, size - s)
            nll, stopped = stream_nll(model, tokens, cache, rt, name)
        except CacheError as e:  # absolute schemes refuse sink caches
            results[name] = {"nll": [], "tokens": 0, "note": f"n/a: {e}"}
            say(f"  {name:>16}: n/a ({e})")
            continue
        note = f"stopped at {len(nll)} tokens: {stopped}" if stopped else None
        results[name], raw[name] = method_entry(nll, ev.block, time.time() - t, note), nll
        say(f"  {name:>16}: mean ppl {math.exp(nll.mean()):.2f} over {len(nll):,} tokens ({time.time() - t:.0f} s)")
    first = None if pe.n_prefix else tokens[0]  # the token a 1 + (W - 1) cache keeps: BOS, or the learned sink
    sink = first_token_attention(model, tokens, train_length, first=first)
    if pe.max_positions is None or size <= pe.max_positions:
        t, name = time.time(), f"recompute {size}"
        raw[name] = recompute_nll(model, tokens, size - pe.n_prefix, rt)  # the model adds its learned sinks itself
        results[name] = method_entry(raw[name], ev.block, time.time() - t, None)
        say(f"  {'recompute':>16}: mean ppl {math.exp(raw[name].mean()):.2f} ({time.time() - t:.0f} s)")
    pairs = summarize(results, raw, ev.block)
    result = {
        "checkpoint": str(checkpoint.checkpoint_path(path)),
        "scheme": report.scheme_label(ckpt),
        "train_length": train_length,
        "stream_tokens": ev.stream_tokens,
        "works": parts,
        "block": ev.block,
        "sinks": sinks,
        "window": window,
        "cache_size": size,
        "device": str(rt.device),
        "seconds": round(time.time() - t_all, 1),
        "methods": results,
        "pairs": pairs,
        "first_token_attention": sink,
    }
    print(stream_table(result))
    report.write_result(out_dir, "stream", result, partial(plot_stream, result))
    maps = out_dir / "sink_attention.png"
    plot_attention_maps(model, tokens, train_length, sink["heads"], maps, label=result["scheme"], first=first)
    print(f"written {maps}")
    return result


def _cell(ppl: float, ci: list[float] | None) -> str:
    return f"{ppl:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else f"{ppl:.1f}"


def _column(m: dict, picks: list[int]) -> list[str]:
    """One method's cells at the picked blocks ('-' past its end), then its mean over the stream."""
    ci = m.get("ci", [None] * len(m["nll"]))
    cells = [_cell(math.exp(m["nll"][b]), ci[b]) if b < len(m["nll"]) else "-" for b in picks]
    return cells + [_cell(m["mean"]["ppl"], m["mean"]["ci"]) if "mean" in m else "-"]


def stream_table(result: dict, rows: int = 10) -> str:
    """Perplexity [95% interval] at up to `rows` evenly spaced blocks, a column per method; the mean over the stream;
    which methods are within noise of each other."""
    methods = result["methods"]
    n_blocks = max(len(m["nll"]) for m in methods.values()) or 1
    picks = sorted(set(evenly(n_blocks, rows)))
    columns = [_column(m, picks) for m in methods.values()]
    # a row's label: the tokens seen by its block's end (a last, shorter block ends with the stream)
    labels = [f"{min((b + 1) * result['block'], result['stream_tokens']):,}" for b in picks] + ["mean"]
    width = max(len(s) for s in [*methods, *(c for column in columns for c in column)]) + 2
    lines = [
        f"{result['scheme']}: perplexity per block of {result['block']} tokens over a "
        f"{result['stream_tokens']:,}-token stream (trained at {result['train_length']}; "
        f"{', '.join(p['work'] for p in result.get('works', []))})",
        f"{'tokens seen':>12}" + "".join(f"{n:>{width}}" for n in methods),
    ]
    lines += [f"{label:>12}" + "".join(f"{c[i]:>{width}}" for c in columns) for i, label in enumerate(labels)]
    lines.append("[lo, hi]: 95% bootstrap interval (evaluation/bootstrap.py)")
    same = [f"{p['a']} ~ {p['b']}" for p in result.get("pairs", []) if p["within_noise"]]
    lines.append("within noise of each other over the stream (paired): " + ("; ".join(same) or "none"))
    lines += [f"{n}: {m['note']}" for n, m in methods.items() if m.get("note")]
    if "first_token_attention" in result:
        lines.append(describe(result["first_token_attention"]))
    return "\n".join(lines)
