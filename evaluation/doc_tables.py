"""The tables of README.md and docs/*.md that come from results/ (written from the JSON stored there) or positional/.

python -m evaluation.doc_tables            rewrite every table in README.md and docs/*.md
python -m evaluation.doc_tables --check    exit 1 and name each table that differs from what this script writes
A table sits between `<!-- table: <name> -->` and `<!-- /table -->` lines (<name>: a key of TABLES); the lines
between them are written here, the words around them belong to the doc. Which runs a table shows, and their names,
are set here; the numbers never are. tests/test_docs.py fails when a doc's table differs from what this writes, so a
table cannot drift from its evidence.
"""

import argparse
import math
import re
import sys
import textwrap
from functools import cache
from pathlib import Path

from data.tasks import TASKS
from utils.files import read_json, write_text
from utils.logger import read_log

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
MARKER = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


@cache
def load(path: str) -> dict:
    return read_json(RESULTS / path, fix="restore it from git (git checkout -- results/)")


def cells(study: str) -> dict:
    """compare.json's rows by (group label, variant, length, mode)."""
    rows = load(f"{study}/eval/compare.json")["results"]
    return {(r["run_label"], r["variant"], r["length"], r["mode"]): r for r in rows}


def ppl(row: dict | None) -> str:
    """`ppl ±sd [lo, hi]`; **bold**: the lowest of its column, `~`: within the paired noise of it (compare.json)."""
    if row is None or row.get("ppl") is None:
        return "n/a"
    value = f"{row['ppl']:.1f}"
    value = f"**{value}**" if row.get("mark") == "*" else value + row.get("mark", "")
    spread = f" ±{row['ppl_sd']:.1f}" if row.get("ppl_sd") is not None else ""
    return f"{value}{spread} [{row['ci'][0]:.1f}, {row['ci'][1]:.1f}]"


def markdown(head: list[str], rows: list[list[str]], text_columns: int = 1) -> list[str]:
    """A markdown table: the first text_columns columns aligned left, the numbers right."""
    rule = "| " + " | ".join(["---"] * text_columns + ["---:"] * (len(head) - text_columns)) + " |"
    return ["| " + " | ".join(head) + " |", rule] + ["| " + " | ".join(r) + " |" for r in rows]


def seeds(study: str) -> list[int]:
    """The distinct numbers of seeds behind a study's rows."""
    return sorted({r["runs"] for r in load(f"{study}/eval/compare.json")["results"]})


def scored(study: str) -> str:
    """What a study's cells rest on, read from its rows: seeds per row and held-out tokens per cell."""
    rows = load(f"{study}/eval/compare.json")["results"]
    n, tokens = seeds(study), sorted({r["tokens"] for r in rows if r["ppl"] is not None})
    runs = f"{n[0]} seed{'s' * (n[0] > 1)}" if len(n) == 1 else f"{n[0]}-{n[-1]} seeds"
    return f"{runs} per row, {', '.join(f'{t:,}' for t in tokens)} held-out tokens per cell"


MARKS = (
    "**bold**: lowest in its column; ~: within the noise of it (the 95% interval of the paired bootstrap difference "
    "in mean NLL, the same pieces drawn for both, holds 0)"
)

# --- the length tables: seed groups of evaluation/compare.py, nonoverlapping windows ---------------------------

