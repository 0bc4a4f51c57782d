"""Evaluation results as text: labels, the length table, and the files every evaluation writes and reads back.

python eval.py checkpoint=out/rope                      -> out/rope/eval/length.{json,png}
python eval.py sweep_dir=multirun/2026-11-22_10-00-00   -> <sweep_dir>/eval/compare.{json,txt,png}
"""

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from utils import files


def trained_scaling(model_config: dict) -> str | None:
    """'yarn x4 from 256' for a model fine-tuned with positional.scaling (built into it), else None."""
    pos = model_config["positional"]
    if pos.get("scaling", "none") == "none":
        return None
    return f"{pos['scaling']} x{float(pos['scaling_factor']):g} from {pos['original_length']}"


def scheme_label(ckpt: dict) -> str:
    """The scheme as its checkpoint defines it, for every report: rope, rope/PPPN (iRoPE, whose module is rope),
    rope[yarn x4 from 256] (fine-tuned with a scaling), rope[at 1024 from 256] (fine-tuned longer, unscaled),
    nope[dropped rope] (DroPE)."""
    pos, init = ckpt["model_config"]["positional"], ckpt.get("init_from") or {}
    name = pos["name"]
    if "N" in str(pos.get("layers", "")) and name != "nope":
        name += f"/{pos['layers']}"
    trained = f"dropped {init['dropped']}" if init.get("dropped") else trained_scaling(ckpt["model_config"])
    if not trained and init and init.get("seq_len") != ckpt.get("seq_len"):  # fine-tuned longer, unscaled
        trained = f"at {ckpt['seq_len']} from {init['seq_len']}"
    return f"{name}[{trained}]" if trained else name


def label(row: dict) -> str:
    name = row.get("run_label", row["scheme"])
    return name if row.get("variant", "none") == "none" else f"{name}+{row['variant']}"


def _num(x: float) -> str:
    return f"{x:.1f}" if x < 1e4 else f"{x:.1e}"


def fmt_ppl(row: dict) -> str:
    """`ppl [lo, hi]` (the 95% interval); a group of seeds adds `±sd` of its runs' perplexities."""
    if row.get("ppl") is None:
        return "n/a"
    spread = f"±{_num(row['ppl_sd'])}" if row.get("ppl_sd") is not None else ""
    ci = f" [{_num(row['ci'][0])}, {_num(row['ci'][1])}]" if row.get("ci") else ""
    return f"{_num(row['ppl'])}{spread}{ci}{row.get('mark', '')}"


def table(rows: list[dict], lengths: list[int], title: str, same_text: bool = True) -> str:
    """One line per (scheme + variant, mode), one column per length; n/a cells explained underneath. same_text: whether
    every row scored the same pieces (runs trained at different lengths score different ones)."""
    names = list(dict.fromkeys(label(r) for r in rows))
    keys = sorted({(label(r), r["mode"]) for r in rows}, key=lambda k: (names.index(k[0]), k[1]))
    cells = {(label(r), r["mode"], r["length"]): fmt_ppl(r) for r in rows}
    cells |= {("scheme", "mode", n): str(n) for n in lengths}  # the header line
    width = max([len(k[0]) for k in keys] + [6])
    col = max(len(c) for c in cells.values()) + 2
    lines = [title]
    for name, mode in [("scheme", "mode"), *keys]:
        line = "".join(f"{cells.get((name, mode, n), '-'):>{col}}" for n in lengths)
        lines.append(f"{name:<{width}}  {mode:<10}{line}")
    counts = {r["tokens"] for r in rows if r.get("tokens")}
    if counts and not same_text:
        lines.append("the runs scored different held-out pieces (trained at different lengths): rows are not paired")
    elif len(counts) == 1:
        lines.append(f"every cell scored the same {counts.pop():,} held-out tokens")
    elif counts:
        per_cell = ", ".join(f"{label(r)}/{r['mode']}/{r['length']}={r['tokens']:,}" for r in rows if r.get("tokens"))
        lines.append(f"tokens scored per cell: {per_cell}")
    if any(r.get("ci") for r in rows):
        lines.append("[lo, hi]: 95% bootstrap interval over the scored pieces (evaluation/bootstrap.py)")
    lines += sorted({r["note"] for r in rows if r.get("note")})
    return "\n".join(lines)


