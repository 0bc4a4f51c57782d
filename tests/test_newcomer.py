"""A newcomer's first hour: the README's commands run one after another, and the figures they draw.

python -m pytest -q tests/test_newcomer.py
The README's commands, in the order shown, never train two runs into one folder, and every checkpoint one of them
reads is made by a command shown before it. Length labels never touch and legends are readable.
"""

from itertools import combinations

import pytest
from conftest import ROOT, random_model
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_docs import segments, shown_commands

READS = ("checkpoint", "init_from", "sweep_dir")  # the overrides that name a run (or a sweep) to read


def readme_commands() -> list[tuple[str, str, list[str]]]:
    """(line, script, overrides) of every entry point the README runs, in the order it shows them."""
    out = []
    for line in shown_commands((ROOT / "README.md").read_text()):
        for words in segments(line)[0]:
            words = [w for w in words if not (w[:1].isupper() and "=" in w)]  # SCHEMES=... before bash
            if words[0] == "torchrun":
                words = words[next(i for i, w in enumerate(words) if w.endswith(".py")) :]
            elif words[0] in ("python", "python3") and len(words) > 1 and words[1].endswith(".py"):
                words = words[1:]
            else:
                continue
            out.append((line, words[0], words[1:]))
    return out


def given(overrides: list[str], key: str) -> str | None:
    return next((w.split("=", 1)[1] for w in overrides if w.startswith(f"{key}=")), None)


def written(overrides: list[str]) -> str | None:
    """The folder a train.py command writes: its run folder, or a sweep's folder where the command names it."""
    if "-m" in overrides or "--multirun" in overrides:
        return given(overrides, "hydra.sweep.dir")  # else a new dated folder each time: never another run's
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.run, resolve=True)["dir"]


def test_no_two_readme_training_commands_write_one_folder():
    """A newcomer who runs the README's training commands one after another never meets 'already holds a
    checkpoint': each run writes a folder of its own."""
    folders = {}
    for _, script, overrides in readme_commands():
        if script == "train.py" and (folder := written(overrides)) is not None:
            folders.setdefault(folder.rstrip("/"), set()).add(" ".join(overrides))  # shown twice: one run
    shared = {folder: lines for folder, lines in folders.items() if len(lines) > 1}
    assert not shared, shared


def test_every_run_a_readme_command_reads_is_made_by_a_command_before_it():
    """checkpoint=, init_from= and sweep_dir= name only folders an earlier README command wrote (the passkey
    evaluation's fine-tune is shown before it)."""
    made = set()
    for line, script, overrides in readme_commands():
        for key in READS:
            if (path := given(overrides, key)) is not None:
                assert path.rstrip("/") in made, f"{line}: nothing shown before it makes {path}"
        if script == "train.py" and (folder := written(overrides)) is not None:
            made.add(folder.rstrip("/"))
    assert {"out/rope", "out/rope-passkey-256", "multirun/seeds"} <= made


# ---- the figures: length labels that never touch, legends a reader can read ----


def length_rows(lengths: list[int], modes=("nonoverlap", "sliding"), schemes=("rope", "alibi")) -> list[dict]:
    return [
        {"scheme": s, "run_label": s, "variant": "none", "mode": m, "length": n, "ppl": 100.0 + i + n / 100,
         "ci": [95.0 + i + n / 100, 105.0 + i + n / 100]}
        for i, s in enumerate(schemes) for m in modes for n in lengths
    ]  # fmt: skip


def laid_out(fig):
    """fig drawn again (save_figure closed it), and its renderer, to measure what it shows."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


LENGTHS = {
    "16 to 64K, doubling": [16 * 2**i for i in range(13)],
    "64 to 16K, by sqrt 2": sorted({round(64 * 2 ** (i / 2)) for i in range(17)}),
    "0.5x to 16x of 1024": [512 * 2**i for i in range(6)],
}


@pytest.mark.parametrize("lengths", LENGTHS.values(), ids=LENGTHS.keys())
def test_length_labels_never_touch_and_the_training_length_keeps_its_label(figures, tmp_path, lengths):
    from evaluation import plots

    train = 1024 if 1024 in lengths else 256
    plots.plot(length_rows(lengths, modes=("nonoverlap",), schemes=("rope",)), train, tmp_path / "one.png", "rope")
    plots.plot_compare(length_rows(lengths), train, tmp_path / "compare.png")
    for fig in figures:
        renderer = laid_out(fig)
        for ax in (a for a in fig.axes if a.get_xlabel().startswith("evaluation length")):
            shown = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.get_xticklabels() if t.get_text()]
            touching = [(a, b) for (a, x), (b, y) in combinations(shown, 2) if x.overlaps(y)]
            assert not touching, touching
            names = [name for name, _ in shown]
            assert plots.length_name(train) in names and len(names) >= 3, names
    assert plots.length_name(16384) == "16K" and plots.length_name(1536) == "1.5K" and plots.length_name(1000) == "1000"


def legend_sizes(fig) -> list[float]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    return [t.get_fontsize() for legend in legends for t in legend.get_texts()]


def test_every_legend_is_readable_and_a_pictures_legend_covers_no_panel(figures, tmp_path):
    """At least 9 points (a legend of 7 at 100 dpi was too small to read); the pictures of viz.py put theirs
    outside the panels, so no curve hides behind it."""
    import gallery.draw as gallery
    from evaluation import plots

    lengths = [64 * 2**i for i in range(9)]
    rows = length_rows(lengths)
    plots.plot_compare(rows, 256, tmp_path / "compare.png")
    by_position = {str(n): [(p, 5.0 - p / n) for p in range(0, n, n // 16)] for n in lengths}
    plots.plot([r for r in rows if r["scheme"] == "rope"], 256, tmp_path / "length.png", "rope", by_position)
    methods = {name: {"nll": [1.5] * 8, "ci": [[4.0, 5.0]] * 8} for name in ("dense", "window 0+256", "sinks 4+252")}
    plots.plot_stream({"methods": methods, "block": 256, "train_length": 256, "scheme": "rope"}, tmp_path / "s.png")
    drawn = len(figures)
    options = gallery.Options(factor=2, samples=2)
    for name in ("rope", "alibi"):
        gallery.draw(gallery.Subject(name, random_model(name).pe, 16, "at init"), options, tmp_path)
    assert len(figures) == drawn + 2
    for fig in figures:
        assert legend_sizes(fig) and min(legend_sizes(fig)) >= 9, legend_sizes(fig)
    for fig in figures[drawn:]:
        renderer = laid_out(fig)
        for legend in fig.legends:
            box = legend.get_window_extent(renderer)
            assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes if ax.get_visible())
        assert not any(ax.get_legend() for ax in fig.axes)
