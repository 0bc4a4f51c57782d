"""The report of a study: the length evaluations compared (seeds grouped), every stream and passkey table, the plots.

python -m evaluation.study study          (the last step of `bash runs/study.sh`; reads study/*/eval/*.json)
Writes study/REPORT.md and study/eval/compare.{json,txt,png} (runs/extension.sh: ext/REPORT.md).
"""

import sys
from pathlib import Path

from evaluation import compare
from evaluation.passkey import passkey_table
from evaluation.report import label, made_by, model_label, read_result
from evaluation.stream import stream_table
from utils import files
from utils.errors import UserError, cli


def results(study: Path, kind: str) -> list[tuple[Path, dict]]:
    return [(p, read_result(p)) for p in sorted(study.glob(f"*/eval/{kind}.json"))]


def markdown_table(rows: list[dict], train_length: int, mode: str = "nonoverlap") -> str:
    """The README's table of compare.compare's rows, best at the training length first; ±sd only at the training length
    and the longest."""
    rows = [r for r in rows if r["mode"] == mode]
    lengths = sorted({r["length"] for r in rows})
    cells = {(label(r), r["length"]): r for r in rows}
    names = list(dict.fromkeys(label(r) for r in rows))
    at_train = {n: (cells.get((n, train_length)) or {}).get("ppl") for n in names}
    names.sort(key=lambda n: (at_train[n] is None, at_train[n] or 0.0))

    def cell(r: dict | None, length: int) -> str:
        if r is None or r.get("ppl") is None:
            return "n/a"
        ppl = f"**{r['ppl']:.1f}**" if r.get("mark") == "*" else f"{r['ppl']:.1f}" + r.get("mark", "")
        sd = f" ±{r['ppl_sd']:.1f}" if r.get("ppl_sd") is not None and length in (train_length, lengths[-1]) else ""
        ci = f" [{r['ci'][0]:.1f}, {r['ci'][1]:.1f}]" if r.get("ci") else ""
        return ppl + sd + ci

    head = [f"**{n} (trained)**" if n == train_length else str(n) for n in lengths]
    if lengths[-1] > train_length:
        head[-1] += f" ({lengths[-1] / train_length:g}x)"
    lines = ["| scheme | " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(lengths)]
    lines += [f"| {n} | " + " | ".join(cell(cells.get((n, m)), m) for m in lengths) + " |" for n in names]
    return "\n".join(lines)


def report(study: Path) -> str:
    lengths = [read_result(p) for p in sorted(study.glob("*/eval/length.json"))]
    if not lengths:
        raise UserError(f"no */eval/length.json under {study}; run bash runs/study.sh first")
    streams = results(study, "stream")  # all read and checked before anything is written
    passkeys = sorted(
        results(study, "passkey") + results(study, "passkey-*"), key=lambda pr: (pr[0].parent, pr[0].stem)
    )
    table = compare.compare(lengths, study / "eval")
    kept = files.read_json(study / "eval" / "compare.json", {"groups": list, "results": list})
    group_of = {run: g["label"] for g in kept["groups"] for run in g["runs"]}
    sizes = sorted({len(g["seeds"]) for g in kept["groups"]})
    seeds = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    lines = [
        f"# Study: {study.name}",
        "",
        f"{len(lengths)} runs in {len(kept['groups'])} groups of {seeds} seed{'s' * (sizes[-1] > 1)}, "
        "evaluated on held-out plays with 95% bootstrap intervals over scored pieces (and over seeds).",
        "",
        *made_by(study),
        "## Perplexity by evaluation length",
        "",
        "```",
        table,
        "```",
        "",
        "![perplexity by length](eval/compare.png)",
        "",
        "Nonoverlapping windows, mean ±sd over the seeds [95% interval]; **bold**: lowest in its column, ~: within",
        "noise of it (the text table's marks):",
        "",
        markdown_table(kept["results"], lengths[0]["train_length"]),
        "",
        "## Streaming",
    ]
    for path, result in streams:
        rel = path.parent.relative_to(study)
        name = group_of.get(result.get("checkpoint"), result["scheme"])
        lines += ["", f"### {name} ({rel.parent})", "", "```", stream_table(result), "```", ""]
        if (path.parent / "stream.png").exists():
            lines.append(f"![stream {name}]({rel}/stream.png)")
    if passkeys:
        lines += ["", "## Passkey retrieval"]
    for path, result in passkeys:  # passkey fine-tunes have no length.json
        rel = path.parent.relative_to(study)
        lines += ["", f"### {model_label(result)} ({rel.parent})", "", "```", passkey_table(result), "```", ""]
        if path.with_suffix(".png").exists():
            lines.append(f"![passkey {model_label(result)}]({rel}/{path.stem}.png)")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m evaluation.study <study folder>")
    study = Path(argv[0])
    files.write_text(study / "REPORT.md", report(study))
    print(f"written {study}/REPORT.md")


if __name__ == "__main__":
    cli(lambda: main(sys.argv[1:]))
