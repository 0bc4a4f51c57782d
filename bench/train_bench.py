"""Training throughput per positional scheme: tokens/s, MFU, peak memory, compile time, recompiles.

python bench/train_bench.py                                        every scheme, model=d12, T=1024 and 4096 (GPU)
python bench/train_bench.py --seq 8192 --eval-len 32768            the long-context check
python bench/train_bench.py --model tiny --seq 256 --batch-tokens 8192 --steps 5 --device cpu   (a CPU run)
Prints a table and appends it, with the device and this command, to bench/RESULTS.md (--no-record skips).
MFU = (6 N_matmul + 12 L H Dh T) x tokens/s / peak, with the peak measured here by a large bf16 matmul (fp32 on
CPU) and stated beside the table. Random tokens: the speed of a step does not depend on the data.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.table import publish  # noqa: E402
from model.attention import make_plan  # noqa: E402
from model.gpt import GPT, GPTConfig  # noqa: E402
from utils.runtime import keep_freed_memory  # noqa: E402

SIZES = {  # as configs/model/*.yaml
    "tiny": dict(n_layer=4, n_head=4, n_kv_head=2, d_model=128),
    "small": dict(n_layer=6, n_head=6, n_kv_head=2, d_model=384),
    "d12": dict(n_layer=12, n_head=6, n_kv_head=6, d_model=768),
}
SCHEMES = ["rope", "nope", "learned", "sinusoidal", "alibi", "sink", "t5"]


def spec(name: str, seq: int) -> dict:
    return {
        "learned": {"name": "learned", "max_positions": seq},
        "sink": {"name": "sink", "inner": {"name": "rope"}},
    }.get(name, {"name": name})


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


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


def flops_per_token(model: GPT, seq: int) -> float:
    c = model.cfg
    return 6 * model.num_params(matmul_only=True) + 12 * c.n_layer * c.n_head * c.head_dim * seq


def graph_count() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["stats"].values()) if "stats" in counters else 0


def bench_one(name, args, device, dtype, peak):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=args.vocab, positional=spec(name, args.seq), **SIZES[args.model])
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    runner = torch.compile(model) if args.compile else model
    batch = max(1, args.batch_tokens // args.seq)
    x = torch.randint(0, args.vocab, (batch, args.seq), device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step():
        with autocast:
            loss = runner(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = time.perf_counter()
    step()
    sync(device)
    compile_s = time.perf_counter() - t
    for _ in range(args.warmup):
        step()
    sync(device)
    graphs = graph_count()
    t = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(device)
    dt = (time.perf_counter() - t) / args.steps
    tok_s = batch * args.seq / dt
    pos = torch.arange(args.seq + model.pe.n_prefix, device=device)
    row = {
        "scheme": name,
        "T": args.seq,
        "batch": batch,
        "tok/s": tok_s,
        "MFU": flops_per_token(model, args.seq) * tok_s / peak,
        "peak GiB": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan"),
        "compile s": compile_s,
        "recompiles": graph_count() - graphs,
        "backend": make_plan(model.pe, pos, pos, True, cfg.n_head).backend,
    }
    if args.eval_len:
        row["eval tok/s"] = eval_speed(model, args, device, autocast)
    return row


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


def fmt(v):
    if isinstance(v, float):
        return f"{v:.1%}" if v < 1 and v > 0 else f"{v:,.0f}" if v >= 100 else f"{v:.2f}"
    return str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="d12", choices=list(SIZES))
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--seq", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--batch-tokens", type=int, default=65536, help="tokens per step (batch = this // seq)")
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--eval-len", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compile", choices=["auto", "on", "off"], default="auto", help="auto: on for CUDA only")
    ap.add_argument("--no-record", dest="record", action="store_false")
    args = ap.parse_args()
    device = torch.device(args.device)
    args.compile = args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
    if device.type == "cpu":
        keep_freed_memory()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = peak_flops(device, dtype)
    rows = []
    for seq in args.seq:
        args.seq = seq
        for name in args.schemes.split(","):
            rows.append(bench_one(name, args, device, dtype, peak))
            print("  ".join(f"{k}={fmt(v)}" for k, v in rows[-1].items()), flush=True)
    args.seq = [r["T"] for r in rows]
    details = (
        f"model={args.model}, {dtype}, compile={args.compile}; MFU against a measured {peak / 1e12:.1f} TFLOP/s "
        f"matmul peak"
    )
    publish(rows, fmt, "Training throughput", details, device, args.record)


if __name__ == "__main__":
    main()
