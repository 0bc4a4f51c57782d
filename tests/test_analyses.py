"""The analyses (analyses/): their premises and formulas on models built to make the answer known."""

import pytest
import torch
from conftest import random_model

from bench.configs import model_config
from model.gpt import GPT, GPTConfig


def test_position_ablation_leaves_nope_alone_and_moves_rope():
    """analyses/position_ablation.py's premise: positions all at 0 leave a model only the token order (the causal mask
    does not read the ids), so NoPE scores bit for bit the same, while RoPE, which reads them, does not."""
    from analyses.position_ablation import val_loss

    class Rows:
        def batch(self, first, n, device):
            g = torch.Generator().manual_seed(first)
            x = torch.randint(0, 97, (n, 33), generator=g)
            return x[:, :-1], x[:, 1:]

    for scheme, moved in (("nope", False), ("rope", True)):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**model_config(scheme, "tiny", 32, vocab=97))).eval()
        with torch.no_grad():  # the output projections start at zero: give attention a say
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        true = val_loss(model, Rows(), 2, lambda T: torch.arange(T))
        zero = val_loss(model, Rows(), 2, lambda T: torch.zeros(T, dtype=torch.long))
        assert (zero != true) == moved, (scheme, true, zero)


def test_sink_trend_fits_a_power_law_and_finds_where_it_crosses():
    """analyses/sink_trend.py: the fit recovers y = 3e-5 x^0.5 exactly, so its crossing of 0.3 is (0.3 / 3e-5)^2
    tokens; a falling trend predicts none, and a value already past the target says so."""
    from analyses.sink_trend import crossing, power_fit

    x = [1e6 * 2**i for i in range(6)]
    y = [3e-5 * v**0.5 for v in x]  # 0.03 .. 0.17
    a, b = power_fit(x, y)
    assert a == pytest.approx(3e-5) and b == pytest.approx(0.5)
    assert crossing(x, y, 0.3) == f"{(0.3 / 3e-5) ** 2:.1e} tokens (x tokens^0.50)"
    assert crossing(x, y[::-1], 0.3).startswith("none: falling")
    assert crossing(x, y, 0.05) == f"reached ({max(y):.3f})"


def test_sink_trend_reads_the_sink_metric_a_run_logged(tmp_path):
    """Only eval rows with the sink metric make the table; with a nothing slot, its cost is shown as a ppl factor."""
    import json

    from analyses.sink_trend import trend_rows

    rows = [{"step": 10, "tokens": 1000, "train_loss": 5.0}]  # a log row: no eval, no sink metric
    for step, cost in ((20, 0.01), (40, 0.1), (80, 0.2)):
        rows.append(
            {"step": step, "tokens": step * 100, "val_loss": 4.0, "first_token_max": [0.01, 0.02],
             "first_token_uniform": 0.01, "sink_share": 0.0, "nothing_max": [0.1, 0.2], "nothing_cost": cost}
        )  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    table, summary = trend_rows(tmp_path)
    assert [r["step"] for r in table] == [20, 40, 80] and table[-1]["x uniform"] == "2.0"
    assert (
        table[-1]["cost without it"] == "0.200 (ppl x1.22)"
        and table[0]["first token, largest head per layer"] == "0.010 0.020"
    )
    assert set(summary) == {
        "run",
        "first-token share reaches 0.3",
        "nothing slot reaches 0.3",
        "its removal doubles ppl",
    }


def test_head_focus_measures_top_and_previous_token_weights_against_alibis_closed_form():
    """analyses/head_focus.py on ALiBi with zero query and key weights: the scores are the bias alone, so a query at
    i puts exp(-m d) / sum_{e <= i} exp(-m e) on the key d back; the top key is the query itself (d = 0), the
    previous token d = 1, averaged over queries 64..T-1."""

    from analyses.head_focus import MIN_KEYS, focus

    model = random_model("alibi")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.c_q.weight.zero_()
            block.attn.c_k.weight.zero_()
    T = 80
    layers = focus(model, torch.randint(0, 97, (2, T)))
    slopes = model.pe.slopes.double()
    i = torch.arange(MIN_KEYS, T, dtype=torch.float64)
    norm = (1 - torch.exp(-slopes[:, None] * (i + 1))) / (1 - torch.exp(-slopes[:, None]))  # geometric sums
    want_top, want_prev = (1 / norm).mean(1), (torch.exp(-slopes)[:, None] / norm).mean(1)
    for layer in layers:
        torch.testing.assert_close(torch.tensor(layer["top"], dtype=torch.float64), want_top, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.tensor(layer["prev"], dtype=torch.float64), want_prev, rtol=1e-5, atol=1e-6)
