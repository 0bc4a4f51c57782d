"""The figures of evaluation results: perplexity by length (one run or a comparison), streams, passkey heatmaps.

python eval.py checkpoint=out/rope                      -> out/rope/eval/length.png
python eval.py sweep_dir=multirun/2026-11-22_10-00-00   -> <sweep_dir>/eval/compare.png
python eval.py checkpoint=out/sink eval.mode=stream     -> out/sink/eval/stream.png (and passkey.png, passkey mode)
Every series has its own colour, marker and (a RoPE extension) line style; a 95% interval is a band, or a thin bar
where more than BAND_LIMIT lines share a panel.
"""

import math

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


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def legend_name(name: str) -> str:
    """A series as the README names it: configs/positional/irope.yaml is rope with NoPE layers (PPPN)."""
    return name.replace("rope/PPPN", "irope")


def modes_of(rows: list[dict]) -> list[str]:
    return [m for m in MODES if any(r["mode"] == m for r in rows)]


def series_styles(rows: list[dict]) -> dict[str, dict]:
    """A colour, marker and line style (by RoPE extension) per series, no two alike, and an x shift (dodge) that sets
    close series' interval bars apart; highest first at the longest length, as the lines end."""
    by_length = sorted(rows, key=lambda r: r["length"])
    last = {label(r): r["ppl"] for r in by_length if r["ppl"] and r["mode"] == rows[0]["mode"]}
    names = sorted(dict.fromkeys(label(r) for r in rows), key=lambda n: -last.get(n, 0.0))
    variant = {label(r): r.get("variant", "none") for r in rows}
    styles = {}
    for i, n in enumerate(names):
        ls = VARIANT_STYLE.get(variant[n].removesuffix(FULL), "-")  # yarn_full as yarn, its colour its own
        dodge = 2 ** (0.2 * (i / max(1, len(names) - 1) - 0.5))
        styles[n] = {"color": COLOURS[i % len(COLOURS)], "marker": MARKERS[i % len(MARKERS)], "ls": ls, "dodge": dodge}
    return styles


def seed_note(rows: list[dict]) -> str:
    """What the error bars are: ±sd over seeds where a line has several, and nothing where none has."""
    counts = sorted({r.get("runs", 1) for r in rows if r.get("ppl_sd") is not None})
    if not counts:
        return ""
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"; capped bars: ±sd over {n} seeds"


def na_note(rows: list[dict]) -> str:
    """Which cells were not scored and why (a learned table's end), for the figure: its lines stop before them."""
    na = [r for r in rows if r["ppl"] is None]
    if not na:
        return ""
    lengths = ", ".join(str(n) for n in sorted({r["length"] for r in na}))
    why = "; ".join(dict.fromkeys(r.get("note", "n/a").removeprefix("n/a: ") for r in na))
    return f"n/a at {lengths} ({why})"


def _minor_label(value: float, _pos) -> str:
    """Label only the 2s and 5s of each decade, so a log axis over several decades stays legible."""
    lead = value / 10 ** int(f"{value:e}".split("e")[1])
    return f"{value:g}" if round(lead) in (2, 5) else ""


def readable_log_axis(axis):
    """A log axis labelled in plain numbers (300, not 3 x 10^2), its minor ticks too where it spans under two decades
    (every one under a decade, else the 2s and 5s). Call it once the axis holds its data."""
    import matplotlib.ticker as ticker

    lo, hi = sorted(axis.get_view_interval())
    if lo <= 0:
        return
    axis.set_major_formatter(ticker.StrMethodFormatter("{x:g}"))
    decades = math.log10(hi / lo)
    if decades < 2:
        axis.set_minor_formatter(ticker.StrMethodFormatter("{x:g}") if decades < 1 else _minor_label)


def length_name(n: int) -> str:
    """4096 -> 4K, 1536 -> 1.5K (K = 1024 tokens, as context lengths are named); any other length in full."""
    return f"{n / 1024:g}K" if n >= 1024 and n % 512 == 0 else str(n)