def binned(by_position, count, min_samples: int = 32) -> list[tuple[int, float]]:
    """Mean NLL by position as (first position, mean) log-spaced bins, each widened until it averages at least
    min_samples tokens, so a long window scored a few times still gives a readable curve."""
    out, lo, n = [], 0, len(by_position)
    while lo < n:
        hi = max(lo + 1, int(lo * 1.15))
        while hi < n and count[lo:hi].sum() < min_samples:
            hi += max(1, (hi - lo) // 2)
        hi = min(hi, n)
        if count[lo:hi].sum() > 0:
            out.append((lo, float(by_position[lo:hi].sum() / count[lo:hi].sum())))
        lo = hi
    return out


FULL = "_full"  # a row's suffix under eval.full_layers: its scaling on the full-attention layers alone


def model_label(result: dict) -> str:
    """The scheme, an eval-time extension, a non-default QK-norm: rope + rerope (w 128), rope + dca (S 192, w 32),
    rope (qk_norm=learned)."""
    variant, qk_norm = result.get("variant", "none"), result.get("qk_norm", "rms")
    first = next((r for r in result["results"] if r.get("window")), {})
    sizes = ", ".join(f"{k} {first[key]}" for k, key in (("S", "chunk"), ("w", "window")) if first.get(key))
    extension = "" if variant == "none" else f" + {variant}" + (f" ({sizes})" if sizes else "")
    return result["scheme"] + extension + ("" if qk_norm == "rms" else f" (qk_norm={qk_norm})")


RUN_RESULT = {"checkpoint": str, "scheme": str, "results": list}  # what the comparisons read of a run's result
RESULT = {"length": RUN_RESULT, "tasks": RUN_RESULT, "grids": RUN_RESULT}
STREAM = {"checkpoint": str, "scheme": str, "stream_tokens": int, "block": int, "methods": dict}  # what reports read
RESULT |= {"passkey": {"scheme": str, "results": list}, "stream": STREAM}


def write_result(out_dir: Path, stem: str, result: dict, draw=None, text: str | None = None) -> Path:
    """Write <stem>.json, and <stem>.txt and <stem>.png (draw(path=...)) where given, into out_dir, each whole or not at
    all, the JSON last; an earlier, different result of the same name is kept (keep_earlier)."""
    path, content = out_dir / f"{stem}.json", json.dumps(result, indent=1)
    kept = keep_earlier(path, content)
    try:
        if draw is not None:
            draw(path=path.with_suffix(".png"))
        if text is not None:
            files.write_text(path.with_suffix(".txt"), text + "\n")
        files.write_text(path, content)
    except OSError as e:
        raise files.cannot_write(e, path) from None
    written = ["json"] + ["txt"] * (text is not None) + ["png"] * (draw is not None)
    took = f" ({result['seconds']} s)" if "seconds" in result else ""
    print(f"written {out_dir}/{stem}.{{{','.join(written)}}}{took}{kept}", flush=True)
    return path


def made_by(folder: Path) -> list[str]:
    """A report's lines quoting <folder>/commands.txt, where the runs/*.sh script that made the folder appended each
    call with its variables; none without one."""
    record = folder / "commands.txt"
    if not record.exists():
        return []
    head = "Made by (`commands.txt`, each call of the script that wrote this folder):"
    return [head, "", "```bash", *record.read_text().splitlines(), "```", ""]


def timeless(d: dict) -> dict:
    """A result's dict without its timings and memory, which differ from run to run."""
    return {k: v for k, v in d.items() if k not in ("seconds", "peak_memory_mb")}


def same_result(path: Path, content: str) -> bool:
    """Whether path holds this result, timings and memory aside; one that cannot be read is another."""
    try:
        return json.loads(path.read_text(), object_hook=timeless) == json.loads(content, object_hook=timeless)
    except (OSError, ValueError):
        return False


def keep_earlier(path: Path, content: str) -> str:
    """Before a result replaces a different one of the same name, link the earlier one's files into
    <folder>/earlier/<stem>-<its time>.*, so no result is lost; returns the words that say so, or ''."""
    if not path.exists() or same_result(path, content):
        return ""
    when = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(path.stat().st_mtime))
    earlier = path.parent / "earlier"
    earlier.mkdir(exist_ok=True)
    for old in sorted(path.parent.glob(f"{path.stem}.*")):
        target = earlier / f"{path.stem}-{when}{old.suffix}"
        try:
            os.link(old, target)  # a second name: the next write replaces only the first
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links
            shutil.copy2(old, target)
    return f"; the earlier result is kept as {earlier}/{path.stem}-{when}.*"


def read_result(path) -> dict:
    """A result write_result wrote, checked as it is read: one line naming the file and the command that writes it again
    when it is cut short, empty or lacks what its readers read (RESULT)."""
    path = Path(path)  # runs/common.sh passes a str
    mode = path.stem.split("-")[0]  # passkey-<variant>.json: a passkey result
    run = path.parent.parent if path.parent.name == "eval" else "<run>"
    fix = f"delete it and evaluate again (python eval.py checkpoint={run} eval.mode={mode})"
    return files.read_json(path, RESULT.get(mode, RESULT["length"]), fix, f"a {mode} result")


def markdown(head: list[str], body: list[list[str]], note: str = "", text_columns: int = 1) -> str:
    """A markdown table, the first text_columns columns aligned left and the numbers right, then its note."""
    rule = ["---"] * text_columns + ["---:"] * (len(head) - text_columns)
    lines = ["| " + " | ".join(row) + " |" for row in [head, rule, *body]]
    return "\n".join(lines + ["", note] if note else lines)


def rows_markdown(rows: list[dict], fmt=str) -> str:
    """rows (dicts; their keys in first-seen order are the columns) as a markdown table; a missing cell is '-'."""
    head = list(dict.fromkeys(k for r in rows for k in r))
    return markdown(head, [[fmt(r[k]) if k in r else "-" for k in head] for r in rows], text_columns=len(head))


def show_table(rows: list[dict], title: str, note: str, json_path: Path | None = None):
    """Print rows as a markdown table under its title and note; with json_path, also write {title, note, command, rows}
    there, so a table can be kept as evidence in results/. A cell a row lacks is "-" in both."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    rows = [{k: r.get(k, "-") for k in columns} for r in rows]
    print(f"\n{title}: {note}\n\n{rows_markdown(rows)}")
    if json_path is not None:
        result = {"title": title, "note": note, "command": shlex.join(["python", *sys.argv]), "rows": rows}
        write_result(Path(json_path).parent, Path(json_path).stem, result)
