"""Training throughput per positional scheme: tokens/s, MFU, peak memory, compile time, recompiles.

python bench/train_bench.py                                        every scheme, model=d12, T=1024 and 4096 (GPU)
python bench/train_bench.py --seq 8192 --eval-len 32768            the long-context check
python bench/train_bench.py --model tiny --seq 256 --batch-tokens 8192 --steps 5 --device cpu   (a CPU run)
python bench/train_bench.py --schemes rope,rope --set "" "model.window=64 model.window_pattern=SSSL"   (options)
python bench/train_bench.py --seq 1024 --schemes rope,t5 --steps 3 --profile 3 --no-record   (where a step's time goes)
MFU = (6 N_matmul + 12 L H Dh T) x tokens/s / peak, against the datasheet dense bf16 peak (H100/H200 SXM:
989 TFLOP/s, as nanochat and PaLM count it) and against a matmul peak measured here. Every row compiles from an
empty cache with fullgraph=True and fails on the recompile limit, so no row times an eager fallback.
"""

import argparse
import time
import traceback

import torch

from bench.configs import SCHEMES, SIZES, model_config
from bench.table import fmt, graph_count, print_profile, publish, show, sync
from model.attention import make_plan
from model.gpt import GPT, GPTConfig
from utils.runtime import datasheet_peak, keep_freed_memory


def peak_flops(device, dtype) -> float:
    """Measured dense matmul FLOP/s: the denominator of MFU."""
    n = 8192 if device.type == "cuda" else 1024
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t, reps = time.perf_counter(), 20 if device.type == "cuda" else 5
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t)


def bench_one(name, args, device, dtype, peak, extra=()):
    torch.manual_seed(0)
    if args.compile:
        torch._dynamo.reset()  # each row compiles from scratch: the version cap is never shared across rows
    cfg = GPTConfig(**model_config(name, args.model, args.seq, args.vocab, extra))
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    runner = torch.compile(model, fullgraph=True) if args.compile else model
    batch = max(1, args.batch_tokens // args.seq)
    x = torch.randint(0, args.vocab, (batch, args.seq), device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def steps(n: int) -> float:
        """Seconds for n training steps, the device's queue drained."""
        t = time.perf_counter()
        for _ in range(n):
            with autocast:
                loss = runner(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync(device)
        return time.perf_counter() - t

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    compile_s = steps(1)
    steps(args.warmup)
    graphs = graph_count()
    dt = steps(args.steps) / args.steps
    tok_s = batch * args.seq / dt
    pos = torch.arange(args.seq + model.pe.n_prefix, device=device)
    flops = model.flops_per_token(args.seq) * tok_s
    sheet = datasheet_peak(device)
    row = {
        "scheme": " ".join([name, *extra]),
        "T": args.seq,
        "batch": batch,
        "tok/s": tok_s,
        "MFU": f"{flops / sheet:.1%}" if sheet else "n/a",
        "MFU measured peak": f"{flops / peak:.1%}",
        "peak GiB": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan"),
        "first step s": compile_s,
        "graphs while timing": graph_count() - graphs if args.compile else "-",
        "backend": make_plan(model.pe, pos, pos, True, cfg.n_head).backend,
    }
    if args.eval_len:
        row["eval tok/s"] = eval_speed(model, args, device, autocast)
    if args.profile:  # after the clock: where this row's steps spend their time
        print(f"profile of {args.profile} steps: {row['scheme']}, T={args.seq}")
        print_profile(lambda: steps(args.profile), device)
    return row


def bench_row(name, args, device, dtype, peak, extra) -> dict:
    """bench_one's row, or its error as one short cell: one failure must not hide the other schemes' figures."""
    try:
        return bench_one(name, args, device, dtype, peak, extra)
    except Exception as e:
        traceback.print_exc()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        first = (str(e).strip().splitlines() or [""])[0]
        error = f"{type(e).__name__}: {first[:100]}".replace("|", "/")
        return {"scheme": " ".join([name, *extra]), "T": args.seq, "error": error}


@torch.no_grad()
def eval_speed(model, args, device, autocast) -> float:
    """One forward at eval_len tokens (batch 1): does a long evaluation fit, and how fast."""
    if model.pe.max_positions is not None and args.eval_len > model.pe.max_positions:
        return float("nan")
    x = torch.randint(0, args.vocab, (1, args.eval_len), device=device)
    with autocast:
        model(x)
        sync(device)
        t = time.perf_counter()
        model(x)
        sync(device)
    return args.eval_len / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="d12", choices=SIZES)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--seq", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--batch-tokens", type=int, default=65536, help="tokens per step (batch = this // seq)")
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--eval-len", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compile", choices=["auto", "on", "off"], default="auto", help="auto: on for CUDA only")
    ap.add_argument("--set", nargs="+", default=None, help="train.py overrides per scheme, in --schemes order")
    ap.add_argument("--profile", type=int, default=0, help="after timing each row, profile this many steps")
    ap.add_argument("--no-record", dest="record", action="store_false")
    args = ap.parse_args()
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # a silent eager fallback would be timed otherwise
    device = torch.device(args.device)
    args.compile = args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
    if device.type == "cpu":
        keep_freed_memory()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = peak_flops(device, dtype)
    rows, stopped = [], ""
    try:
        for seq in args.seq:
            args.seq = seq
            names = args.schemes.split(",")
            for name, extra in zip(names, args.set or [""] * len(names), strict=True):
                rows.append(bench_row(name, args, device, dtype, peak, extra.split()))
                show(rows[-1], fmt)
    except KeyboardInterrupt:  # Ctrl-C (or timeout -s INT) keeps the rows measured so far, and says so
        stopped = f"; stopped by an interrupt after {len(rows)} rows"
    details = (
        f"model={args.model}, {dtype}, compile={args.compile}; MFU against the datasheet dense bf16 peak "
        f"({(datasheet_peak(device) or 0) / 1e12:.0f} TFLOP/s; n/a if unknown) and a measured "
        f"{peak / 1e12:.1f} TFLOP/s matmul peak{stopped}"
    )
    publish(rows, fmt, details, device, args.record, figure="tok/s")


if __name__ == "__main__":
    main()
