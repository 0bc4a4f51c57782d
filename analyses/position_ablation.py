"""How much a trained model uses its positions: held-out loss with the true ids, with every token at position 0,
and with the ids of each row shuffled.

python analyses/position_ablation.py study/learned-s1 study/sinusoidal-s1 study/nope-s1 study/rope-s1
The causal mask reads the token order, not the ids, so "all at 0" leaves a model what NoPE has: a scheme whose loss
barely moves has learned nothing from its positions.
"""

import argparse
from pathlib import Path

import torch

from data.loader import RowSampler, TokenSplit
from evaluation.heldout import held_out_folder
from evaluation.report import scheme_label, show_table
from utils.checkpoint import load_model

ROWS = 32  # rows per batch, as train.py's default validation batches


@torch.no_grad()
def val_loss(model, rows: RowSampler, batches: int, ids) -> float:
    """Mean loss over the first `batches` validation batches, at positions ids(T)."""
    total = 0.0
    for b in range(batches):
        x, y = rows.batch(b * ROWS, ROWS, "cpu")
        total += model(x, y, pos=ids(x.size(1))).item()
    return total / batches


def ablate(run: str, batches: int, seed: int) -> dict:
    model, ckpt = load_model(run)
    rows = RowSampler(TokenSplit(held_out_folder(ckpt, allow_prepare=False), "val"), ckpt["seq_len"], 0)
    gen = torch.Generator().manual_seed(seed)
    loss = lambda ids: val_loss(model, rows, batches, ids)
    true = loss(torch.arange)
    zero = loss(lambda T: torch.zeros(T, dtype=torch.long))
    shuffled = loss(lambda T: torch.randperm(T, generator=gen))
    row = {"run": run, "scheme": scheme_label(ckpt), "val loss": f"{true:.4f}"}
    row["all at 0"] = f"{zero:.4f} ({zero - true:+.4f})"
    row["shuffled"] = f"{shuffled:.4f} ({shuffled - true:+.4f})"
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders or checkpoint files")
    ap.add_argument("--batches", type=int, default=8, help="validation batches of 32 rows (train.py's default)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the shuffles")
    ap.add_argument("--json", type=Path, help="also write the table (and this command) to this JSON file")
    args = ap.parse_args()
    rows = [ablate(run, args.batches, args.seed) for run in args.runs]
    details = f"{args.batches} x {ROWS} validation rows at each run's training length, shuffle seed {args.seed}"
    show_table(rows, "Position ablation: held-out loss without the positions", details, args.json)


if __name__ == "__main__":
    main()