CORE = ["alibi", "t5", "sink", "rope", "learned", "nope", "sinusoidal"]  # the first study's schemes
BREADTH = {  # group label in results/study-breadth -> the name the docs give it
    "fox": "fox",
    "pope": "pope",
    "fire": "fire",
    "shaw": "shaw",
    "kerple": "kerple",
    "alibi": "alibi",
    "rope [model.window=64, model.window_pattern=SSSL]": "rope, model.window=64 SSSL",
    "xpos": "xpos",
    "prope": "prope",
    "rope": "rope",
    "rope/PPPN": "irope",
    "rope [positional.rotary_fraction=0.25]": "rope, rotary_fraction=0.25",
}
CONTENT = ["cope", "stickbreaking", "path", "fox", "alibi", "rope"]  # beside FoX (content gates) and the references
QK_NORM = {
    "rope [model.qk_norm=rms]": "rope, gain-free QK-norm (the default)",
    "rope [model.qk_norm=learned]": "rope, learned QK gains",
    "alibi [model.qk_norm=rms]": "alibi, gain-free QK-norm (the default)",
    "alibi [model.qk_norm=learned]": "alibi, learned QK gains",
}
EXTENSION = {  # (group label, variant) in results/extension -> its row name
    ("rope", "none"): "RoPE base, as trained",
    ("rope", "linear"): "training-free PI (linear)",
    ("rope", "ntk"): "training-free NTK",
    ("rope", "dynamic_ntk"): "training-free dynamic NTK",
    ("rope", "yarn"): "training-free YaRN",
    ("rope", "longrope"): "training-free LongRoPE (searched)",
    ("rope", "rerope"): "training-free ReRoPE (w 128)",
    ("rope", "leaky_rerope"): "training-free Leaky ReRoPE",
    ("rope", "log"): "training-free log-length scaling",
    ("rope[yarn x4 from 256]", "none"): "YaRN x4, fine-tuned at 1024",
    ("rope[linear x4 from 256]", "none"): "PI x4, fine-tuned at 1024",
    ("rope[at 1024 from 256]", "none"): "no scaling, fine-tuned at 1024",
    ("nope[dropped rope]", "none"): "DroPE (RoPE dropped, 60 steps at 256)",
    ("nope[dropped rope]", "log"): "DroPE + log-length scaling",
    ("nope", "none"): "NoPE from scratch (340 steps)",
}


def length_table(study: str, rows: dict, lengths: list[int], first: str = "scheme", train: int = 256) -> str:
    """A row per (label, variant) of rows, a column per length: `ppl ±sd [lo, hi]`."""
    table = cells(study)
    head = [first] + [f"{n} ({n // train}x{', trained' if n == train else ''})" for n in lengths]
    body, notes, keys = [], set(), [key if isinstance(key, tuple) else (key, "none") for key in rows]
    for (label, variant), name in zip(keys, rows.values(), strict=True):
        shown = [table.get((label, variant, n, "nonoverlap")) for n in lengths]
        body.append([name] + [ppl(row) for row in shown])
        notes |= {row["note"] for row in shown if row and row.get("note")}
    spread = "mean ±sd over the seeds " if max(seeds(study)) > 1 else ""
    slid = sum((label, variant, lengths[0], "sliding") in table for label, variant in keys)  # rows that scored them
    sliding = " and the sliding windows" if slid == len(keys) else " (no sliding windows: `eval.sliding=false`)"
    if 0 < slid < len(keys):
        sliding = f" and the sliding windows of {slid} of these rows (the others ran `eval.sliding=false`)"
    return "\n".join(
        markdown(head, body)
        + [
            "",
            f"Held-out perplexity, nonoverlapping windows, {spread}[95% bootstrap interval over the scored pieces"
            f"{' and the seeds' if spread else ''}]; {scored(study)}. {''.join(n + '. ' for n in sorted(notes))}"
            f"{MARKS}. "
            f"From `results/{study}/eval/compare.json`; every length{sliding}: "
            f"[results/{study}/REPORT.md](results/{study}/REPORT.md).",
        ]
    )


def core() -> str:
    return length_table("study", {name: name for name in CORE}, [256, 1024, 4096])


def breadth() -> str:
    return length_table("study-breadth", BREADTH, [256, 1024, 4096])


def content() -> str:
    return length_table("study-content", {name: name for name in CONTENT}, [256, 1024, 4096])


def qk_norm() -> str:
    return length_table("qk-norm", QK_NORM, [256, 1024, 4096])


def extension() -> str:
    return length_table("extension", EXTENSION, [256, 512, 1024, 2048, 4096], first="model (tiny RoPE base, seed 1)")


# --- the README's scheme table ----------------------------------------------------------------------------------

STUDIES = ("study", "study-breadth", "study-content", "study-presets")  # where the scheme table finds each row
ON_GRIDS = ("rope2d", "mrope")  # measured on data=grids alone (dev/LOG.md), not in a length study


