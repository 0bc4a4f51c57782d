"""CPU training throughput of nanopos's GPT against a plain GPT-2 block, per scheme, eager and compiled.

python bench/cpu_bench.py                                   the default run's shape (configs/), every scheme
python bench/cpu_bench.py model.d_model=256 train.batch_size=8 --schemes rope,alibi,learned --compile off
Trailing key=value words are Hydra overrides of configs/train.yaml. Both models take the same batch and the same
matmul FLOPs per token (the plain one has GQA too), and their steps alternate in one process: on a shared, noisy
machine only their ratio, measured side by side, means much. A step is forward, backward and AdamW, fp32.
"""

import argparse
import random
import statistics
import time

import torch
import torch._dynamo

import utils.schema
from bench.configs import SCHEMES, run_config
from bench.plain_gpt import PlainGPT
from bench.table import fmt, graph_count, publish, show
from utils.checkpoint import build_model
from utils.runtime import keep_freed_memory


def matmul_peak(n: int = 1024, reps: int = 20) -> float:
    """FLOP/s of a large fp32 matmul, the fastest of reps (a shared machine only ever slows a multiply down)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def flops_per_token(model_cfg: dict, seq: int, vocab: int) -> float:
    """6 x matmul parameters + 12 L H Dh T (attention scores and values), the same for both models."""
    d, L, H, Hkv = model_cfg["d_model"], model_cfg["n_layer"], model_cfg["n_head"], model_cfg["n_kv_head"]
    dh, f = d // H, model_cfg["mlp_ratio"] * d
    per_layer = d * (H + 2 * Hkv) * dh + d * d + 2 * d * f
    return 6 * (L * per_layer + d * vocab) + 12 * L * H * dh * seq


class Runner:
    """One model with its optimizer; step() times forward, backward and AdamW."""

    def __init__(self, model, lr: float, compiled: bool):
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), foreach=True)
        self.fn = torch.compile(model, fullgraph=True) if compiled else model
        self.times = []

    def step(self, x, y) -> float:
        t = time.perf_counter()
        self.fn(x, y).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t


def bench_scheme(scheme: str, overrides: list[str], compiled: bool, steps: int, peak: float) -> dict:
    run = run_config(scheme, overrides)
    tr, vocab = run["train"], run["tokenizer"]["vocab_size"]
    model_cfg = utils.schema.model_config(run, vocab)
    torch.manual_seed(0)
    if compiled:
        torch._dynamo.reset()  # every scheme starts from an empty cache: no version limit shared across rows
    lr = run["model"]["lr"]  # both train with AdamW at the size's AdamW lr: one optimizer, the same for both
    ours = Runner(build_model(model_cfg), lr, compiled)
    plain = Runner(PlainGPT(**model_cfg, seq_len=tr["seq_len"]), lr, compiled)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (tr["batch_size"], tr["seq_len"] + 1), generator=g)
    x, y = x[:, :-1], x[:, 1:]
    first = [r.step(x, y) for r in (ours, plain)]  # compiles, when compiled
    for _ in range(2):  # warm caches and allocator
        for r in (ours, plain):
            r.step(x, y)
    before = graph_count() if compiled else 0
    for _ in range(steps):
        for r in (ours, plain):
            r.times.append(r.step(x, y))
    tokens = tr["batch_size"] * tr["seq_len"]
    tok_s = [tokens / statistics.median(r.times) for r in (ours, plain)]
    fpt = flops_per_token(run["model"], tr["seq_len"], vocab)
    # step i of each model ran back to back, at the same moment of a noisy machine: compare them pair by pair
    ratios = [p / o for o, p in zip(ours.times, plain.times, strict=True)]
    return {
        "scheme": scheme,
        "mode": "compiled" if compiled else "eager",
        "nanopos tok/s": tok_s[0],
        "plain tok/s": tok_s[1],
        "ratio": statistics.median(ratios),
        "95% interval": ratio_interval(ratios),
        "nanopos %peak": 100 * fpt * tok_s[0] / peak,
        "plain %peak": 100 * fpt * tok_s[1] / peak,
        "first step s": f"{first[0]:.1f} / {first[1]:.1f}",
        "graphs while timing": graph_count() - before if compiled else "-",
    }


def ratio_interval(ratios: list[float], reps: int = 2000) -> str:
    """A 95% bootstrap interval of the median per-pair ratio (pairs resampled with replacement, fixed seed)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(reps))
    return f"{medians[int(0.025 * reps)]:.2f}-{medians[int(0.975 * reps) - 1]:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of configs/train.yaml (model=..., train.seq_len=...)")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--compile", choices=["off", "on", "both"], default="both")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per model (alternating)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    ap.add_argument("--no-record", dest="record", action="store_false")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()  # as train.py does on the CPU
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # never time a silent eager fallback
    peak = matmul_peak()
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    rows = []
    for compiled in modes:
        for scheme in args.schemes.split(","):
            rows.append(bench_scheme(scheme, args.overrides, compiled, args.steps, peak))
            show(rows[-1], fmt)
    run = run_config("rope", args.overrides)
    m, tr = run["model"], run["train"]
    details = (
        f"{torch.get_num_threads()} threads, fp32, L={m['n_layer']} d={m['d_model']} H={m['n_head']} "
        f"Hkv={m['n_kv_head']} T={tr['seq_len']} B={tr['batch_size']} V={run['tokenizer']['vocab_size']}, "
        f"median of {args.steps} alternating steps; ratio = median over step pairs of nanopos / plain GPT-2 "
        f"(bench/plain_gpt.py) tok/s, with its 95% bootstrap interval; "
        f"%peak against a measured {peak / 1e9:.0f} GFLOP/s fp32 matmul"
    )
    publish(rows, fmt, details, torch.device("cpu"), args.record)


if __name__ == "__main__":
    main()
