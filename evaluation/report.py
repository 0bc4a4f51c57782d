"""Length-extrapolation results as a JSON file, a table and a plot; and the comparison of many runs.

python eval.py checkpoint=out/rope                      -> out/rope/eval/length.{json,png}
python eval.py sweep_dir=multirun/2026-11-22_10-00-00   -> <sweep_dir>/eval/compare.{json,png}
python eval.py -m checkpoint=out/rope,out/alibi         -> the same comparison in the eval sweep folder
"""

import json
from pathlib import Path

from hydra.experimental.callback import Callback


def label(row: dict) -> str:
    return row["scheme"] if row.get("variant", "none") == "none" else f"{row['scheme']}+{row['variant']}"


def fmt_ppl(row: dict) -> str:
    if row.get("ppl") is None:
        return "n/a"
    return f"{row['ppl']:.1f}" if row["ppl"] < 1e4 else f"{row['ppl']:.1e}"


def table(rows: list[dict], lengths: list[int], title: str) -> str:
    """One line per (scheme + variant, mode), one column per length; n/a cells explained underneath."""
    keys = sorted({(label(r), r["mode"]) for r in rows}, key=lambda k: ([label(r) for r in rows].index(k[0]), k[1]))
    width = max([len(k[0]) for k in keys] + [6])
    lines = [title, f"{'scheme':<{width}}  {'mode':<10}" + "".join(f"{n:>9}" for n in lengths)]
    notes, counts = set(), set()
    for name, mode in keys:
        cells = {r["length"]: r for r in rows if label(r) == name and r["mode"] == mode}
        lines.append(
            f"{name:<{width}}  {mode:<10}" + "".join(f"{fmt_ppl(cells[n]) if n in cells else '-':>9}" for n in lengths)
        )
        notes |= {r["note"] for r in cells.values() if r.get("note")}
        counts |= {r["tokens"] for r in cells.values() if r.get("tokens")}
    if len(counts) == 1:
        lines.append(f"every cell scored the same {counts.pop():,} held-out tokens")
    elif counts:
        lines.append(
            "tokens scored per cell: "
            + ", ".join(f"{label(r)}/{r['mode']}/{r['length']}={r['tokens']:,}" for r in rows if r.get("tokens"))
        )
    lines += sorted(notes)
    return "\n".join(lines)


def plot(rows: list[dict], train_length: int, path: Path, title: str, by_position: dict | None = None):
    """ppl against eval length (log x), a line per scheme/variant and mode; NLL by position beside it."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if by_position else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4.5), squeeze=False)
    ax = axes[0, 0]
    names = list(dict.fromkeys(label(r) for r in rows))
    for i, name in enumerate(names):
        for mode, style in (("nonoverlap", "-"), ("sliding", "--")):
            pts = sorted((r["length"], r["ppl"]) for r in rows if label(r) == name and r["mode"] == mode and r["ppl"])
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o", ms=3, color=f"C{i}", label=f"{name} ({mode})")
    ax.axvline(train_length, color="gray", ls=":", label=f"training length {train_length}")
    ax.set(xscale="log", yscale="log", xlabel="evaluation length (tokens)", ylabel="perplexity", title=title)
    lengths = sorted({r["length"] for r in rows})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    ax.legend(fontsize=7)
    if by_position:
        ax = axes[0, 1]
        for i, (length, values) in enumerate(sorted(by_position.items(), key=lambda kv: int(kv[0]))):
            xs = [p for p, v in values]
            ax.plot(xs, [v for _, v in values], color=f"C{i}", label=f"window {length}")
        ax.axvline(train_length, color="gray", ls=":")
        ax.set(
            xscale="log",
            xlabel="position within the window",
            ylabel="mean NLL (nats)",
            title="NLL by position (nonoverlap)",
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def binned(by_position, count, min_samples: int = 32) -> list[tuple[int, float]]:
    """Mean NLL by position as (first position, mean) bins: log-spaced, each widened until it averages at least
    min_samples tokens, so a long window scored a few times still gives a readable curve."""
    out, lo, n = [], 0, len(by_position)
    while lo < n:
        hi = max(lo + 1, int(lo * 1.15))
        while hi < n and count[lo:hi].sum() < min_samples:
            hi += max(1, (hi - lo) // 2)
        hi = min(hi, n)
        if count[lo:hi].sum() > 0:
            out.append((lo, float(by_position[lo:hi].sum() / count[lo:hi].sum())))
        lo = hi
    return out


def compare(results: list[dict], out_dir: Path) -> str:
    """One table and one plot over many length.json results (a row per scheme and variant)."""
    if not results:
        raise ValueError("no eval results to compare")
    rows = [r for res in results for r in res["results"]]
    lengths = sorted({r["length"] for r in rows})
    train_lengths = sorted({res["train_length"] for res in results})
    text = table(rows, lengths, f"perplexity by evaluation length (trained at {', '.join(map(str, train_lengths))})")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(
        json.dumps({"runs": [res["checkpoint"] for res in results], "results": rows}, indent=1)
    )
    (out_dir / "compare.txt").write_text(text + "\n")
    plot(rows, train_lengths[0], out_dir / "compare.png", "train short, test long")
    return text


class CompareCallback(Callback):
    """After `python eval.py -m checkpoint=a,b,...`: compare every job's length.json in the sweep folder."""

    def on_multirun_end(self, config, **kwargs):
        sweep = Path(config.hydra.sweep.dir)
        results = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/length.json"))]
        if len(results) > 1:
            print(compare(results, sweep))
            print(f"comparison written to {sweep}/compare.{{json,txt,png}}")
