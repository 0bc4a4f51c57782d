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


VARIANT_STYLE = {"none": "-", "linear": ":", "ntk": "--", "dynamic_ntk": (0, (1, 3)), "yarn": "-."}
MODE_STYLE = {"nonoverlap": "-", "sliding": "--"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _minor_label(value: float, _pos) -> str:
    """Label only the 2s and 5s of each decade, so a log axis over several decades stays legible."""
    lead = value / 10 ** int(f"{value:e}".split("e")[1])
    return f"{value:g}" if round(lead) in (2, 5) else ""


def _length_axes(ax, rows: list[dict], train_length: int, title: str):
    import matplotlib.ticker

    ax.axvline(train_length, color="gray", ls=":", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="evaluation length (tokens)", ylabel="perplexity", title=title)
    lengths = sorted({r["length"] for r in rows})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_minor_label))
    ax.grid(alpha=0.3, which="both")


def _points(rows: list[dict], name: str, mode: str) -> list[tuple[int, float]]:
    return sorted((r["length"], r["ppl"]) for r in rows if label(r) == name and r["mode"] == mode and r["ppl"])


def plot(rows: list[dict], train_length: int, path: Path, title: str, by_position: dict | None = None):
    """One checkpoint: ppl against eval length (log x), a line per variant and mode; NLL by position beside it."""
    plt = _pyplot()
    panels = 2 if by_position else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4.5), squeeze=False)
    ax = axes[0, 0]
    for i, name in enumerate(dict.fromkeys(label(r) for r in rows)):
        for mode, style in MODE_STYLE.items():
            if pts := _points(rows, name, mode):
                ax.plot(*zip(*pts, strict=True), ls=style, marker="o", ms=3, color=f"C{i}", label=f"{name} ({mode})")
    _length_axes(ax, rows, train_length, f"{title} (trained at {train_length}, dotted)")
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
    _save(fig, path)


def plot_compare(rows: list[dict], train_length: int, path: Path):
    """Many runs: a panel per mode sharing the y axis; a colour per scheme, a line style per RoPE scaling variant."""
    plt = _pyplot()
    modes = [m for m in MODE_STYLE if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes) + 2.5, 5), squeeze=False, sharey=True)
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    for ax, mode in zip(axes[0], modes, strict=True):
        for name in dict.fromkeys(label(r) for r in rows):
            row = next(r for r in rows if label(r) == name)
            style = VARIANT_STYLE.get(row.get("variant", "none"), "-")
            color = f"C{schemes.index(row['scheme']) % 10}"
            if pts := _points(rows, name, mode):
                ax.plot(*zip(*pts, strict=True), ls=style, marker="o", ms=3, color=color, label=name)
        _length_axes(ax, rows, train_length, f"{mode} windows (trained at {train_length}, dotted)")
    axes[0, -1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.suptitle("train short, test long: held-out perplexity against evaluation length")
    _save(fig, path)


def _save(fig, path: Path):
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
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
    plot_compare(rows, train_lengths[0], out_dir / "compare.png")
    return text


class CompareCallback(Callback):
    """After `python eval.py -m checkpoint=a,b,...`: compare every job's length.json in the sweep folder."""

    def on_multirun_end(self, config, **kwargs):
        sweep = Path(config.hydra.sweep.dir)
        results = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/length.json"))]
        if len(results) > 1:
            print(compare(results, sweep))
            print(f"comparison written to {sweep}/compare.{{json,txt,png}}")
