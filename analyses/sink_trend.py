"""The attention sink's trend over training, and the scale at which it would reach a collapse.

python train.py experiment=sinks out_dir=out/sinks          (train.sink_metric logs the sink at every eval)
python analyses/sink_trend.py out/sinks="learned sink token" out/sinks-rope=BOS --plot sink_trend.png --json t.json
A power law y = a * tokens^b over the second half of a run's evals says at how many tokens the trend reaches a
collapse: a sink head (first-token share 0.3, Gu et al. 2024) or a doubled perplexity without the nothing slot (cost
ln 2). It extrapolates through a decaying learning rate: a scale to aim at, not a forecast. RUN=WHAT names the first
token in the plot (metrics.jsonl does not record it); a run's final stream evaluation (stream.json or
eval/stream.json) is a star at the last eval.
"""

import argparse
import json
import math
import statistics
from pathlib import Path

from evaluation.plots import pyplot
from evaluation.report import show_table
from evaluation.sink_mass import SINK_THRESHOLD
from utils.files import save_figure
from utils.logger import read_log

COLLAPSE_COST = math.log(2)  # nats per token: twice the perplexity, the collapse that evicting a sink would be


def evals(run: Path) -> list[dict]:
    """The eval rows of a run's metrics.jsonl that carry the sink metric (train.sink_metric=true)."""
    path = run / "metrics.jsonl"
    if not path.exists():
        raise SystemExit(f"{path} is missing: train with train.sink_metric=true into {run} first")
    rows = [r for r in read_log(path) if "first_token_max" in r]
    if not rows:
        raise SystemExit(f"{path} has no sink metric: train with train.sink_metric=true (experiment=sinks sets it)")
    return rows


def power_fit(x: list[float], y: list[float]) -> tuple[float, float] | None:
    """(a, b) of y = a * x^b by least squares in log-log over the points with y > 0; None with fewer than 2."""
    pts = [(math.log(u), math.log(v)) for u, v in zip(x, y, strict=True) if v > 0]
    if len(pts) < 2 or len({u for u, _ in pts}) < 2:
        return None
    b, log_a = statistics.linear_regression(*zip(*pts, strict=True))
    return math.exp(log_a), b


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


def trend_rows(run: Path) -> tuple[list[dict], dict]:
    """A table row per eval, and where the run's trend reaches each collapse."""
    rows, out = evals(run), []
    layers = lambda values: " ".join(f"{v:.3f}" for v in values)  # one value per layer
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
    tokens, first = [r["tokens"] for r in rows], [max(r["first_token_max"]) for r in rows]
    summary = {"run": run.name, "first-token share reaches 0.3": crossing(tokens, first, SINK_THRESHOLD)}
    if "nothing_cost" in rows[-1]:  # a model.sink_logit run logs it at every eval
        summary["nothing slot reaches 0.3"] = crossing(tokens, [max(r["nothing_max"]) for r in rows], SINK_THRESHOLD)
        summary["its removal doubles ppl"] = crossing(tokens, [r["nothing_cost"] for r in rows], COLLAPSE_COST)
    return out, summary


def final_stream(run: Path) -> dict | None:
    """The final model's first-token measure on stream windows (evaluation/stream.py), where the run keeps one."""
    path = next((p for p in (run / "stream.json", run / "eval" / "stream.json") if p.exists()), None)
    return json.loads(path.read_text())["first_token_attention"] if path else None


def plot(runs: list[Path], path: Path, key0: dict[str, str]):
    """Left: each run's first-token share (key0[run name]: what that token was); right: ppl without the nothing slot."""
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    for i, run in enumerate(runs):
        rows, colour = evals(run), f"C{i}"
        tokens, shares = [r["tokens"] for r in rows], [max(r["first_token_max"]) for r in rows]
        what = key0.get(run.name, "first token of each logged row")
        ax1.plot(tokens, shares, marker="o", color=colour, label=f"{run.name}: {what}")
        uniform = "uniform share (1 / keys a query sees)" if i == 0 else None
        ax1.plot(tokens, [r["first_token_uniform"] for r in rows], color="grey", ls="--", lw=1, label=uniform)
        if final := final_stream(run):
            first = "BOS" if final["first_token"] == "the stream's first token" else final["first_token"]
            star = f"{run.name}: {first}, final model on stream windows"
            ax1.plot(tokens[-1], max(final["max_head"]), marker="*", ms=14, color=colour, ls="none", label=star)
        if "nothing_cost" in rows[-1]:
            nothing = [max(r["nothing_max"]) for r in rows]
            ax1.plot(tokens, nothing, ls="--", marker="s", color=colour, label=f"{run.name}: nothing slot")
            ax2.plot(tokens, [math.exp(r["nothing_cost"]) for r in rows], marker="s", color=colour, label=run.name)
    ax1.axhline(SINK_THRESHOLD, color="black", ls=":", label=f"sink head ({SINK_THRESHOLD})")
    ax1.set(yscale="log", ylabel="largest head's mean attention (log scale)")
    ax1.set_title("attention on the first token (or on nothing)")
    ax2.axhline(2.0, color="black", ls=":", label="2x perplexity")
    ax2.set(ylabel="perplexity x without the nothing slot", title="what evicting a perfect sink would cost")
    for ax in (ax1, ax2):
        ax.set(xscale="log", xlabel="training tokens (log scale)")
    fig.legend(*ax1.get_legend_handles_labels(), fontsize=7, loc="outside lower center", ncol=3, frameon=False)
    ax2.legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def parse_run(arg: str) -> tuple[Path, str | None]:
    """RUN or RUN=WHAT: a run folder, and what the first token of its logged rows was."""
    path, _, what = arg.partition("=")
    return Path(path), what or None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    runs_help = "run folders trained with train.sink_metric=true, each RUN or RUN=what its first token was"
    ap.add_argument("runs", nargs="+", type=parse_run, help=runs_help)
    ap.add_argument("--plot", type=Path, help="also write the trend as a PNG here")
    json_help = "also write the tables (and this command) to this JSON file (two: -trend, -fit)"
    ap.add_argument("--json", type=Path, help=json_help)
    args = ap.parse_args()
    trends = [trend_rows(run) for run, _ in args.runs]
    json_of = lambda part: args.json and args.json.with_name(f"{args.json.stem}-{part}.json")
    details = (
        "each run's own evals (train.sink_metric: 16 held-out rows of its training length, BOS first if trained so)"
    )
    table = [row for rows, _ in trends for row in rows]  # a run without a nothing slot: "-" in its columns
    show_table(table, "Attention sink over training", details, json_of("trend"))
    fit = "power law over each run's second half of evals"
    summaries = [summary for _, summary in trends]
    show_table(summaries, "Attention sink: where the trend reaches a collapse", fit, json_of("fit"))
    if args.plot:
        plot([run for run, _ in args.runs], args.plot, {run.name: what for run, what in args.runs if what})
        print(f"written {args.plot}")


if __name__ == "__main__":
    main()
