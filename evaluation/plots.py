"""The figures of evaluation results: perplexity by length (one run or a comparison), streams, passkey heatmaps.

python eval.py checkpoint=out/rope                      -> out/rope/eval/length.png
python eval.py sweep_dir=multirun/2026-11-22_10-00-00   -> <sweep_dir>/eval/compare.png
python eval.py checkpoint=out/sink eval.mode=stream     -> out/sink/eval/stream.png (and passkey.png, passkey mode)
Every series has its own colour, marker and (a RoPE extension) line style; a 95% interval is a band, or a thin bar
where more than BAND_LIMIT lines share a panel.
"""

import math
from pathlib import Path

import numpy as np

from evaluation.report import FULL, label, model_label
from utils.files import save_figure

VARIANT_STYLE = {  # a line style per RoPE extension, so a variant reads the same in every figure
    "none": "-",
    "linear": ":",
    "ntk": "--",
    "dynamic_ntk": (0, (1, 3)),
    "yarn": "-.",
    "log": (0, (5, 1, 1, 1)),
    "longrope": (0, (8, 2)),
    "rerope": (0, (3, 1, 1, 1, 1, 1)),
    "leaky_rerope": (0, (1, 1)),
    "dca": (0, (6, 2, 1, 2)),
}
MODES = ("nonoverlap", "sliding")  # a panel each
COLOURS = [f"C{i}" for i in range(10)] + ["black", "darkgoldenrod", "lightskyblue", "lime"]
MARKERS = "osD^vP*Xh<>"  # 11 markers against 14 colours: no two of the first 154 series alike
BAND_LIMIT = 8  # more series than this in a panel: their 95% intervals as thin bars, not bands that merge
LEGEND_SIZE = 10  # points: every legend of these figures, readable at their 120 dpi


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def legend_name(name: str) -> str:
    """A series as the README names it: configs/positional/irope.yaml is rope with NoPE layers (PPPN)."""
    return name.replace("rope/PPPN", "irope")


def series_styles(rows: list[dict]) -> dict[str, dict]:
    """A colour, marker and line style (by RoPE extension) per series, no two alike, and an x shift (dodge) that sets
    close series' interval bars apart; highest first at the longest length, as the lines end."""
    last = {
        label(r): r["ppl"] for r in sorted(rows, key=lambda r: r["length"]) if r["ppl"] and r["mode"] == rows[0]["mode"]
    }
    names = sorted(dict.fromkeys(label(r) for r in rows), key=lambda n: -last.get(n, 0.0))
    variant = {label(r): r.get("variant", "none") for r in rows}
    return {
        n: {
            "color": COLOURS[i % len(COLOURS)],
            "marker": MARKERS[i % len(MARKERS)],
            "ls": VARIANT_STYLE.get(variant[n].removesuffix(FULL), "-"),  # yarn_full as yarn, its colour its own
            "dodge": 2 ** (0.2 * (i / max(1, len(names) - 1) - 0.5)),
        }
        for i, n in enumerate(names)
    }


def seed_note(rows: list[dict]) -> str:
    """What the error bars are: ±sd over seeds where a line has several, and nothing where none has."""
    counts = sorted({r.get("runs", 1) for r in rows if r.get("ppl_sd") is not None})
    if not counts:
        return ""
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"; capped bars: ±sd over {n} seeds"


def _minor_label(value: float, _pos) -> str:
    """Label only the 2s and 5s of each decade, so a log axis over several decades stays legible."""
    lead = value / 10 ** int(f"{value:e}".split("e")[1])
    return f"{value:g}" if round(lead) in (2, 5) else ""


def _plain(value: float, _pos) -> str:
    return f"{value:g}"


def readable_log_axis(axis):
    """A log axis labelled in plain numbers (300, not 3 x 10^2), its minor ticks too where it spans under two decades
    (every one under a decade, else the 2s and 5s). Call it once the axis holds its data."""
    import matplotlib.ticker

    lo, hi = sorted(axis.get_view_interval())
    if lo <= 0:
        return
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(_plain))
    decades = math.log10(hi / lo)
    if decades < 2:
        axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_plain if decades < 1 else _minor_label))


