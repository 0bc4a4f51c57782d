"""A benchmark's rows as a markdown table, printed and appended to bench/RESULTS.md with the command and device.

Used by bench/train_bench.py and bench/decode_bench.py.
"""

import shlex
import sys
import time
from pathlib import Path

import torch


def fmt(v) -> str:
    """A table cell: floats with thousands separators from 100 up, two decimals below."""
    if isinstance(v, float):
        return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"
    return str(v)


def publish(rows: list[dict], fmt, title: str, details: str, device: torch.device, record: bool):
    """Print `rows` (one dict per row) as a table under a note naming the command, device and torch version;
    with record, append both to bench/RESULTS.md under `title`."""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in head) + " |" for r in rows]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    note = f"`python {shlex.join(sys.argv)}` on {device_name}, torch {torch.__version__}, {details}"
    table = "\n".join(lines)
    print(f"\n{note}\n\n{table}")
    if record:
        with open(Path(__file__).with_name("RESULTS.md"), "a") as f:
            f.write(f"\n### {title} ({time.strftime('%Y-%m-%d')})\n{note}\n\n{table}\n")
