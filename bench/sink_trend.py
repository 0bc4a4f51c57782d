"""The attention sink's trend over training, and the scale at which it would reach a collapse.

python train.py experiment=sinks out_dir=out/sinks          (train.sink_metric logs the sink at every eval)
python bench/sink_trend.py out/sinks [more runs] [--plot sink_trend.png]
Reads each run's metrics.jsonl. Per eval: training tokens, val loss, the largest head's mean attention on the first
token (the learned sink token with positional=sink) per layer against a uniform share, the share of sink heads
(> 0.3, Gu et al. 2024), and with model.sink_logit=true the nothing slot's largest share per layer and what taking
it away costs (evaluation/sink_mass.nothing_cost: the loss a model pays when a sink that held its no-op attention
is evicted). Then a power-law fit, y = a * tokens^b over the second half of the evals, says at how many tokens the
trend reaches a collapse: a sink head (first-token share 0.3) and a doubled perplexity without the nothing slot
(cost ln 2, the bar of issue #13). The fit is an extrapolation through a decaying learning rate, so it is a scale
to aim at, not a forecast. Appends the table to bench/RESULTS.md (--no-record skips).
"""

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.table import publish  # noqa: E402
from evaluation.sink_mass import SINK_THRESHOLD  # noqa: E402

COLLAPSE_COST = math.log(2)  # nats per token: twice the perplexity, issue #13's bar for evicting a learned sink


def evals(run: Path) -> list[dict]:
    """The eval rows of a run's metrics.jsonl that carry the sink metric (train.sink_metric=true)."""
    path = run / "metrics.jsonl"
    if not path.exists():
        raise SystemExit(f"{path} is missing: train with train.sink_metric=true into {run} first")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "first_token_max" in r]
    if not rows:
        raise SystemExit(f"{path} has no sink metric: train with train.sink_metric=true (experiment=sinks sets it)")
    return rows


def power_fit(x: list[float], y: list[float]) -> tuple[float, float] | None:
    """(a, b) of y = a * x^b by least squares in log-log over the points with y > 0; None with fewer than 2."""
    pts = [(math.log(u), math.log(v)) for u, v in zip(x, y, strict=True) if v > 0]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return None
    b = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
    return math.exp(my - b * mx), b


def crossing(x: list[float], y: list[float], target: float) -> str:
    """Where the power-law fit over the second half of (x, y) reaches target: tokens, or why it does not."""
    half = len(x) // 2
    fit = power_fit(x[half:], y[half:])
    if fit is None:
        return "too few evals"
    a, b = fit
    if max(y) >= target:
        return f"reached ({max(y):.3f})"
    if b <= 0:
        return f"none: falling (x tokens^{b:.2f})"
    return f"{(target / a) ** (1 / b):.1e} tokens (x tokens^{b:.2f})"


def layers(values: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values)


def trend_rows(run: Path) -> tuple[list[dict], dict]:
    rows, out = evals(run), []
    for r in rows:
        row = {
            "run": run.name,
            "step": r["step"],
            "tokens": f"{r['tokens'] / 1e6:.1f}M",
            "val loss": f"{r['val_loss']:.3f}",
            "first token, largest head per layer": layers(r["first_token_max"]),
            "x uniform": f"{max(r['first_token_max']) / r['first_token_uniform']:.1f}",
            "sink heads": f"{r['sink_share']:.2f}",
        }
        if "nothing_cost" in r:
            row["nothing, largest head per layer"] = layers(r["nothing_max"])
            row["cost without it"] = f"{r['nothing_cost']:.3f} (ppl x{math.exp(r['nothing_cost']):.2f})"
        out.append(row)
    tokens = [r["tokens"] for r in rows]
    summary = {
        "run": run.name,
        "first-token share reaches 0.3": crossing(tokens, [max(r["first_token_max"]) for r in rows], SINK_THRESHOLD),
    }
    if "nothing_cost" in rows[-1]:  # a model.sink_logit run logs it at every eval
        summary["nothing slot reaches 0.3"] = crossing(tokens, [max(r["nothing_max"]) for r in rows], SINK_THRESHOLD)
        summary["its removal doubles ppl"] = crossing(tokens, [r["nothing_cost"] for r in rows], COLLAPSE_COST)
    return out, summary


def plot(runs: list[Path], path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for run in runs:
        rows = evals(run)
        tokens = [r["tokens"] for r in rows]
        (line,) = ax1.plot(
            tokens, [max(r["first_token_max"]) for r in rows], marker="o", label=f"{run.name}: first token"
        )
        if "nothing_cost" in rows[-1]:
            ax1.plot(
                tokens,
                [max(r["nothing_max"]) for r in rows],
                ls="--",
                marker="s",
                color=line.get_color(),
                label=f"{run.name}: nothing slot",
            )
            ax2.plot(
                tokens, [math.exp(r["nothing_cost"]) for r in rows], marker="s", color=line.get_color(), label=run.name
            )
    ax1.axhline(SINK_THRESHOLD, color="grey", ls=":", label="sink head (0.3)")
    ax1.set(
        xscale="log",
        yscale="log",
        xlabel="training tokens",
        ylabel="largest head's mean attention",
        title="attention on the first token (or on nothing)",
    )
    ax2.axhline(2.0, color="grey", ls=":", label="2x: issue #13's bar")
    ax2.set(
        xscale="log",
        xlabel="training tokens",
        ylabel="perplexity x without the nothing slot",
        title="what evicting a perfect sink would cost",
    )
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders trained with train.sink_metric=true")
    ap.add_argument("--plot", type=Path, help="also write the trend as a PNG here")
    ap.add_argument("--no-record", action="store_true", help="print only; do not append to bench/RESULTS.md")
    args = ap.parse_args()
    table, summaries = [], []
    for run in args.runs:
        rows, summary = trend_rows(run)
        table += rows
        summaries.append(summary)
    keys = list(dict.fromkeys(k for r in table for k in r))
    table = [{k: r.get(k, "-") for k in keys} for r in table]
    keys = list(dict.fromkeys(k for s in summaries for k in s))
    summaries = [{k: s.get(k, "-") for k in keys} for s in summaries]
    details = (
        "each run's own evals (train.sink_metric: 16 held-out rows of its training length, BOS first if trained so)"
    )
    record = not args.no_record
    publish(table, str, "Attention sink over training", details, torch.device("cpu"), record)
    publish(
        summaries,
        str,
        "Attention sink: where the trend reaches a collapse",
        "power law over each run's second half of evals",
        torch.device("cpu"),
        record,
    )
    if args.plot:
        plot(args.runs, args.plot)
        print(f"written {args.plot}")


if __name__ == "__main__":
    main()
