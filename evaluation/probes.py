"""Probes: what a training run measures at each evaluation beside the validation loss.

python train.py experiment=sinks                        (train.sink_metric=true attaches SinkProbe)
python train.py train.sink_metric=true model.sink_logit=true
train(cfg, out_dir, probes=[my_probe])                  (any other probe, attached from outside the loop)
A probe is called as probe(model, rows, rt) on every rank (FSDP gathers the weights in the forward) with the raw
model, held-out rows and the runtime; it returns metrics that train.py merges into metrics.jsonl, and an optional
describe(metrics) says what the progress line shows.
"""

import torch

from evaluation.sink_mass import nothing_cost, rows_first_token_attention


class SinkProbe:
    """train.sink_metric: attention on the first token of n_rows held-out rows, per layer's largest head, and the share
    of sink heads (evaluation/sink_mass.py); with model.sink_logit=true also the nothing slot's share and cost. The rows
    open as the training rows do (BOS first under data.bos_aligned): a sink forms on the token that opens every row."""

    n_rows = 16

    @torch.no_grad()
    def __call__(self, model, rows, rt) -> dict:
        x, y = rows.batch(0, self.n_rows, rt.device)
        model.eval()
        sink = rows_first_token_attention(model, x)
        metrics = {
            "sink_share": sink["sink_share_all"],
            "first_token_max": sink["max_head"],
            "first_token_uniform": sink["uniform"],
        }
        if model.cfg.sink_logit:
            metrics.update(nothing_max=sink["nothing_max_head"], nothing_share=sink["nothing_share_all"])
            metrics["nothing_cost"] = round(nothing_cost(model, x, y), 5)  # nats per token lost without the slot
        model.train()
        return metrics

    @staticmethod
    def describe(m: dict) -> str:
        text = f"sink heads {m['sink_share']:.2f} first-token max {max(m['first_token_max']):.3f}"
        if "nothing_max" in m:
            text += f" nothing max {max(m['nothing_max']):.3f} cost {m['nothing_cost']:.4f}"
        return text


def describe(metrics: dict) -> str:
    """A probe's numbers as the progress line shows them when the probe does not say."""
    return " ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, int | float))


def measure(probes: list, model, rows, rt) -> tuple[dict, str]:
    """Every probe's metrics merged into one dict, and the text the progress line shows of them."""
    merged, text = {}, []
    for probe in probes:
        got = probe(model, rows, rt)
        merged.update(got)
        text.append(probe.describe(got) if hasattr(probe, "describe") else describe(got))
    return merged, " ".join(t for t in text if t)
