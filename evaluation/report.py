"""Length-extrapolation results as a table and a plot, for one run or many (evaluation/compare.py).

python eval.py checkpoint=out/rope                      -> out/rope/eval/length.{json,png}
python eval.py sweep_dir=multirun/2026-11-22_10-00-00   -> <sweep_dir>/eval/compare.{json,txt,png}
A cell reads `ppl [lo, hi]`, its 95% bootstrap interval (evaluation/bootstrap.py); a plot shows it as a band.
"""

from pathlib import Path


def trained_scaling(model_config: dict) -> str | None:
    """'yarn x4 from 256' for a model fine-tuned with positional.scaling (built into it), else None."""
    pos = model_config["positional"]
    if pos.get("scaling", "none") == "none":
        return None
    return f"{pos['scaling']} x{float(pos['scaling_factor']):g} from {pos['original_length']}"


def scheme_label(ckpt: dict) -> str:
    """The scheme as its checkpoint defines it, for every report: rope, rope/PPPN (positional.layers with NoPE
    layers: iRoPE), rope[yarn x4 from 256] (fine-tuned with a scaling), rope[at 1024 from 256] (fine-tuned longer,
    unscaled), nope[dropped rope] (DroPE: a NoPE fine-tune of a RoPE model). Not the module's name, which is the
    same for rope and iRoPE."""
    model_config = ckpt["model_config"]
    pos = model_config["positional"]
    name = pos["name"]
    if "N" in str(pos.get("layers", "")) and name != "nope":
        name += f"/{pos['layers']}"
    init = ckpt.get("init_from") or {}
    trained = f"dropped {init['dropped']}" if init.get("dropped") else trained_scaling(model_config)
    if not trained and init and init.get("seq_len") != ckpt.get("seq_len"):  # fine-tuned longer, unscaled
        trained = f"at {ckpt['seq_len']} from {init['seq_len']}"
    return f"{name}[{trained}]" if trained else name


def label(row: dict) -> str:
    name = row.get("run_label", row["scheme"])
    return name if row.get("variant", "none") == "none" else f"{name}+{row['variant']}"


def _num(x: float) -> str:
    return f"{x:.1f}" if x < 1e4 else f"{x:.1e}"


def fmt_ppl(row: dict) -> str:
    """`ppl [lo, hi]` (the 95% interval); a group of seeds adds `±sd` of its runs' perplexities."""
    if row.get("ppl") is None:
        return "n/a"
    spread = f"±{_num(row['ppl_sd'])}" if row.get("ppl_sd") is not None else ""
    ci = f" [{_num(row['ci'][0])}, {_num(row['ci'][1])}]" if row.get("ci") else ""
    return f"{_num(row['ppl'])}{spread}{ci}{row.get('mark', '')}"


def table(rows: list[dict], lengths: list[int], title: str) -> str:
    """One line per (scheme + variant, mode), one column per length; n/a cells explained underneath."""
    names = list(dict.fromkeys(label(r) for r in rows))
    keys = sorted({(label(r), r["mode"]) for r in rows}, key=lambda k: (names.index(k[0]), k[1]))
    cells = {(label(r), r["mode"], r["length"]): fmt_ppl(r) for r in rows}
    width = max([len(k[0]) for k in keys] + [6])
    col = max([len(c) for c in cells.values()] + [len(str(n)) for n in lengths]) + 2
    lines = [title, f"{'scheme':<{width}}  {'mode':<10}" + "".join(f"{n:>{col}}" for n in lengths)]
    for name, mode in keys:
        lines.append(
            f"{name:<{width}}  {mode:<10}" + "".join(f"{cells.get((name, mode, n), '-'):>{col}}" for n in lengths)
        )
    counts = {r["tokens"] for r in rows if r.get("tokens")}
    if len(counts) == 1:
        lines.append(f"every cell scored the same {counts.pop():,} held-out tokens")
    elif counts:
        lines.append(
            "tokens scored per cell: "
            + ", ".join(f"{label(r)}/{r['mode']}/{r['length']}={r['tokens']:,}" for r in rows if r.get("tokens"))
        )
    if any(r.get("ci") for r in rows):
        lines.append("[lo, hi]: 95% bootstrap interval over the scored pieces (evaluation/bootstrap.py)")
    lines += sorted({r["note"] for r in rows if r.get("note")})
    return "\n".join(lines)


VARIANT_STYLE = {
    "none": "-",
    "linear": ":",
    "ntk": "--",
    "dynamic_ntk": (0, (1, 3)),
    "yarn": "-.",
    "log": (0, (5, 1, 1, 1)),
}
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


def _series(rows: list[dict], name: str, mode: str) -> list[dict]:
    return sorted((r for r in rows if label(r) == name and r["mode"] == mode and r["ppl"]), key=lambda r: r["length"])


def _line(ax, rows: list[dict], name: str, mode: str, **style):
    """ppl against length with its 95% interval as a band, and ±sd over seeds as error bars for a seed group."""
    series = _series(rows, name, mode)
    if not series:
        return
    xs, ys = [r["length"] for r in series], [r["ppl"] for r in series]
    ax.plot(xs, ys, marker="o", ms=3, **style)
    if all(r.get("ci") for r in series):
        ax.fill_between(
            xs, [r["ci"][0] for r in series], [r["ci"][1] for r in series], color=style["color"], alpha=0.15, lw=0
        )
    if any(r.get("ppl_sd") for r in series):
        sd = [r.get("ppl_sd") or 0 for r in series]
        ax.errorbar(xs, ys, yerr=sd, fmt="none", ecolor=style["color"], elinewidth=1, capsize=2)


def plot(rows: list[dict], train_length: int, path: Path, title: str, by_position: dict | None = None):
    """One checkpoint: ppl against eval length (log x), a line per variant and mode; NLL by position beside it."""
    plt = _pyplot()
    panels = 2 if by_position else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4.5), squeeze=False)
    ax = axes[0, 0]
    for i, name in enumerate(dict.fromkeys(label(r) for r in rows)):
        for mode, style in MODE_STYLE.items():
            _line(ax, rows, name, mode, ls=style, color=f"C{i}", label=f"{name} ({mode})")
    _length_axes(ax, rows, train_length, f"{title} (trained at {train_length}, dotted; bands: 95% intervals)")
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
    schemes = list(dict.fromkeys(r.get("run_label", r["scheme"]) for r in rows))
    for ax, mode in zip(axes[0], modes, strict=True):
        for name in dict.fromkeys(label(r) for r in rows):
            row = next(r for r in rows if label(r) == name)
            style = VARIANT_STYLE.get(row.get("variant", "none"), "-")
            color = f"C{schemes.index(row.get('run_label', row['scheme'])) % 10}"
            _line(ax, rows, name, mode, ls=style, color=color, label=name)
        _length_axes(ax, rows, train_length, f"{mode} windows (trained at {train_length}, dotted)")
    axes[0, -1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.suptitle(
        "train short, test long: held-out perplexity against evaluation length "
        "(bands: 95% intervals; bars: ±sd over seeds)"
    )
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
