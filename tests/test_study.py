"""evaluation/study.py's markdown table: the README's Results table made from compare.compare's rows."""

from evaluation.study import markdown_table


def row(scheme, length, ppl, mark="", sd=0.5, mode="nonoverlap"):
    return {
        "scheme": scheme,
        "variant": "none",
        "length": length,
        "mode": mode,
        "ppl": ppl,
        "ppl_sd": sd,
        "ci": [ppl - 5, ppl + 5],
        "mark": mark,
    }


def test_rows_sorted_by_the_training_length_marks_kept_sd_at_train_and_longest():
    rows = [
        row("rope", 128, 106.0, "*"),
        row("rope", 256, 104.8, "~"),
        row("rope", 1024, 150.0),
        row("alibi", 128, 107.0),
        row("alibi", 256, 100.5, "*"),
        row("alibi", 1024, 98.0, "*"),
        {**row("learned", 256, 130.0), "mark": ""},
        {**row("learned", 1024, 0.0), "ppl": None, "ci": None},
        row("alibi", 256, 90.0, "*", mode="sliding"),  # another mode: not in the table
    ]
    lines = markdown_table(rows, 256).splitlines()
    assert lines[0] == "| scheme | 128 | **256 (trained)** | 1024 (4x) |"
    assert [ln.split(" | ")[0] for ln in lines[2:]] == ["| alibi", "| rope", "| learned"]
    alibi, rope, learned = lines[2:]
    assert alibi == "| alibi | 107.0 [102.0, 112.0] | **100.5** ±0.5 [95.5, 105.5] | **98.0** ±0.5 [93.0, 103.0] |"
    assert rope.split(" | ")[1:3] == ["**106.0** [101.0, 111.0]", "104.8~ ±0.5 [99.8, 109.8]"]
    assert learned.endswith("| n/a | 130.0 ±0.5 [125.0, 135.0] | n/a |")  # no 128 row, 1024 beyond its table