def presets() -> list[tuple[str, str, str]]:
    """(how it is picked, what it does, its tag): every YAML of configs/ with a `# preset:` line, which says what it
    does; a study's runs of it sit in folders named <scheme>-<tag>-s<seed> (runs/study.sh TAG=) or <tag>-s<seed>."""
    found = []
    for path in sorted((ROOT / "configs").glob("*/*.yaml")):
        about = [line[len("# preset:") :].strip() for line in path.read_text().splitlines() if "# preset:" in line]
        if about:
            pick = f"experiment={path.stem}" if path.parent.name == "experiment" else path.stem
            found.append((pick, about[0], path.stem))
    return found


def measured_in(label: str | None = None, tag: str | None = None) -> tuple[str, str] | None:
    """(the first study whose comparison holds a group of this label, or of runs of this preset tag, the group's
    label), or None."""
    for study in STUDIES:
        for g in load(f"{study}/eval/compare.json")["groups"]:
            run = re.sub(r"-s\d+$", "", Path(g["runs"][0]).parent.name)
            if g["label"] == label or tag and (run == tag or run.endswith(f"-{tag}")):
                return study, g["label"]
    return None


def scheme_rows() -> list[tuple[str, str, tuple[str, str] | None]]:
    """(`positional=` or the preset, what it does, the study that measured it): every scheme of positional/, then the
    presets, in the order of the studies that measured them."""
    import positional

    rows = [(n, positional.SCHEMES[n].about, measured_in(n)) for n in positional.names()]
    rows += [(pick, about, measured_in(tag=tag)) for pick, about, tag in presets()]
    order = {s: i for i, s in enumerate(STUDIES)}
    return sorted(rows, key=lambda r: order.get(r[2] and r[2][0], len(STUDIES) + (r[0] not in ON_GRIDS)))


def schemes() -> str:
    head = ["`positional=` (or a preset)", "what it does", "ppl at 256 → 4096"]
    body = []
    for name, what, found in scheme_rows():
        if found is None:
            measured = "on grids only" if name in ON_GRIDS else "not measured"
        else:
            study, label = found
            table = cells(study)
            short, long = (table.get((label, "none", n, "nonoverlap")) for n in (256, 4096))
            measured = f"{short['ppl']:.1f} → " + (f"{long['ppl']:.1f}" if long and long["ppl"] else "n/a")
        body.append([f"`{name}`", what, measured])
    studies = [f"`results/{s}`" for s in dict.fromkeys(found[0] for *_, found in scheme_rows() if found)]
    return "\n".join(
        markdown(head, body, text_columns=2)
        + [
            "",
            "ppl: held-out perplexity of the tiny model trained at 256 tokens, scored at 256 and at 4096 (16x); the "
            f"mean over seeds, {scored('study')} ({', '.join(studies[:-1])} and {studies[-1]}: the same recipe, the "
            "same tokens). With intervals: [Results](#results) below and [docs/schemes.md](docs/schemes.md).",
        ]
    )


HOOKS = (  # positional/base.py's hooks, in the order a forward meets them (what each gives: base.py)
    *("embed", "prefix", "rotation", "rotate", "rotate_key", "rotated_dim", "score_bias", "layer_module"),
    *("content_bias", "content_weights", "fit_state"),
)


def hooks() -> str:
    """Each hook of positional/base.py with the schemes whose class gives its own (found, not listed)."""
    import positional
    from positional.base import Positional

    classes = {n: positional.SCHEMES[n] for n in positional.names()}
    givers = {h: [n for n, c in classes.items() if getattr(c, h) is not getattr(Positional, h)] for h in HOOKS}
    body = [[f"`{h}`", ", ".join(f"`{n}`" for n in names)] for h, names in givers.items()]
    return "\n".join(markdown(["hook", "schemes that give their own"], body, text_columns=2))


# --- streams: evaluation/stream.py's stream.json ------------------------------------------------------------------


def stream_cell(method: dict, digits: int = 1) -> str:
    if method["mean"]["ppl"] is None:
        return "n/a"
    lo, hi = method["mean"]["ci"]
    return f"{method['mean']['ppl']:.{digits}f} [{lo:.1f}, {hi:.1f}]"


