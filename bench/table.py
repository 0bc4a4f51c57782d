"""A benchmark's rows as a markdown table, printed, and recorded in bench/RESULTS.md with the command and device.

python bench/cpu_bench.py      python bench/train_bench.py      python bench/decode_bench.py      (--no-record: print)
A recorded run replaces its benchmark's latest table in bench/RESULTS.md and adds a row to the history table
there, so the file holds one current figure per benchmark.
"""

import shlex
import sys
import time
from pathlib import Path

import torch

from evaluation.report import rows_markdown
from utils.files import write_text

RESULTS = Path(__file__).with_name("RESULTS.md")
HISTORY_END = "<!-- /history -->"


def fmt(v) -> str:
    """A table cell: floats with thousands separators from 100 up, two decimals below."""
    if isinstance(v, float):
        return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"
    return str(v)


def publish(rows: list[dict], fmt, details: str, device: torch.device, record: bool, path: Path = RESULTS, figure=None):
    """Print rows as a table under a note naming the command, device and torch version; with record, write it to
    bench/RESULTS.md, the history row giving each row's first column and its column `figure` (default the last)."""
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    note = f"`python {shlex.join(sys.argv)}` on {device_name}, torch {torch.__version__}, {details}"
    table = rows_markdown(rows, fmt)
    print(f"\n{note}\n\n{table}")
    if record:
        summary = "; ".join(f"{fmt(list(r.values())[0])} {fmt(r.get(figure, list(r.values())[-1]))}" for r in rows)
        write_text(path, recorded(path.read_text(), Path(sys.argv[0]).stem, note, table, summary))


def show(row: dict, fmt):
    """One row as key=value words, as it is measured."""
    print("  ".join(f"{k}={fmt(v)}" for k, v in row.items()), flush=True)


def graph_count() -> int:
    """Graphs torch.compile has made so far: more while timing means a recompile was timed."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def sync(device: torch.device):
    """Wait for the device's queued work, so a clock read after it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def print_profile(run, device: torch.device, rows: int = 25):
    """Where run()'s time goes: its ops by self time on the device (the GPU's kernels on CUDA), by input shape, then by
    self CPU time (the host's share: launches, Python). Printed only, never recorded: a profile is no figure."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        run()
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages(group_by_input_shape=True).table(sort_by=key, row_limit=rows, max_name_column_width=50))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=50))


def recorded(text: str, name: str, note: str, table: str, summary: str) -> str:
    """RESULTS.md's text with benchmark `name`'s latest block replaced (or appended) and a history row added."""
    start, end = f"<!-- latest: {name} -->", "<!-- /latest -->"
    block = f"{start}\n{note}\n\n{table}\n{end}"
    if start in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + f"\n\n### {name}\n{block}\n"
    row = f"| {time.strftime('%Y-%m-%d')} | {name} | {summary} | recorded run |\n"
    return text.replace(HISTORY_END, row + HISTORY_END) if HISTORY_END in text else text
