"""Decoding speed and memory far past the training length: sink cache vs dense cache vs re-computation.

python bench/decode_bench.py --checkpoint out/rope                       1K, 10K, 100K generated tokens
python bench/decode_bench.py --checkpoint out/rope --static              + the compiled fixed-shape step
python bench/decode_bench.py --checkpoint out/rope --static-only         the compiled step alone (no eager rows)
python bench/decode_bench.py --model tiny --positional rope --tokens 1000 10000 --device cpu   (random weights)
python bench/decode_bench.py --model d12 --vocab 50304 --train-len 1024 --profile 50    (where a step's time goes;
                                                                         --static-only: the compiled step's)
Generates greedily (batch 1) and reports, at each mark, the speed of the last block and the memory held: the sink
cache should stay flat, the dense cache grows, re-computation pays a full forward of the window per token.
"""

import argparse
import time

import torch

from bench.configs import SIZES, model_config
from bench.table import print_profile, publish, show, sync
from model.gpt import GPT, GPTConfig
from model.kv_cache import DenseCache, SinkCache, hold_matrices
from model.static_decode import StaticDecoder
from utils import checkpoint
from utils.runtime import keep_freed_memory, peak_memory_mb

WARM_STATIC = 3  # untimed tokens before a compiled step's clock starts


def run_cached(model, cache, n_tokens, block, device, autocast, static=False):
    """Yield (tokens so far, tokens/s over the last block, cache MiB) every `block` tokens."""
    step = StaticDecoder(model, cache) if static else (lambda tok: model.decode(tok, cache)[:, -1])
    # before the clock, static: token 1 decodes eagerly, 2 compiles the step, 3 records the CUDA graph
    yield from timed(step, n_tokens, block, device, autocast, WARM_STATIC if static else 0, cache.nbytes)


def recompute(model, window: int):
    """A decoding step without a cache: a full forward of the last `window` tokens."""
    ids = None

    def step(tok):
        nonlocal ids
        ids = tok if ids is None else torch.cat((ids, tok), dim=1)[:, -window:]
        return model(ids)[:, -1]

    return step


@torch.no_grad()
def timed(step, n_tokens, block, device, autocast, warm=0, nbytes=lambda: 0):
    """Decode greedily from token 0 with step (last token -> next logits), `warm` tokens before the clock starts;
    yield (tokens so far, tokens/s over the last block, nbytes() in MiB) every `block` tokens."""
    tok = torch.zeros(1, 1, dtype=torch.long, device=device)
    for _ in range(warm):
        with autocast:
            tok = step(tok).argmax(-1, keepdim=True)
    t, since = time.perf_counter(), warm + 1
    for i in range(warm + 1, n_tokens + 1):
        with autocast:
            logits = step(tok)
        tok = logits.argmax(-1, keepdim=True)
        if i % block == 0:
            sync(device)
            yield i, (i - since + 1) / (time.perf_counter() - t), nbytes() / 2**20
            t, since = time.perf_counter(), i + 1


def profile(model, cache, n_steps, device, autocast, static: bool):
    """Where a decoding step's time goes (the compiled step's with static): the ops of n_steps tokens, after as many
    unprofiled (the compiled step compiles and records its graph in those)."""
    n_tokens = 2 * n_steps + (WARM_STATIC if static else 0)  # the compiled step's warm tokens yield nothing
    steps = iter(run_cached(model, cache, n_tokens, 1, device, autocast, static))
    for _ in range(n_steps):
        next(steps)
    print_profile(lambda: [next(steps) for _ in range(n_steps)], device)


def fmt(v) -> str:
    return f"{v:,.2f}" if isinstance(v, float) else str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--model", default="tiny", choices=SIZES)
    ap.add_argument("--positional", default="rope")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--train-len", type=int, default=256, help="for random weights: the 'training' length")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--block", type=int, default=500, help="tokens per timed block")
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--dense-limit", type=int, default=100000)
    ap.add_argument("--recompute-limit", type=int, default=10000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--static", action="store_true", help="also time the compiled fixed-shape step (CUDA graphs on CUDA)"
    )
    ap.add_argument("--static-only", action="store_true", help="time only the compiled fixed-shape step")
    ap.add_argument(
        "--profile", type=int, default=0, help="profile this many sink-cache steps (--static-only: compiled), exit"
    )
    ap.add_argument("--no-record", dest="record", action="store_false")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        keep_freed_memory()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    if args.checkpoint:
        model, ckpt = checkpoint.load_model(args.checkpoint, device)
        train_len, what = ckpt["seq_len"], f"checkpoint {args.checkpoint}"
    else:
        torch.manual_seed(0)
        cfg = GPTConfig(**model_config(args.positional, args.model, args.train_len, args.vocab))
        model, train_len, what = GPT(cfg).to(device).eval(), args.train_len, f"random {args.model} {args.positional}"
    hold_matrices(model, dtype)  # as sample.py decodes: bf16 weights on CUDA, read once a token
    n = max(args.tokens)
    window = train_len - args.sinks
    n_dense = min(n, args.dense_limit)
    sink = f"sink {args.sinks}+{window}"
    caches = {
        sink: (lambda: SinkCache(model, 1, args.sinks, window, dtype), n),
        "dense": (lambda: DenseCache(model, 1, n_dense + 1, dtype), n_dense),
    }
    if args.profile:
        return profile(model, caches[sink][0](), args.profile, device, autocast, args.static_only)
    statics = [True] if args.static_only else [False, True] if args.static else [False]

    def cached(make, count, static):  # the cache is built only when its turn comes, so memory reads true
        return lambda: run_cached(model, make(), count, args.block, device, autocast, static)

    methods = {
        name + (" static" if static else ""): cached(make, count, static)
        for static in statics
        for name, (make, count) in caches.items()
    }
    if not args.static_only:
        count = min(n, args.recompute_limit)
        methods[f"recompute {train_len}"] = lambda: timed(
            recompute(model, train_len), count, args.block, device, autocast
        )
    rows = []
    for name, make in methods.items():
        first = None
        for done, speed, cache_mb in make():
            first = first or speed
            if done in args.tokens or done == args.block:
                row = {"method": name, "tokens": done, "tok/s": speed, "vs first block": speed / first}
                rows.append({**row, "cache MiB": cache_mb, "memory MiB": peak_memory_mb(device)})
                show(rows[-1], lambda v: f"{v:.3g}" if isinstance(v, float) else str(v))
    mem = "peak allocated GPU memory" if device.type == "cuda" else "process peak RSS"
    details = f"{what}, {dtype}; tok/s of the {args.block}-token block ending at each mark; memory = {mem}"
    publish(rows, fmt, details, device, args.record)


if __name__ == "__main__":
    main()