def streams() -> str:
    """The breadth study's seed-1 streams: each cache against dense attention, and the largest head on key 0."""
    groups = {run: g["label"] for g in load("study-breadth/eval/compare.json")["groups"] for run in g["runs"]}
    found = {}
    for path in sorted(RESULTS.glob("study-breadth/*/eval/stream.json")):
        result = load(str(path.relative_to(RESULTS)))
        found[BREADTH[groups[result["checkpoint"]]]] = result
    body, tokens, uniform = [], set(), set()
    for name in (n for n in BREADTH.values() if n in found):
        result = found[name]
        methods = list(result["methods"].values())  # dense, window 0+W, sinks 1+(W-1), sinks 4+(W-4), recompute
        attention = result["first_token_attention"]
        body.append(
            [name] + [stream_cell(m) for m in methods[:2] + methods[3:]] + [f"{max(attention['max_head']):.4f}"]
        )
        tokens.add(result["stream_tokens"])
        uniform.add(attention["uniform"])
    first = next(iter(found.values()))["methods"]
    head = ["run (seed 1)"] + [m for i, m in enumerate(first) if i != 2] + ["key 0, largest head"]
    return "\n".join(
        markdown(head, body)
        + [
            "",
            f"Perplexity over a stream of {', '.join(f'{t:,}' for t in tokens)} held-out tokens fed one at a time "
            "[95% bootstrap interval over its blocks of 256 tokens]; one seed per row. Key 0: the largest head's "
            f"mean attention on the stream's first token (a uniform share is {', '.join(map(str, uniform))}; a sink "
            "head, Gu et al. 2024, is above 0.3). From `results/study-breadth/*/eval/stream.json`.",
        ]
    )


SINK_RUNS = {  # results/sinks/<run> -> its row name
    "sinks": "learned sink token (`experiment=sinks`)",
    "sinks-rope": "no sink token, BOS first (`positional=rope`)",
    "sinks-nothing": "nothing slot (`positional=rope model.sink_logit=true`)",
    "sinks-nothing-rms": "nothing slot, gain-free QK-norm (`model.qk_norm=rms`)",
}


def last_eval(run: str) -> dict:
    """The last line of a run's metrics.jsonl that holds a validation loss."""
    return [row for row in read_log(RESULTS / "sinks" / run / "metrics.jsonl") if row.get("val_loss") is not None][-1]


def sinks() -> str:
    """The sinks runs: stream perplexity per cache, what evicting the first token costs, and where attention parks."""
    body, steps, tokens = [], set(), set()
    for run, name in SINK_RUNS.items():
        result, logged = load(f"sinks/{run}/stream.json"), last_eval(run)
        steps.add(f"{logged['step']:,}")
        tokens.add(f"{result['stream_tokens']:,}")
        methods = result["methods"]
        window, one_sink = (next(m for m in methods if m.startswith(kind)) for kind in ("window", "sinks 1+"))
        pair = next(p for p in result["pairs"] if {p["a"], p["b"]} == {window, one_sink})
        sign = 1 if pair["a"] == window else -1  # window minus one sink: what evicting the first token costs
        lo, hi = sorted((sign * pair["lo"], sign * pair["hi"]))
        attention = result["first_token_attention"]
        nothing = attention.get("nothing_max_head")
        body.append(
            [
                f"{name}, val loss {logged['val_loss']:.3f}",
                stream_cell(methods["dense"]),
                stream_cell(methods[window], 2),
                stream_cell(methods[one_sink], 2),
                f"{sign * pair['diff_nll']:+.4f} [{lo:+.4f}, {hi:+.4f}]",
                f"{max(attention['max_head']):.4f}",
                "-" if nothing is None else f"{max(nothing):.4f}",
                "-" if "nothing_cost" not in logged else f"x{math.exp(logged['nothing_cost']):.1f}",
            ]
        )
    head = ["run", "dense", "window 0+W", "sinks 1+(W-1)", "evicting key 0, nats", "key 0", "nothing", "no slot"]
    return "\n".join(
        markdown(head, body)
        + [
            "",
            f"One seed per run, {', '.join(sorted(steps))} steps. Perplexity over a stream of {', '.join(tokens)} "
            "held-out tokens [95% bootstrap interval over its blocks of 256]; W is the training length (plus the "
            "learned sink token where there is one). Evicting key 0: window 0+W minus sinks 1+(W-1) in mean NLL "
            "[95% interval of the paired bootstrap over blocks]. Key 0 and nothing: the largest head's mean "
            "attention on the stream's first token (the learned sink token where there is one) and on the nothing "
            "slot. No slot: the perplexity factor when the slot is taken away (`train.sink_metric`, the last eval "
            "of `metrics.jsonl`). From `results/sinks/<run>/`.",
        ]
    )


