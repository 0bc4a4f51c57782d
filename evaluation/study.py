"""The report of a study: the length evaluations compared (seeds grouped), every stream and passkey table, the plots.

python -m evaluation.study study          (the last step of `bash runs/study.sh`; reads study/*/eval/*.json)
Writes study/REPORT.md and study/eval/compare.{json,txt,png} (runs/extension.sh: ext/REPORT.md).
"""

import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path

import numpy as np

from evaluation import bootstrap, compare
from evaluation.doc_tables import ppl
from evaluation.passkey import passkey_table
from evaluation.report import label, made_by, markdown, model_label, read_result
from evaluation.stream import stream_table
from utils import files
from utils.errors import UserError, cli


def results(study: Path, kind: str) -> list[tuple[Path, dict]]:
    return [(p, read_result(p)) for p in sorted(study.glob(f"*/eval/{kind}.json"))]


def markdown_table(rows: list[dict], train_length: int) -> str:
    """The README's table of compare.compare's nonoverlapping rows, best at the training length first; ±sd only at the
    training length and the longest."""
    rows = [r for r in rows if r["mode"] == "nonoverlap"]
    lengths = sorted({r["length"] for r in rows})
    cells = {(label(r), r["length"]): r for r in rows}
    names = list(dict.fromkeys(label(r) for r in rows))
    at_train = {n: (cells.get((n, train_length)) or {}).get("ppl") for n in names}
    names.sort(key=lambda n: (at_train[n] is None, at_train[n] or 0.0))
    head = [f"**{n} (trained)**" if n == train_length else str(n) for n in lengths]
    if lengths[-1] > train_length:
        head[-1] += f" ({lengths[-1] / train_length:g}x)"
    body = [[n] + [ppl(cells.get((n, m)), sd=m in (train_length, lengths[-1])) for m in lengths] for n in names]
    return markdown(["scheme", *head], body)


def block_sums(result: dict, method: str) -> tuple[np.ndarray, np.ndarray]:
    """(summed NLL, tokens) of each block of a stream.json method: `block` tokens each, the last one the rest."""
    m, size = result["methods"][method], result["block"]
    tokens = np.full(len(m["nll"]), size, dtype=np.float64)
    tokens[-1] = m["tokens"] - size * (len(tokens) - 1)
    return np.asarray(m["nll"]) * tokens, tokens


def pooled_streams(streams: list[dict], group_of: dict) -> dict:
    """The streams of a group's seeds pooled: each method's perplexity with a 95% interval that resamples the stream's
    blocks and the seeds, and paired differences (the same blocks drawn) between two methods of a group (the same seeds
    drawn too) and between two groups for one method. Only groups with two seeds or more, on one stream."""
    by_group = defaultdict(list)
    for r in streams:
        by_group[group_of.get(r["checkpoint"], r["scheme"])].append(r)
    by_group = {g: rs for g, rs in by_group.items() if len(rs) > 1}
    if len({(r["stream_tokens"], r["block"], str(r.get("works"))) for rs in by_group.values() for r in rs}) > 1:
        raise UserError("the study's streams score different tokens; stream every run with one eval.stream_tokens")
    draws, scored, groups = {}, {}, {}
    for group, rs in by_group.items():
        groups[group] = {"runs": [r["checkpoint"] for r in rs], "methods": {}}
        for method in rs[0]["methods"]:
            full = [block_sums(r, method) for r in rs if r["methods"].get(method, {}).get("nll")]
            if len(full) < len(rs) or len({len(t) for _, t in full}) > 1:  # n/a or cut short in a seed: not pooled
                continue
            sums, tokens = np.stack([s for s, _ in full]), full[0][1]
            idx = bootstrap.block_draws(len(tokens), ["pooled stream", int(tokens.sum())])
            draws[group, method] = bootstrap.resample(sums, tokens, idx, run_key=group)
            scored[group, method] = int(tokens.sum())
            run_nll = sums.sum(axis=1) / tokens.sum()  # each seed's mean NLL over the stream
            groups[group]["methods"][method] = {
                "ppl": round(float(np.exp(run_nll.mean())), 4),
                "ci": bootstrap.ppl_interval(draws[group, method]),
                "ppl_runs": [round(float(np.exp(x)), 4) for x in run_nll],
            }
    pairs = [
        {"a": f"{a[0]}: {a[1]}", "b": f"{b[0]}: {b[1]}", **bootstrap.difference(draws[a], draws[b])}
        for a, b in combinations(draws, 2)
        if (a[0] == b[0] or a[1] == b[1]) and scored[a] == scored[b]
    ]
    return {"groups": groups, "pairs": pairs}


def pooled_table(pooled: dict) -> list[str]:
    methods = list(dict.fromkeys(m for g in pooled["groups"].values() for m in g["methods"]))
    body = [
        [f"{group} ({len(g['runs'])})"] + [ppl(g["methods"][m]) if m in g["methods"] else "-" for m in methods]
        for group, g in pooled["groups"].items()
    ]
    lines = [markdown(["group (seeds)", *methods], body)]
    lines += ["", "Paired differences in mean NLL, a - b [95% interval over blocks and seeds]:", ""]
    lines += [f"- {p['a']} - {p['b']}: {bootstrap.shown(p)}" for p in pooled["pairs"]]
    return lines


def report(study: Path) -> str:
    lengths = [r for _, r in results(study, "length")]
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
    pooled = pooled_streams([r for _, r in streams], group_of)
    if pooled["groups"]:
        files.write_json(study / "eval" / "streams.json", pooled)
        head = "Perplexity over the stream, mean over the seeds [95% interval over its blocks and the seeds]:"
        lines += ["", "### Seeds pooled (eval/streams.json)", "", head, "", *pooled_table(pooled), ""]
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
