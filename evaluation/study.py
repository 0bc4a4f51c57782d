"""The report of a study: every run's length evaluation compared (seeds grouped), every stream table, the plots.

python -m evaluation.study study          (the last step of `bash runs/study.sh`; reads study/*/eval/*.json)
Writes study/REPORT.md and study/eval/compare.{json,txt,png}. Rows whose difference from the best lies inside the
paired bootstrap's 95% interval are marked (evaluation/compare.py); read only what survives them.
"""

import json
import sys
from pathlib import Path

from evaluation import compare
from evaluation.stream import stream_table


def stream_results(study: Path) -> list[tuple[Path, dict]]:
    return [(p, json.loads(p.read_text())) for p in sorted(study.glob("*/eval/stream.json"))]


def report(study: Path) -> str:
    lengths = [json.loads(p.read_text()) for p in sorted(study.glob("*/eval/length.json"))]
    if not lengths:
        raise SystemExit(f"error: no */eval/length.json under {study}; run bash runs/study.sh first")
    table = compare.compare(lengths, study / "eval")
    seeds = {r.get("train_config", {}).get("seed") for r in lengths}
    lines = [
        f"# Study: {study.name}",
        "",
        f"{len(lengths)} runs ({len(seeds)} seed{'s' * (len(seeds) > 1)} per scheme where all finished), "
        "evaluated on held-out plays with 95% bootstrap intervals over scored pieces (and over seeds).",
        "",
        "## Perplexity by evaluation length",
        "",
        "```",
        table,
        "```",
        "",
        "![perplexity by length](eval/compare.png)",
        "",
        "## Streaming",
    ]
    for path, result in stream_results(study):
        rel = path.parent.relative_to(study)
        lines += ["", f"### {result['scheme']} ({rel.parent})", "", "```", stream_table(result), "```", ""]
        if (path.parent / "stream.png").exists():
            lines.append(f"![stream {result['scheme']}]({rel}/stream.png)")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m evaluation.study <study folder>")
    study = Path(argv[0])
    (study / "REPORT.md").write_text(report(study))
    print(f"written {study}/REPORT.md and {study}/eval/compare.{{json,txt,png}}")


if __name__ == "__main__":
    main(sys.argv[1:])