# --- passkey: evaluation/passkey.py's passkey.json ----------------------------------------------------------------

PASSKEY = [  # files under results/extension, in the order shown
    *(f"rope-passkey/eval/passkey{v}.json" for v in ("", "-rerope", "-leaky_rerope", "-yarn", "-ntk")),
    *(f"{run}/eval/passkey.json" for run in ("rope-passkey-600", "rope-passkey-rms", "rope-yarn4-passkey")),
    *(f"{run}/eval/passkey.json" for run in ("rope-yarn4-passkey-1200", "alibi-passkey", "alibi-passkey-rms")),
    *(f"{run}/eval/passkey.json" for run in ("drope-passkey", "drope-passkey-rms", "nope-passkey", "nope-passkey-rms")),
]
MODELS = {"rope": "RoPE", "alibi": "ALiBi", "nope": "NoPE", "nope[dropped rope]": "DroPE"}
MODELS["rope[yarn x4 from 256]"] = "RoPE + YaRN x4"
VARIANTS = {"rerope": "ReRoPE", "leaky_rerope": "Leaky ReRoPE", "yarn": "YaRN", "ntk": "NTK"}


def accuracy(a: float | None) -> str:
    return "n/a" if a is None else f"{a:g}" if a in (0, 1) else f"{a:.2f}"


def passkey() -> str:
    lengths = load(f"extension/{PASSKEY[0]}")["lengths"]
    body, trials, digits, wilson = [], set(), set(), {}
    for path in PASSKEY:
        result = load(f"extension/{path}")
        variant = result.get("variant") or "none"
        gains = "QK gains" if result["qk_norm"] == "learned" else "gain-free"
        name = f"{MODELS[result['scheme']]} ({result['train_length']}), {gains}, {result['step']:,} steps"
        if variant != "none":
            window = next((r["window"] for r in result["results"] if r.get("window")), None)
            name = f"+ {VARIANTS[variant]}" + (f" (w {window})" if window else "") + ", training-free"
        by_cell = {(r["length"], r["depth"]): r for r in result["results"]}
        row = [name]
        for n in lengths:
            row.append(" / ".join(accuracy(by_cell[(n, d)]["accuracy"]) for d in result["depths"]))
        body.append(row)
        trials.add(result["trials"])
        digits.add(result["key_digits"])
        for r in result["results"]:
            wilson[(r["correct"], r["trials"])] = r["ci"]
    ends = [f"{c}/{n}: [{wilson[(c, n)][0]:.2f}, {wilson[(c, n)][1]:.2f}]" for c, n in sorted(wilson) if c in (0, n)]
    depths = " / ".join(f"{d:g}" for d in load(f"extension/{PASSKEY[0]}")["depths"])
    counts = f"{', '.join(map(str, sorted(trials)))} trials per cell, {', '.join(map(str, sorted(digits)))}-digit keys"
    return "\n".join(
        markdown(["model (trained at), fine-tune"] + [str(n) for n in lengths], body)
        + [
            "",
            f"Passkey accuracy at depths {depths} (0: the key first, 1: just before the question), {counts}, "
            "teacher-forced greedy; a `+` row scores the first row's model with an extension set at eval time "
            "(factor = length / 256). Wilson 95% intervals over a cell's trials, e.g. "
            f"{'; '.join(ends)}; every cell's in [results/extension/REPORT.md](results/extension/REPORT.md). From "
            "`results/extension/<run>/eval/passkey*.json`.",
        ]
    )