def length_name(n: int) -> str:
    """4096 -> 4K, 1536 -> 1.5K (K = 1024 tokens, as context lengths are named); any other length in full."""
    return f"{n / 1024:g}K" if n >= 1024 and n % 512 == 0 else str(n)


def _length_axes(ax, rows: list[dict], train_length: int, title: str):
    import matplotlib.ticker

    ax.axvline(train_length, color="gray", ls=":", lw=1)
    lengths = sorted({r["length"] for r in rows})
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="evaluation length in tokens (log scale" + ("; 1K = 1024)" if lengths[-1] >= 1024 else ")"),
        ylabel="perplexity (log scale)",
        title=title,
    )
    scored = {r["length"] for r in rows if r["ppl"]}  # a length no cell scored (past a learned table) says so
    names = [length_name(n) if n in scored else f"{length_name(n)}\nn/a" for n in lengths]
    ax.set_xticks(lengths, names)  # spaced_labels() drops those that would touch
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_minor_label))
    values = [v for r in rows if r["ppl"] for v in [r["ppl"], *r.get("ci", [])]]
    if values and max(values) < 5 * min(values):  # a log axis over so short a span has too few ticks: add round ones
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(12, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.grid(alpha=0.3, which="both")


def _series(rows: list[dict], name: str, mode: str) -> list[dict]:
    return sorted((r for r in rows if label(r) == name and r["mode"] == mode and r["ppl"]), key=lambda r: r["length"])


def _line(ax, rows: list[dict], name: str, mode: str, band: bool = True, dodge: float = 1.0, **style):
    """ppl against length with its 95% interval (a band, or bars dodged along x where bands would merge), and ±sd over
    seeds as error bars."""
    series = _series(rows, name, mode)
    if not series:
        return
    xs, ys = [r["length"] * (1 if band else dodge) for r in series], [r["ppl"] for r in series]
    ax.plot(xs, ys, ms=5, **style)
    if all(r.get("ci") for r in series):
        lo, hi = [r["ci"][0] for r in series], [r["ci"][1] for r in series]
        if band:
            ax.fill_between(xs, lo, hi, color=style["color"], alpha=0.12, lw=0)
        else:
            err = [[y - a for y, a in zip(ys, lo, strict=True)], [b - y for y, b in zip(ys, hi, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=style["color"], elinewidth=0.6, alpha=0.5)
    if any(r.get("ppl_sd") for r in series):
        sd = [r.get("ppl_sd") or 0 for r in series]
        ax.errorbar(xs, ys, yerr=sd, fmt="none", ecolor=style["color"], elinewidth=1.2, capsize=2)


def _length_panels(axes, rows: list[dict], train_length: int) -> str:
    """A panel per mode, each series in its own style (series_styles); returns how its intervals are drawn."""
    styles = series_styles(rows)
    band = len(styles) <= BAND_LIMIT
    for ax, mode in zip(axes, [m for m in MODES if any(r["mode"] == m for r in rows)], strict=True):
        for name, style in styles.items():
            _line(ax, rows, name, mode, band=band, label=legend_name(name), **style)
        _length_axes(ax, rows, train_length, f"{mode} windows (trained at {train_length}, dotted)")
    return ("bands" if band else "thin bars") + ": 95% intervals" + seed_note(rows)


def spaced_labels(fig, axes, train_length: int, gap: float = 6.0):
    """Label every k-th length of each axis, k as small as keeps gap points between labels, counted from the training
    length so 1x, 4x, 16x stay labelled. Measured on the laid-out figure."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    pad = renderer.points_to_pixels(gap)
    for ax in axes:
        ticks, labels = list(ax.get_xticks()), ax.get_xticklabels()
        boxes = [t.get_window_extent(renderer) for t in labels]
        start = ticks.index(train_length) if train_length in ticks else 0
        for k in range(1, len(ticks) + 1):
            kept = [i for i in range(len(ticks)) if (i - start) % k == 0]
            if all(boxes[a].x1 + pad <= boxes[b].x0 for a, b in zip(kept, kept[1:], strict=False)):
                break
        if len(kept) < len(ticks):
            ax.set_xticks(ticks, [t.get_text() if i in kept else "" for i, t in enumerate(labels)])


def _legend(fig, ax):
    """One legend for the figure, under its panels, so it covers no line."""
    handles, names = ax.get_legend_handles_labels()
    if names:
        fig.legend(
            handles, names, loc="outside lower center", ncol=min(len(names), 4), fontsize=LEGEND_SIZE, frameon=False
        )


def na_note(rows: list[dict]) -> str:
    """Which cells were not scored and why (a learned table's end), for the figure: its lines stop before them."""
    na = [r for r in rows if r["ppl"] is None]
    if not na:
        return ""
    lengths = ", ".join(str(n) for n in sorted({r["length"] for r in na}))
    why = "; ".join(dict.fromkeys(r.get("note", "n/a").removeprefix("n/a: ") for r in na))
    return f"n/a at {lengths} ({why})"


def plot(rows: list[dict], train_length: int, path: Path, title: str, by_position: dict | None = None):
    """One checkpoint: ppl against eval length, a panel per mode, a line per variant; NLL by position beside."""
    plt = _pyplot()
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    panels = len(modes) + bool(by_position)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 5), squeeze=False, layout="constrained")
    axes = axes[0]
    for ax in axes[1 : len(modes)]:
        ax.sharey(axes[0])
    intervals = _length_panels(axes[: len(modes)], rows, train_length)
    _legend(fig, axes[0])
    note = na_note(rows)
    fig.suptitle(f"{legend_name(title)}: perplexity against evaluation length ({intervals})" + (note and f"\n{note}"))
    if by_position:
        ax = axes[-1]
        for i, (length, values) in enumerate(sorted(by_position.items(), key=lambda kv: int(kv[0]))):
            ax.plot([p + 1 for p, _ in values], [v for _, v in values], color=f"C{i}", label=f"window {length}")
        ax.axvline(train_length, color="gray", ls=":")
        ax.set(
            xscale="log",
            xlabel="position within the window, 1 = first (log scale)",
            ylabel="mean NLL (nats)",
            title="NLL by position (nonoverlap)",
        )
        ax.legend(fontsize=LEGEND_SIZE)
        readable_log_axis(ax.xaxis)
    spaced_labels(fig, axes[: len(modes)], train_length)
    _save(fig, path)


def plot_compare(rows: list[dict], train_length: int, path: Path):
    """Many runs: a panel per mode sharing the y axis."""
    plt = _pyplot()
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(
        1, len(modes), figsize=(7 * len(modes), 5.5), squeeze=False, sharey=True, layout="constrained"
    )
    intervals = _length_panels(axes[0], rows, train_length)
    _legend(fig, axes[0, 0])
    note = na_note(rows)
    fig.suptitle(
        f"train short, test long: held-out perplexity against evaluation length ({intervals})" + (note and f"\n{note}")
    )
    spaced_labels(fig, axes[0], train_length)
    _save(fig, path)


def _save(fig, path: Path):
    save_figure(fig, path, dpi=120, bbox_inches="tight")


def plot_stream(result: dict, path):
    """NLL per block against tokens seen, a line per method in its own colour and line style: methods that score alike
    lie on one another, and the styles show each is there."""
    plt = _pyplot()
    styles = ["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 3)), (0, (8, 2))]
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for i, (name, m) in enumerate(result["methods"].items()):
        if m["nll"]:
            xs = [(b + 1) * result["block"] for b in range(len(m["nll"]))]
            ax.plot(xs, m["nll"], color=f"C{i % 10}", ls=styles[i % len(styles)], label=name)
            if m.get("ci"):  # the 95% interval of each block, as a band
                lo, hi = zip(*(np.log(ci) for ci in m["ci"]), strict=True)
                ax.fill_between(xs, lo, hi, color=f"C{i % 10}", alpha=0.12, lw=0)
    ax.axvline(result["train_length"], color="gray", ls=":", label=f"training length {result['train_length']}")
    ax.set(
        xscale="log",
        xlabel="tokens seen (log scale)",
        ylabel=f"mean NLL per {result['block']}-token block (nats)",
        title=f"{legend_name(result['scheme'])}: streaming past the training length (bands: 95% intervals)",
    )
    ax.legend(fontsize=LEGEND_SIZE, loc="best")
    readable_log_axis(ax.xaxis)
    save_figure(fig, path, dpi=120)


def plot_passkey(result: dict, path):
    """A heatmap: a column per length, a row per depth, coloured by accuracy, each cell with its interval."""
    plt = _pyplot()
    lengths, depths = result["lengths"], result["depths"]
    acc = np.full((len(depths), len(lengths)), np.nan)
    cells = {(r["length"], r["depth"]): r for r in result["results"]}
    fig, ax = plt.subplots(figsize=(1.3 * len(lengths) + 2, 0.6 * len(depths) + 1.8))
    for i, d in enumerate(depths):
        for j, n in enumerate(lengths):
            r = cells[(n, d)]
            text = "n/a"
            if r["accuracy"] is not None:
                acc[i, j] = r["accuracy"]
                text = f"{r['accuracy']:.2f}\n[{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="lightgray")
    image = ax.imshow(np.ma.masked_invalid(acc), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{n}\n({n / result['train_length']:g}x)" for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set(
        xlabel="sample length in tokens (x the training length)",
        ylabel="needle depth in the filler\n(0: right after BOS, 1: right before the question)",
    )
    ax.set_title(
        f"{model_label(result)} (trained at {result['train_length']}): passkey accuracy\n"
        f"{result['trials']} trials per cell, [95% Wilson interval]",
        fontsize=10,
    )
    fig.colorbar(image, ax=ax, label="accuracy")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def plot_tasks(cells: dict, path):
    """A heatmap per task: a row per scheme, a column per test length, coloured by exact-match accuracy, each cell with
    its 95% interval; grey where n/a."""
    plt = _pyplot()
    names = list(cells)
    rows = list(dict.fromkeys(name for task in names for name in cells[task]))
    fig, axes = plt.subplots(
        len(names), 1, figsize=(10, (0.45 * len(rows) + 1.2) * len(names)), squeeze=False, layout="constrained"
    )
    for ax, task in zip(axes[:, 0], names, strict=True):
        lengths = sorted({n for by_n in cells[task].values() for n in by_n})
        acc = np.full((len(rows), len(lengths)), np.nan)
        for i, name in enumerate(rows):
            for j, n in enumerate(lengths):
                c = cells[task].get(name, {}).get(n)
                if c is not None:
                    acc[i, j] = c["accuracy"]
                text = "n/a" if c is None else f"{c['accuracy']:.2f} [{c['ci'][0]:.2f}, {c['ci'][1]:.2f}]"
                ax.text(j, i, text, ha="center", va="center", fontsize=6)
        cmap = plt.get_cmap("RdYlGn").with_extremes(bad="lightgray")
        image = ax.imshow(np.ma.masked_invalid(acc), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(lengths)), [f"n={n}" for n in lengths])
        ax.set_yticks(range(len(rows)), [legend_name(name) for name in rows], fontsize=7)
        ax.set_title(f"{task}: exact-match accuracy by test length [95% interval]", fontsize=9)
    fig.colorbar(image, ax=axes[:, 0].tolist(), label="accuracy", shrink=0.6)
    _save(fig, Path(path))
