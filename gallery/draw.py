"""Drawing the pictures of a positional scheme (gallery/numbers.py computes their numbers), and their index.

python viz.py positional=rope            -> pictures/rope_decay.png ... and pictures/index.md
python viz.py viz.all=true               -> every scheme's pictures in one folder, listed in pictures/index.md
A picture is two functions: one gathers its numbers or says why the scheme has none, one draws them. So a gallery
never stops at a scheme that does not fit, and a test can gather every scheme's numbers without drawing them.
"""

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from evaluation.attention_map import plot_attention_maps
from evaluation.plots import LEGEND_SIZE, pyplot
from evaluation.sink_mass import first_token_attention
from gallery import numbers
from utils.errors import UserError
from utils.files import read_json, save_figure, shape_problem, write_text

plt = pyplot()  # on the Agg backend: pictures are files
DPI = 100  # small files: a README shows a few of them
ATTENTION_DPI = 80  # attention maps are noise to PNG's compression: at 110 dpi four 256 x 256 maps took 450 KB


@dataclass
class Subject:
    """What one set of pictures is of: a scheme at init, or a trained model and its held-out text."""

    label: str  # the file-name prefix and index heading: the scheme's name, or the run's folder name
    pe: torch.nn.Module  # the scheme (a trained model's own, model.pe, with its trained values)
    length: int  # the training length L: distance axes reach factor x L, a dotted line marks L
    state: str  # "at init" or "trained: <run>, step N", in every title
    model: torch.nn.Module | None = None  # a trained model: trained q and k, content biases, attention maps
    tokens: torch.Tensor | None = None  # held-out text of the checkpoint's own data (1-D token ids)


@dataclass
class Options:
    factor: float = 4.0  # distances up to factor x L; the rope scaling variants extend by this factor
    samples: int = 128  # random q = k draws for the decay curve
    heads: list | None = None  # attention maps of these (layer, head) pairs; None: picked by first-token share
    seed: int = 0


def distances(s: Subject, o: Options) -> torch.Tensor:
    return torch.arange(max(s.length, int(o.factor * s.length)))


