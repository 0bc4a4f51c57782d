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
from functools import partial

import torch

from bench.configs import SIZES, model_config
from bench.table import print_profile, publish, sync
from model.gpt import GPT, GPTConfig
from model.kv_cache import DenseCache, SinkCache, hold_matrices
from model.static_decode import StaticDecoder
from utils import checkpoint
from utils.runtime import keep_freed_memory, peak_memory_mb

WARM_STATIC = 3  # untimed tokens before a compiled step's clock starts


@torch.no_grad()
def run_cached(model, cache, n_tokens, block, device, autocast, static=False):
    """Yield (tokens so far, tokens/s over the last block, cache MiB) every `block` tokens."""
    tok = torch.zeros(1, 1, dtype=torch.long, device=device)
    step = StaticDecoder(model, cache) if static else (lambda tok: model.decode(tok, cache)[:, -1])
    start = 1
    if static:  # before the clock: token 1 decodes eagerly, 2 compiles the step, 3 records the CUDA graph
        for _ in range(WARM_STATIC):
            with autocast:
                tok = step(tok).argmax(-1, keepdim=True)
        start = WARM_STATIC + 1
    t, since = time.perf_counter(), start
    for i in range(start, n_tokens + 1):
        with autocast:
            logits = step(tok)
        tok = logits.argmax(-1, keepdim=True)
        if i % block == 0:
            sync(device)
            yield i, (i - since + 1) / (time.perf_counter() - t), cache.nbytes() / 2**20
            t, since = time.perf_counter(), i + 1


@torch.no_grad()
def run_recompute(model, window, n_tokens, block, device, autocast):
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    t = time.perf_counter()
    for i in range(1, n_tokens + 1):
        with autocast:
            logits = model(ids[:, -window:])
        ids = torch.cat((ids[:, -window:], logits[:, -1].argmax(-1, keepdim=True)), dim=1)
        if i % block == 0:
            sync(device)
            yield i, block / (time.perf_counter() - t), 0.0
            t = time.perf_counter()


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


def load(args, device):
    if args.checkpoint:
        model, ckpt = checkpoint.load_model(args.checkpoint, device)
        return model, ckpt["seq_len"], f"checkpoint {args.checkpoint}"
    torch.manual_seed(0)
    cfg = GPTConfig(**model_config(args.positional, args.model, args.train_len, args.vocab))
    return GPT(cfg).to(device).eval(), args.train_len, f"random {args.model} {args.positional}"


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
    model, train_len, what = load(args, device)
    hold_matrices(model, dtype)  # as sample.py decodes: bf16 weights on CUDA, read once a token
    n = max(args.tokens)
    window = train_len - args.sinks
    n_dense = min(n, args.dense_limit)
    caches = {
        f"sink {args.sinks}+{window}": (lambda: SinkCache(model, 1, args.sinks, window, dtype), n),
        "dense": (lambda: DenseCache(model, 1, n_dense + 1, dtype), n_dense),
    }
    if args.profile:
        sink = caches[f"sink {args.sinks}+{window}"][0]()
        return profile(model, sink, args.profile, device, autocast, args.static_only)
    statics = [True] if args.static_only else [False, True] if args.static else [False]

    def cached(make, count, static):  # the cache is built only when its turn comes, so memory reads true
        return lambda: run_cached(model, make(), count, args.block, device, autocast, static)

    methods = {
        name + (" static" if static else ""): cached(make, count, static)
        for static in statics
        for name, (make, count) in caches.items()
    }
    if not args.static_only:
        methods[f"recompute {train_len}"] = partial(
            run_recompute, model, train_len, min(n, args.recompute_limit), args.block, device, autocast
        )
    rows = []
    for name, make in methods.items():
        first = None
        for done, speed, cache_mb in make():
            first = first or speed
            if done in args.tokens or done == args.block:
                rows.append(
                    {
                        "method": name,
                        "tokens": done,
                        "tok/s": speed,
                        "vs first block": speed / first,
                        "cache MiB": cache_mb,
                        "memory MiB": peak_memory_mb(device),
                    }
                )
                print(
                    "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()),
                    flush=True,
                )
    mem = "peak allocated GPU memory" if device.type == "cuda" else "process peak RSS"
    details = f"{what}, {dtype}; tok/s of the {args.block}-token block ending at each mark; memory = {mem}"
    publish(rows, fmt, details, device, args.record)


if __name__ == "__main__":
    main()
