"""How sharp a model's attention heads are: per layer, the largest mean top weight and previous-token share.

python analyses/head_focus.py study/rope-s1 study/alibi-s1 study/rope-qkl-s1 out/sinks-rope [--windows 8] [--json F]
A head that copies (the previous-token half of an induction head, a passkey retrieval) puts most of a query's weight
on one key. Under gain-free QK-norm (model.qk_norm=rms) no logit passes sqrt(head dim): ALiBi's bias acts outside that
cap, but a RoPE head aims at an offset only through the few pairs that turn fast enough (dev/LOG.md, the QK-norm cap).
"""

import argparse
from pathlib import Path

import numpy as np
import torch

from evaluation.heldout import held_out_works
from evaluation.report import scheme_label, show_table
from evaluation.sink_mass import attention_probs
from utils import checkpoint

MIN_KEYS = 64  # queries with fewer keys visible concentrate by having few: left out


def windows(ckpt: dict, n: int) -> torch.Tensor:
    """n windows of the training length, spread evenly over the held-out works end to end."""
    stream = np.concatenate([doc for _, doc in held_out_works(ckpt, allow_prepare=False)])
    starts = np.linspace(0, len(stream) - ckpt["seq_len"], n).astype(int)
    return torch.from_numpy(np.stack([stream[s : s + ckpt["seq_len"]] for s in starts]).astype(np.int64))


@torch.no_grad()
def focus(model, idx: torch.Tensor) -> list[dict]:
    """Per layer: each head's mean top weight and previous-token share, over queries with MIN_KEYS keys."""
    rows = []
    for p in attention_probs(model, idx):
        top = p[:, :, MIN_KEYS:].max(-1).values.mean((0, 2))
        prev = torch.diagonal(p, -1, -2, -1)[:, :, MIN_KEYS - 1 :].mean((0, 2))  # query i's weight on key i - 1
        rows.append({"top": top.tolist(), "prev": prev.tolist()})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders or checkpoint files")
    ap.add_argument("--windows", type=int, default=8, help="windows of the training length per run")
    ap.add_argument("--json", type=Path, help="also write the table (and this command) to this JSON file")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    table = []
    for run in args.runs:
        model, ckpt = checkpoint.load_model(run)
        qk_norm = ckpt["model_config"].get("qk_norm", "rms")
        row = {"run": run, "scheme": scheme_label(ckpt), "qk_norm": qk_norm, "step": ckpt["step"]}
        for i, layer in enumerate(focus(model, windows(ckpt, args.windows))):
            row[f"L{i} top / prev"] = f"{max(layer['top']):.2f} / {max(layer['prev']):.2f}"
        table.append(row)
    details = "CPU fp32; per layer: the largest head's mean top weight / the largest head's mean previous-token share"
    details += f", over queries with >= {MIN_KEYS} keys in {args.windows} held-out windows of the training length"
    show_table(table, "Head focus: how sharp each layer's heads are", details, args.json)  # "-": no such layer


if __name__ == "__main__":
    main()