def windows(s: Subject) -> torch.Tensor:
    """(B, L): up to 8 consecutive training-length windows of the held-out text."""
    rows = max(1, min(8, len(s.tokens) // s.length))
    return s.tokens[: rows * s.length].view(rows, s.length)


def vectors_numbers(s: Subject, o: Options):
    v = numbers.position_vectors(s.pe, s.length)
    return "adds no vector to the token embeddings" if v is None else (v, numbers.similarity_by_offset(v))


def decay_numbers(s: Subject, o: Options):
    if not s.pe.rotary:
        return "does not rotate queries and keys"
    d = distances(s, o)
    return d, numbers.random_decay(s.pe, d, o.factor, s.length, o.samples, o.seed)


def decay_trained_numbers(s: Subject, o: Options):
    if not s.pe.rotary:
        return "does not rotate queries and keys"
    if s.model is None:
        return "needs trained queries and keys: give checkpoint="
    d, mean_qk = distances(s, o), numbers.mean_query_key(s.model, windows(s))
    return d, [numbers.rotary_logits(s.pe, q[None], k[None], d)[0] for q, k in mean_qk]


def bias_numbers(s: Subject, o: Options):
    d = distances(s, o)
    far = numbers.bias_by_distance(s.pe, d)
    if far is None:
        return "adds no position-only bias to the scores"
    near = numbers.bias_by_distance(s.pe, d[: s.length], s.length - 1)
    moved = not torch.allclose(near, far[:, : s.length], atol=1e-6)  # a bias that reads the query's position
    return d, far, near if moved else None


def content_bias_numbers(s: Subject, o: Options):
    if s.pe.content_bias is None:
        return "has no bias that reads the text"
    if s.model is None:
        return "has a bias that reads the text: give checkpoint="
    per_layer = numbers.content_bias_by_distance(s.model, windows(s))
    return torch.arange(per_layer.size(-1)), per_layer


def attention_numbers(s: Subject, o: Options):
    if s.model is None:
        return "needs a trained model: give checkpoint="
    return first_token_attention(s.model, s.tokens, s.length)["heads"]


def head_colors(n: int) -> list:
    return [plt.get_cmap("viridis")(h / max(1, n - 1) * 0.9) for h in range(n)]


def distance_axis(ax, d: torch.Tensor, length: int):
    """Distances on a log axis (linear below 1, so distance 0 stays on it: RoPE's decay spans decades), L dotted."""
    ax.axvline(length, color="0.6", ls=":", lw=1, label="training length")
    ax.set_xscale("symlog", linthresh=1, linscale=0.3)
    ax.set_xlim(0, int(d.max()))


def save(fig, path: Path, title: str, legend_of=None, loc: str = "outside right upper"):
    """Title and save fig, with the legend of legend_of's curves outside the panels, so it covers no curve."""
    if legend_of is not None:
        handles, names = legend_of.get_legend_handles_labels()
        ncol = len(names) if "lower" in loc else 1  # under the panels: one row
        fig.legend(handles, names, loc=loc, ncol=ncol, fontsize=LEGEND_SIZE, frameon=False)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path, dpi=DPI)


def draw_vectors(s: Subject, o: Options, data, path: Path):
    v, similarity = data
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4), width_ratios=(1.5, 1), layout="constrained")
    lim = float(v.abs().max())
    image = a.imshow(v.T.numpy(), aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    a.set(xlabel="position", ylabel="dimension", title="vector added to the embedding")
    fig.colorbar(image, ax=a, shrink=0.9)
    b.plot(similarity.numpy(), lw=1.2)
    b.axhline(0, color="0.7", lw=0.8)
    b.set(xlabel="offset k", ylabel="cosine, mean over p", title="similarity of positions p and p + k")
    save(fig, path, f"{s.label} ({s.state}): position vectors")


def draw_decay(s: Subject, o: Options, data, path: Path):
    d, curves = data
    variants = [kind for kind in curves if kind != "none"]  # a panel each, over the unscaled curve
    rows = -(-len(variants) // 2)  # two panels a row, as many rows as the variants fill
    fig, axes = plt.subplots(rows, 2, figsize=(8, 2.6 * rows), sharex=True, sharey=True, layout="constrained")
    for ax in axes.flat[len(variants) :]:
        ax.set_visible(False)
    for ax, kind in zip(axes.flat, variants, strict=False):
        ax.plot(d.numpy(), curves["none"].numpy(), color="0.6", lw=0.9, label="no scaling")
        ax.plot(d.numpy(), curves[kind].numpy(), color="C1", lw=0.9, label=f"the panel's scaling, x{o.factor:g}")
        distance_axis(ax, d, s.length)
        ax.axhline(0, color="0.8", lw=0.8)
        ax.set_title(f"{kind} x{o.factor:g}", fontsize=LEGEND_SIZE)
        ax.set(xlabel="distance (query position - key position; log scale)", ylabel="mean logit q.k / sqrt(width)")
        ax.label_outer()  # axis labels on the bottom row and left column only
    title = f"{s.label} ({s.state}): logit of random q = k by distance ({o.samples} draws per head)"
    save(fig, path, title, axes.flat[0], "outside lower center")


def draw_layers(log: bool, ylabel: str, title: str, s: Subject, o: Options, data, path: Path):
    """data = (distances d, per layer a curve per head): a panel per layer (log: d on distance_axis)."""
    d, per_layer = data
    n = len(per_layer)
    fig, axes = plt.subplots(1, n, figsize=(2.6 * n + 1, 3), sharey=True, squeeze=False, layout="constrained")
    colors = head_colors(s.pe.n_head)
    for layer, (ax, curves) in enumerate(zip(axes[0], per_layer, strict=True)):
        for h, curve in enumerate(curves):
            ax.plot(d.numpy(), curve.numpy(), color=colors[h], lw=1, label=f"head {h}")
        if log:
            distance_axis(ax, d, s.length)
        ax.set(title=f"layer {layer}", xlabel="distance (log scale)" if log else "distance")
    axes[0, 0].set_ylabel(ylabel)
    save(fig, path, f"{s.label} ({s.state}): {title}", axes[0, -1])


def draw_bias(s: Subject, o: Options, data, path: Path):
    # distances within L on a linear axis (ALiBi's lines), all of them on a log axis (T5's buckets, FIRE's
    # normaliser); dashed: a query at L - 1, which FIRE biases differently
    d, far, near = data
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    colors = head_colors(s.pe.n_head)
    for ax in axes:
        for h in range(s.pe.n_head):
            ax.plot(d.numpy(), far[h].numpy(), color=colors[h], lw=1.2, label=f"head {h}")
            if near is not None:
                ax.plot(d[: s.length].numpy(), near[h].numpy(), color=colors[h], lw=1, ls="--")
    axes[0].set(xlim=(0, s.length), xlabel="distance (query position - key position)", ylabel="bias added to the logit")
    distance_axis(axes[1], d, s.length)
    axes[1].set_xlabel("distance (query position - key position; log scale)")
    where = f"query at {len(d) - 1}" + ("" if near is None else f"; dashed: query at {s.length - 1}")
    save(fig, path, f"{s.label} ({s.state}): score bias by distance ({where})", axes[1])


def draw_attention(s: Subject, o: Options, per_head, path: Path):
    plot_attention_maps(s.model, s.tokens, s.length, per_head, path, heads=o.heads, dpi=ATTENTION_DPI, label=s.label)


PICTURES = {  # name -> (numbers or why not, draw, what the index says it shows)
    "vectors": (
        vectors_numbers,
        draw_vectors,
        "the added position vectors (position x dimension) and the cosine of positions p and p + k",
    ),
    "decay": (
        decay_numbers,
        draw_decay,
        "q.k against distance for random q = k (RoPE's long-term decay), and each rope scaling variant's",
    ),
    "decay_trained": (
        decay_trained_numbers,
        partial(draw_layers, True, "logit of mean q, mean k", "trained mean query against mean key by distance"),
        "q.k against distance for the trained mean query and mean key on held-out text, per layer and head",
    ),
    "bias": (bias_numbers, draw_bias, "the score bias against distance per head (trained values from a checkpoint)"),
    "content_bias": (
        content_bias_numbers,
        partial(draw_layers, False, "mean bias over the text", "content bias by distance, mean over held-out text"),
        "a bias that reads the text (Shaw, FoX): its mean over held-out text against distance",
    ),
    "attention": (attention_numbers, draw_attention, "attention maps of chosen heads over a held-out window"),
}


def draw(s: Subject, o: Options, out_dir: Path) -> list[tuple[str, str | None, str | None]]:
    """Every picture of s into out_dir as <label>_<picture>.png: (picture, file name or None, why skipped)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (numbers_of, draw_picture, _) in PICTURES.items():
        data = numbers_of(s, o)
        if isinstance(data, str):  # why the scheme has no such picture
            rows.append((name, None, data))
        else:
            draw_picture(s, o, data, out_dir / f"{s.label}_{name}.png")
            rows.append((name, f"{s.label}_{name}.png", None))
    return rows


def write_index(out_dir: Path, command: str, entries: list[tuple[str, str, str, list]]) -> Path:
    """index.md: each subject's pictures, and each one it lacks and why. The sections live in index.json, so an
    earlier viz.py's subjects stay listed and this run's replace their own."""
    record = out_dir / "index.json"
    sections = read_json(record, fix="delete it (the next viz.py lists its own pictures)") if record.exists() else {}
    for label, sec in sections.items():
        if why := shape_problem(sec, {"state": str, "scheme": str, "command": str, "rows": list}, label):
            raise UserError(f"{record} {why}; delete it (the next viz.py lists its own pictures)")
    for label, state, scheme, rows in entries:
        sections[label] = {"state": state, "scheme": scheme, "command": command, "rows": [list(r) for r in rows]}
    write_text(record, json.dumps(sections, indent=1) + "\n")
    lines = ["# Positional pictures\n"]
    lines += [f"- `{name}`: {what}" for name, (*_, what) in PICTURES.items()]
    for label, sec in sections.items():
        lines.append(f"\n## {label} ({sec['state']})\n\nWritten by `{sec['command']}`.\n")
        lines += [f"![{label} {name}]({file})\n" for name, file, _ in sec["rows"] if file]
        lines += [f"- {name}: skipped, {sec['scheme']} {why}" for name, _, why in sec["rows"] if why]
    path = out_dir / "index.md"
    write_text(path, "\n".join(lines) + "\n")
    return path