def _length_axes(ax, rows: list[dict], train_length: int, title: str):
    import matplotlib.ticker as ticker

    ax.axvline(train_length, color="gray", ls=":", lw=1)
    lengths = sorted({r["length"] for r in rows})
    unit = "; 1K = 1024)" if lengths[-1] >= 1024 else ")"
    ax.set(xscale="log", yscale="log", xlabel=f"evaluation length in tokens (log scale{unit}", title=title)
    ax.set_ylabel("perplexity (log scale)")
    scored = {r["length"] for r in rows if r["ppl"]}  # a length no cell scored (past a learned table) says so
    names = [length_name(n) if n in scored else f"{length_name(n)}\nn/a" for n in lengths]
    ax.set_xticks(lengths, names)  # spaced_labels() drops those that would touch
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(_minor_label)
    values = [v for r in rows if r["ppl"] for v in [r["ppl"], *r.get("ci", [])]]
    if values and max(values) < 5 * min(values):  # a log axis over so short a span has too few ticks: add round ones
        ax.yaxis.set_major_locator(ticker.MaxNLocator(12, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_minor_locator(ticker.NullLocator())
    ax.grid(alpha=0.3, which="both")


def _line(ax, rows: list[dict], name: str, mode: str, band: bool = True, dodge: float = 1.0, **style):
    """ppl against length, its 95% interval a band (or bars dodged along x, where bands would merge), ±sd over seeds
    as capped bars."""
    series = sorted((r for r in rows if label(r) == name and r["mode"] == mode and r["ppl"]), key=lambda r: r["length"])
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


def _length_panels(fig, axes, rows: list[dict], train_length: int, title: str):
    """A panel per mode, a line per series (series_styles), one legend under them (it covers no line) and a title that
    says how the intervals are drawn and which lengths are n/a."""
    styles = series_styles(rows)
    band = len(styles) <= BAND_LIMIT
    for ax, mode in zip(axes, modes_of(rows), strict=True):
        for name, style in styles.items():
            _line(ax, rows, name, mode, band=band, label=legend_name(name), **style)
        _length_axes(ax, rows, train_length, f"{mode} windows (trained at {train_length}, dotted)")
    handles, names = fig.axes[0].get_legend_handles_labels()
    if names:
        ncol = min(len(names), 4)
        fig.legend(handles, names, loc="outside lower center", ncol=ncol, fontsize=LEGEND_SIZE, frameon=False)
    intervals = ("bands" if band else "thin bars") + ": 95% intervals" + seed_note(rows)
    note = na_note(rows)
    fig.suptitle(f"{title} against evaluation length ({intervals})" + (note and f"\n{note}"))


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


def plot(rows: list[dict], train_length: int, path, title: str, by_position: dict | None = None):
    """One checkpoint: ppl against eval length, a panel per mode, a line per variant; NLL by position beside."""
    n = len(modes_of(rows))
    panels = n + bool(by_position)
    fig, axes = pyplot().subplots(1, panels, figsize=(5.5 * panels, 5), squeeze=False, layout="constrained")
    axes = axes[0]
    for ax in axes[1:n]:
        ax.sharey(axes[0])
    _length_panels(fig, axes[:n], rows, train_length, f"{legend_name(title)}: perplexity")
    if by_position:
        ax = axes[-1]
        for i, (length, values) in enumerate(sorted(by_position.items(), key=lambda kv: int(kv[0]))):
            ax.plot([p + 1 for p, _ in values], [v for _, v in values], color=f"C{i}", label=f"window {length}")
        ax.axvline(train_length, color="gray", ls=":")
        ax.set(xscale="log", xlabel="position within the window, 1 = first (log scale)", ylabel="mean NLL (nats)")
        ax.set_title("NLL by position (nonoverlap)")
        ax.legend(fontsize=LEGEND_SIZE)
        readable_log_axis(ax.xaxis)
    spaced_labels(fig, axes[:n], train_length)
    save_figure(fig, path, dpi=120, bbox_inches="tight")


def plot_compare(rows: list[dict], train_length: int, path):
    """Many runs: a panel per mode sharing the y axis."""
    n = len(modes_of(rows))
    fig, axes = pyplot().subplots(1, n, figsize=(7 * n, 5.5), squeeze=False, sharey=True, layout="constrained")
    _length_panels(fig, axes[0], rows, train_length, "train short, test long: held-out perplexity")
    spaced_labels(fig, axes[0], train_length)
    save_figure(fig, path, dpi=120, bbox_inches="tight")


def plot_stream(result: dict, path):
    """NLL per block against tokens seen, a line per method in its own colour and line style: methods that score alike
    lie on one another, and the styles show each is there."""
    styles = ["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 3)), (0, (8, 2))]
    fig, ax = pyplot().subplots(figsize=(8, 4.5), layout="constrained")
    for i, (name, m) in enumerate(result["methods"].items()):
        if m["nll"]:
            xs = [(b + 1) * result["block"] for b in range(len(m["nll"]))]
            ax.plot(xs, m["nll"], color=f"C{i % 10}", ls=styles[i % len(styles)], label=name)
            if m.get("ci"):  # the 95% interval of each block, as a band
                lo, hi = zip(*(np.log(ci) for ci in m["ci"]), strict=True)
                ax.fill_between(xs, lo, hi, color=f"C{i % 10}", alpha=0.12, lw=0)
    ax.axvline(result["train_length"], color="gray", ls=":", label=f"training length {result['train_length']}")
    ax.set(xscale="log", xlabel="tokens seen (log scale)", ylabel=f"mean NLL per {result['block']}-token block (nats)")
    ax.set_title(f"{legend_name(result['scheme'])}: streaming past the training length (bands: 95% intervals)")
    ax.legend(fontsize=LEGEND_SIZE, loc="best")
    readable_log_axis(ax.xaxis)
    save_figure(fig, path, dpi=120)


def _heatmap(ax, grid: list[list[dict | None]], sep: str, fontsize: float):
    """grid[row][column]: a cell coloured by accuracy, with it and its 95% interval written in; grey where n/a."""
    acc = np.full((len(grid), len(grid[0])), np.nan)
    for i, row in enumerate(grid):
        for j, c in enumerate(row):
            text = "n/a"
            if c is not None and c["accuracy"] is not None:
                acc[i, j] = c["accuracy"]
                text = f"{c['accuracy']:.2f}{sep}[{c['ci'][0]:.2f}, {c['ci'][1]:.2f}]"
            ax.text(j, i, text, ha="center", va="center", fontsize=fontsize)
    cmap = pyplot().get_cmap("RdYlGn").with_extremes(bad="lightgray")
    return ax.imshow(np.ma.masked_invalid(acc), cmap=cmap, vmin=0, vmax=1, aspect="auto")


def plot_passkey(result: dict, path):
    """A heatmap: a column per length, a row per depth, coloured by accuracy, each cell with its interval."""
    lengths, depths = result["lengths"], result["depths"]
    cells = {(r["length"], r["depth"]): r for r in result["results"]}
    fig, ax = pyplot().subplots(figsize=(1.3 * len(lengths) + 2, 0.6 * len(depths) + 1.8))
    image = _heatmap(ax, [[cells[(n, d)] for n in lengths] for d in depths], "\n", 7)
    ax.set_xticks(range(len(lengths)), [f"{n}\n({n / result['train_length']:g}x)" for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xlabel("sample length in tokens (x the training length)")
    ax.set_ylabel("needle depth in the filler\n(0: right after BOS, 1: right before the question)")
    title = f"{model_label(result)} (trained at {result['train_length']}): passkey accuracy"
    ax.set_title(f"{title}\n{result['trials']} trials per cell, [95% Wilson interval]", fontsize=10)
    fig.colorbar(image, ax=ax, label="accuracy")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def plot_tasks(cells: dict, path):
    """A heatmap per task: a row per scheme, a column per test length, coloured by exact-match accuracy."""
    tasks = list(cells)
    rows = list(dict.fromkeys(name for task in tasks for name in cells[task]))
    height = (0.45 * len(rows) + 1.2) * len(tasks)
    fig, axes = pyplot().subplots(len(tasks), 1, figsize=(10, height), squeeze=False, layout="constrained")
    for ax, task in zip(axes[:, 0], tasks, strict=True):
        lengths = sorted({n for by_n in cells[task].values() for n in by_n})
        image = _heatmap(ax, [[cells[task].get(name, {}).get(n) for n in lengths] for name in rows], " ", 6)
        ax.set_xticks(range(len(lengths)), [f"n={n}" for n in lengths])
        ax.set_yticks(range(len(rows)), [legend_name(name) for name in rows], fontsize=7)
        ax.set_title(f"{task}: exact-match accuracy by test length [95% interval]", fontsize=9)
    fig.colorbar(image, ax=axes[:, 0].tolist(), label="accuracy", shrink=0.6)
    save_figure(fig, path, dpi=120, bbox_inches="tight")