def tasks() -> str:
    """The task battery's headline: per scheme, exact match at each task's longest training length, 2x and 8x it, the
    mean over seeds with its sd and marks."""
    summary = load("tasks/eval/tasks.json")
    by_task = summary["cells"]
    head, columns = ["scheme"], []
    for task in by_task:
        first = TASKS[task].train[1]  # the longest training length, where a scheme must be right first
        for n in (first, 2 * first, 8 * first):
            head.append(f"{task} {n}" + ("" if n == first else f" ({n // first}x)"))
            columns.append((task, str(n)))
    labels = list(dict.fromkeys(label for groups in by_task.values() for label in groups))
    body, rests = [], set()
    for label in labels:
        row = [label]
        for task, n in columns:
            c = by_task[task].get(label, {}).get(n)
            if c is None:
                row.append("n/a")
                continue
            value = accuracy(round(c["accuracy"], 2))
            value = f"**{value}**" if c["mark"] == "*" else value + c["mark"]
            row.append(value + (f" ±{c['sd']:.2f}" if c["sd"] else ""))  # the sd over seeds, where they differ
            rests.add((len(c["seeds"]), c["samples"], c["trials"]))
        body.append(row)
    seeds = "-".join(map(str, sorted({s for s, _, _ in rests})))
    per_seed = ", ".join(map(str, sorted({trials // s for s, _, trials in rests})))
    shared = all(n * s == t for s, n, t in rests)
    shared = (
        f"all on the same {per_seed} held-out samples" if shared else f"each on {per_seed} held-out samples of its own"
    )
    return "\n".join(
        markdown(head, body)
        + [
            "",
            f"Exact match ([results/tasks/REPORT.md](results/tasks/REPORT.md)), the mean of {seeds} seeds ±sd, {shared}"
            "; n/a: past a learned table; **bold**: highest; ~: no paired difference from it detected.",
        ]
    )


TABLES = {
    "schemes": schemes,
    "hooks": hooks,
    "core": core,
    "breadth": breadth,
    "content": content,
    "qk-norm": qk_norm,
    "extension": extension,
    "passkey": passkey,
    "streams": streams,
    "sinks": sinks,
    "tasks": tasks,
}


@cache
def table(name: str, depth: int) -> str:
    """The table called name, its links written for a doc `depth` folders below the repository root."""
    if name not in TABLES:
        raise SystemExit(f"error: <!-- table: {name} --> names no table; pick one of {', '.join(TABLES)}")
    text = re.sub(r"\]\((?!https?:|#)", "](" + "../" * depth, TABLES[name]())  # links are written from the root
    wrap = dict(width=120, break_long_words=False, break_on_hyphens=False)
    return "\n".join(line if line.startswith("|") else textwrap.fill(line, **wrap) for line in text.split("\n"))


def fill(text: str, depth: int = 0) -> str:
    """text with every table between markers written anew."""
    return MARKER.sub(lambda m: m[1] + table(m["name"], depth) + "\n" + m[4], text)


def stale(text: str, depth: int = 0) -> list[str]:
    """The names of the tables in text that differ from what this script writes."""
    return [m["name"] for m in MARKER.finditer(text) if m["body"] != table(m["name"], depth) + "\n"]


def docs(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    ap = argparse.ArgumentParser(description="Write the tables of README.md and docs/*.md from results/.")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table differs")
    args = ap.parse_args(argv)
    found, failed = set(), False
    for path in docs(root):
        text, depth = path.read_text(), len(path.relative_to(root).parts) - 1
        found |= {m["name"] for m in MARKER.finditer(text)}
        if args.check:
            for name in stale(text, depth):
                print(f"{path.relative_to(root)}: table {name} differs from results/ (python -m evaluation.doc_tables)")
                failed = True
        elif fill(text, depth) != text:
            write_text(path, fill(text, depth))
            print(f"written {path.relative_to(root)}")
    for name in TABLES.keys() - found:
        print(f"table {name} is in no doc: place <!-- table: {name} --> <!-- /table --> in one, or drop it here")
        failed = True
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
