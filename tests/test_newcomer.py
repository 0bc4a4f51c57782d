"""A newcomer's first hour: the README's commands run one after another, the figures they draw, and what each
prints along the way.

python -m pytest -q tests/test_newcomer.py
The README's commands, in the order shown, never train two runs into one folder, and every checkpoint one of them
reads is made by a command shown before it. Length labels never touch and legends are readable. Preparing a corpus
prints a few lines, a stream says how far it is, a sweep's comparison says where it is written.
"""

from itertools import combinations

import pytest
import torch
from conftest import ROOT, random_model, run
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


# ---- what a run prints on the way ----


def test_preparing_a_corpus_prints_a_few_lines_not_the_tokenizers_progress(tmp_path):
    """The first run of a corpus trains its BPE tokenizer: rustbpe logs each merge step (about a hundred lines);
    the user sees prepare's few lines."""
    texts = tmp_path / "texts"
    texts.mkdir()
    words = "the of and to in that is was he for it with as his on be at by this had not are but from or".split()
    for d in range(12):
        (texts / f"{d}.txt").write_text(" ".join(words[(d * i) % len(words)] for i in range(2000)))
    proc = run(
        "-m", "data.prepare", "data=text", f"data.path={texts}/*.txt", f"data.cache_dir={tmp_path / 'cache'}",
        "tokenizer.vocab_size=300", check=True,
    )  # fmt: skip
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert "training a BPE tokenizer" in proc.stdout and len(lines) <= 6, lines


def test_a_stream_shows_its_progress(monkeypatch, capsys):
    """Each cache of eval.mode=stream takes minutes on a long stream: it says how far it is (here a line per token,
    as a log file gets one every 30 s)."""
    import utils.progress
    from evaluation.stream import stream_nll
    from model.kv_cache import DenseCache
    from utils import runtime

    monkeypatch.setattr(utils.progress, "EVERY", 0.0)
    model, tokens = random_model("rope").eval(), torch.randint(0, 97, (10,))
    nll, stopped = stream_nll(
        model, tokens, DenseCache(model, 1, 16), runtime.Runtime(torch.device("cpu"), torch.float32), "dense"
    )
    out = capsys.readouterr().out
    assert len(nll) == 9 and stopped is None
    assert "dense: 1/9 tok, eta" in out and "dense: 9/9 tok, eta 0:00" in out


def test_a_sweeps_comparison_says_where_it_is_written(tmp_path, capsys):
    """python eval.py sweep_dir=... (and -m checkpoint=a,b) print where the comparison's files are."""
    from test_compare import fake_run

    from evaluation.compare import compare

    compare([fake_run("rope", 1, 0.0), fake_run("alibi", 1, 0.5)], tmp_path)
    assert f"written {tmp_path}/compare.{{json,txt,png}}" in capsys.readouterr().out
    assert all((tmp_path / f"compare.{ext}").exists() for ext in ("json", "txt", "png"))


def test_a_slurm_job_without_submitit_names_the_package_to_install(monkeypatch):
    """A task of a multi-task SLURM job turns SLURM's variables into torchrun's with submitit: where it is missing,
    the one line says what to pip install."""
    import sys

    from utils import runtime
    from utils.errors import UserError

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setitem(sys.modules, "submitit.helpers", None)  # as if submitit were not installed
    with pytest.raises(UserError, match="pip install hydra-submitit-launcher"):
        runtime.from_slurm()
