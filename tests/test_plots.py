"""Every figure nanopos draws from results can be read: many lines told apart, log axes named, error bars named
only for what they are, and labels that say what was measured."""

import json

import matplotlib
import matplotlib.colors
import matplotlib.figure
import matplotlib.text

matplotlib.use("Agg")

from analyses import sink_trend  # noqa: E402
from evaluation import plots  # noqa: E402
from evaluation.plots import plot_passkey, plot_stream  # noqa: E402

SCHEMES = ["alibi", "fire", "fox", "rope/PPPN", "kerple", "pope", "prope", "rope", "shaw", "xpos", "t5"]


def compare_rows(seeds: int) -> list[dict]:
    """12 series (11 schemes and rope+yarn), two modes, three lengths, as compare.compare writes them."""
    rows = []
    for i, (scheme, variant) in enumerate([(s, "none") for s in SCHEMES] + [("rope", "yarn")]):
        for mode in ("nonoverlap", "sliding"):
            for length in (128, 256, 512):
                ppl = 100.0 + i + length / 100
                rows.append(
                    {"scheme": scheme, "run_label": scheme, "variant": variant, "mode": mode, "length": length,
                     "ppl": ppl, "ci": [ppl - 5, ppl + 5], "runs": seeds, "ppl_sd": 1.0 if seeds > 1 else None}
                )  # fmt: skip
    return rows


def texts(fig) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))


def assert_log_axes_say_so(fig):
    for ax in fig.axes:
        for scale, name in ((ax.get_xscale(), ax.get_xlabel()), (ax.get_yscale(), ax.get_ylabel())):
            assert scale != "log" or "log" in name, (ax.get_title(), name)


def test_a_comparison_of_twelve_series_gives_each_its_own_colour_line_style_and_marker(figures, tmp_path):
    plots.plot_compare(compare_rows(3), 256, tmp_path / "compare.png")
    (fig,) = figures
    for ax in fig.axes:
        lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]  # the series, not the guides
        triples = {(matplotlib.colors.to_hex(ln.get_color()), ln.get_linestyle(), ln.get_marker()) for ln in lines}
        assert len(lines) == 12 and len(triples) == 12
    names = {ln.get_label() for ln in fig.axes[0].get_lines()}
    assert "irope" in names and "rope+yarn" in names and "rope/PPPN" not in names  # the README's names


def test_a_full_layers_row_draws_in_its_scalings_line_style_and_a_colour_of_its_own():
    rows = [{"scheme": "rope", "variant": v, "mode": "nonoverlap", "length": 512, "ppl": 100.0 + i}
            for i, v in enumerate(("none", "yarn", "yarn_full"))]  # fmt: skip
    styles = plots.series_styles(rows)
    assert styles["rope+yarn_full"]["ls"] == styles["rope+yarn"]["ls"] != styles["rope"]["ls"]
    assert styles["rope+yarn_full"]["color"] != styles["rope+yarn"]["color"]


def test_log_axes_say_so_in_their_label(figures, tmp_path):
    plots.plot_compare(compare_rows(1), 256, tmp_path / "compare.png")
    rows = [r for r in compare_rows(1) if r["run_label"] == "rope"]
    plots.plot(rows, 256, tmp_path / "length.png", "rope", {"256": [(0, 5.0), (10, 4.5), (100, 4.2)]})
    block = [[4.0, 4.2]] * 3
    methods = {"dense": {"nll": [1.5] * 3, "ci": [[3.0, 6.0]] * 3}, "window 0+32": {"nll": [1.4] * 3, "ci": block}}
    plot_stream({"methods": methods, "block": 16, "train_length": 32, "scheme": "rope"}, tmp_path / "stream.png")
    assert len(figures) == 3 and sum(ax.get_xscale() == "log" for fig in figures for ax in fig.axes) >= 5
    for fig in figures:
        assert_log_axes_say_so(fig)


def test_sd_over_seeds_is_named_only_where_a_series_has_several_seeds(figures, tmp_path):
    plots.plot_compare(compare_rows(3), 256, tmp_path / "seeds.png")
    plots.plot_compare(compare_rows(1), 256, tmp_path / "one.png")
    several, one = (texts(fig) for fig in figures)
    assert "sd over 3 seeds" in several and "sd" not in one and "95% intervals" in one


def test_passkey_heatmap_states_where_depth_0_and_1_put_the_needle(figures, tmp_path):
    """data/passkey.py: depth 0 puts the needle right after BOS, depth 1 right before the question."""
    cells = [{"length": n, "depth": d, "accuracy": 1.0, "ci": [0.9, 1.0]} for n in (128, 256) for d in (0.0, 1.0)]
    result = {"scheme": "rope", "train_length": 128, "trials": 10, "lengths": [128, 256], "depths": [0.0, 1.0],
              "results": cells}  # fmt: skip
    plot_passkey(result, tmp_path / "passkey.png")
    depth = figures[0].axes[0].get_ylabel()
    assert "0: right after BOS" in depth and "1: right before the question" in depth


def test_sink_trend_draws_the_uniform_share_and_names_each_first_token(figures, tmp_path):
    """The uniform share is drawn from the logged first_token_uniform; the first-token line is named by what the
    token was; the final model's stream measure (BOS first) is a star at the last eval; no legend names an issue."""
    runs = [tmp_path / "sinks-rope", tmp_path / "sinks-nothing"]
    for run in runs:
        run.mkdir()
        rows = [
            {"step": s, "tokens": s * 1000, "val_loss": 4.0, "first_token_max": [0.005, 0.001],
             "first_token_uniform": 0.0054, "sink_share": 0.0, "nothing_max": [0.1 * s / 300, 0.01],
             "nothing_cost": 0.1 * s / 100}
            for s in (100, 200, 300)
        ]  # fmt: skip
        if run.name == "sinks-rope":
            rows = [{k: v for k, v in r.items() if not k.startswith("nothing")} for r in rows]
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    stream = {"first_token_attention": {"first_token": "the stream's first token", "max_head": [0.023, 0.002]}}
    (runs[0] / "stream.json").write_text(json.dumps(stream))
    sink_trend.plot(runs, tmp_path / "trend.png", {"sinks-rope": "arbitrary token", "sinks-nothing": "BOS"})
    (fig,) = figures
    left = fig.axes[0]
    lines = {ln.get_label(): ln for ln in left.get_lines()}
    assert list(lines["uniform share (1 / keys a query sees)"].get_ydata()) == [0.0054] * 3
    assert "sinks-rope: arbitrary token" in lines and "sinks-nothing: BOS" in lines
    star = lines["sinks-rope: BOS, final model on stream windows"]
    assert list(star.get_xdata()) == [300_000] and list(star.get_ydata()) == [0.023]
    assert "2x perplexity" in texts(fig) and "#" not in texts(fig) and "issue" not in texts(fig)
    assert_log_axes_say_so(fig)
