"""The tables of README.md and docs/*.md, written from the JSON in results/ (and from positional/).

python -m evaluation.doc_tables            rewrite every table in README.md and docs/*.md
python -m evaluation.doc_tables --check    exit 1 and name each table that differs from what this script writes

A table sits between `<!-- table: <name> -->` and `<!-- /table -->` lines (<name>: a key of TABLES); the doc owns the
words around it. Which runs a table shows, and their names, are set here; the numbers never are, and tests/test_docs.py
fails when a table drifts from them.
"""

import argparse
import math
import re
import sys
import textwrap
from functools import cache, partial
from pathlib import Path

from data.tasks import TASKS
from evaluation import bootstrap
from evaluation.report import markdown
from utils.files import read_json, write_text
from utils.logger import read_log

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
MARKER = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


@cache
def load(path: str) -> dict:
    return read_json(RESULTS / path, fix="restore it from git (git checkout -- results/)")


def cells(study: str) -> dict:
    rows = load(f"{study}/eval/compare.json")["results"]
    return {(r["run_label"], r["variant"], r["length"], r["mode"]): r for r in rows}


def marked(value: str, mark: str) -> str:
    """**value** for the best of its column; any other mark (~: within the noise of it) follows the value."""
    return f"**{value}**" if mark == "*" else value + mark


def ppl(row: dict | None, sd: bool = True, digits: int = 1) -> str:
    """`ppl ±sd [lo, hi]` of a compare.json row or of a stream.json method's mean; sd=False leaves the ±sd out."""
    if row is None or row.get("ppl") is None:
        return "n/a"
    value = marked(f"{row['ppl']:.{digits}f}", row.get("mark", ""))
    spread = f" ±{row['ppl_sd']:.1f}" if sd and row.get("ppl_sd") is not None else ""
    ci = f" [{row['ci'][0]:.1f}, {row['ci'][1]:.1f}]" if row.get("ci") else ""
    return value + spread + ci


def scored(study: str) -> str:
    """What a study's cells rest on: seeds per row and held-out tokens per cell."""
    rows = load(f"{study}/eval/compare.json")["results"]
    n, tokens = sorted({r["runs"] for r in rows}), sorted({r["tokens"] for r in rows if r["ppl"] is not None})
    runs = f"{n[0]} seed{'s' * (n[0] > 1)}" if len(n) == 1 else f"{n[0]}-{n[-1]} seeds"
    return f"{runs} per row, {', '.join(f'{t:,}' for t in tokens)} held-out tokens per cell"


CORE = ["alibi", "t5", "sink", "rope", "learned", "nope", "sinusoidal"]  # the first study's schemes
BREADTH = {  # group label in results/study-breadth -> the name the docs give it
    **{label: label for label in ("fox", "pope", "fire", "shaw", "kerple", "alibi")},
    "rope [model.window=64, model.window_pattern=SSSL]": "rope, model.window=64 SSSL",
    **{label: label for label in ("xpos", "prope", "rope")},
    "rope/PPPN": "irope",
    "rope [positional.rotary_fraction=0.25]": "rope, rotary_fraction=0.25",
}
CONTENT = ["cope", "stickbreaking", "path", "fox", "alibi", "rope"]  # beside FoX (content gates) and the references
RELEASES = {  # 2025's: RoPE's slow pairs stilled (HoPE) or clipped (FoPE), the head gate, beside the references
    **{label: label for label in ("hope", "fope")},
    "rope [model.attn_gate=True]": "rope, model.attn_gate=true",
    **{label: label for label in ("rope", "alibi")},
}
QK_GAINS = {"rms": "gain-free QK-norm (the default)", "learned": "learned QK gains"}  # model.qk_norm -> its name
QK_NORM = {f"{s} [model.qk_norm={k}]": f"{s}, {name}" for s in ("rope", "alibi") for k, name in QK_GAINS.items()}
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


def length_table(study: str, rows: list | dict, lengths=(256, 1024, 4096), first: str = "scheme") -> str:
    """A row per seed group in rows, a column per length: compare.json's nonoverlapping windows."""
    names = rows if isinstance(rows, dict) else {label: label for label in rows}
    keys = [key if isinstance(key, tuple) else (key, "none") for key in names]
    table = cells(study)
    body, notes = [], set()
    for (label, variant), name in zip(keys, names.values(), strict=True):
        shown = [table.get((label, variant, n, "nonoverlap")) for n in lengths]
        body.append([name] + [ppl(row) for row in shown])
        notes |= {row["note"] for row in shown if row and row.get("note")}
    spread = "mean ±sd over the seeds " if max(r["runs"] for r in table.values()) > 1 else ""
    slid = sum((*key, lengths[0], "sliding") in table for key in keys)  # the rows that scored sliding windows too
    sliding = " and the sliding windows" if slid == len(keys) else " (no sliding windows: `eval.sliding=false`)"
    if 0 < slid < len(keys):
        sliding = f" and the sliding windows of {slid} of these rows (the others ran `eval.sliding=false`)"
    note = (
        f"Held-out perplexity, nonoverlapping windows, {spread}[95% bootstrap interval over the scored pieces"
        f"{' and the seeds' if spread else ''}]; {scored(study)}. {''.join(n + '. ' for n in sorted(notes))}**bold**: "
        "lowest in its column; ~: within the noise of it (the 95% interval of the paired bootstrap difference in mean "
        "NLL, the same pieces drawn for both, holds 0). "
        f"From `results/{study}/eval/compare.json`; every length{sliding}: "
        f"[results/{study}/REPORT.md](results/{study}/REPORT.md)."
    )
    head = [first] + [f"{n} ({n // 256}x{', trained' if n == 256 else ''})" for n in lengths]
    return markdown(head, body, note)


core = partial(length_table, "study", CORE)
breadth = partial(length_table, "study-breadth", BREADTH)
content = partial(length_table, "study-content", CONTENT)
releases = partial(length_table, "study-2025", RELEASES)
qk_norm = partial(length_table, "qk-norm", QK_NORM)
extension = partial(
    length_table, "extension", EXTENSION, (256, 512, 1024, 2048, 4096), "model (tiny RoPE base, seed 1)"
)

# where the scheme table finds each row
STUDIES = ("study", "study-breadth", "study-content", "study-presets", "study-2025")
ON_GRIDS = ("rope2d", "mrope")  # measured on data=grids alone (dev/LOG.md), not in a length study
# positional/base.py's hooks, in the order a forward meets them (what each gives: base.py)
HOOKS = ("embed", "prefix", "rotation", "rotate", "rotate_key", "rotated_dim", "score_bias", "layer_module")
HOOKS += ("content_bias", "content_weights", "fit_state")


def measured_in(label: str | None = None, tag: str | None = None) -> tuple[str, str] | None:
    """(study, group label) of the first study with a group of this label, or of runs of this preset tag (in folders
    <scheme>-<tag>-s<seed> or <tag>-s<seed>), or None."""
    for study in STUDIES:
        for g in load(f"{study}/eval/compare.json")["groups"]:
            run = re.sub(r"-s\d+$", "", Path(g["runs"][0]).parent.name)
            if g["label"] == label or tag and (run == tag or run.endswith(f"-{tag}")):
                return study, g["label"]


def scheme_rows() -> list[tuple[str, str, tuple[str, str] | None]]:
    """(`positional=` or the preset, what it does, where measured): the schemes, then the presets, by study."""
    import positional

    rows = [(n, positional.SCHEMES[n].about, measured_in(n)) for n in positional.names()]
    for path in sorted((ROOT / "configs").glob("*/*.yaml")):  # a preset: a YAML with a `# preset:` line
        if about := re.search(r"^# preset:(.*)", path.read_text(), re.M):
            pick = f"experiment={path.stem}" if path.parent.name == "experiment" else path.stem
            rows.append((pick, about[1].strip(), measured_in(tag=path.stem)))
    order = {s: i for i, s in enumerate(STUDIES)}
    return sorted(rows, key=lambda r: order.get(r[2] and r[2][0], len(STUDIES) + (r[0] not in ON_GRIDS)))


def schemes() -> str:
    rows, body = scheme_rows(), []
    for name, what, found in rows:
        measured = "on grids only" if name in ON_GRIDS else "not measured"
        if found:
            short, long = (cells(found[0]).get((found[1], "none", n, "nonoverlap")) for n in (256, 4096))
            measured = f"{short['ppl']:.1f} → " + (f"{long['ppl']:.1f}" if long and long["ppl"] else "n/a")
        body.append([f"`{name}`", what, measured])
    studies = [f"`results/{s}`" for s in dict.fromkeys(found[0] for *_, found in rows if found)]
    note = (
        "ppl: held-out perplexity of the tiny model trained at 256 tokens, scored at 256 and at 4096 (16x); the "
        f"mean over seeds, {scored('study')} ({', '.join(studies[:-1])} and {studies[-1]}: the same recipe, the "
        "same tokens). With intervals: [Results](#results) below and [docs/schemes.md](docs/schemes.md)."
    )
    return markdown(["`positional=` (or a preset)", "what it does", "ppl at 256 → 4096"], body, note, text_columns=2)


def hooks() -> str:
    """Each hook of positional/base.py with the schemes whose class gives its own (found, not listed)."""
    import positional
    from positional.base import Positional

    classes = [(n, positional.SCHEMES[n]) for n in positional.names()]
    givers = {h: [f"`{n}`" for n, c in classes if getattr(c, h) is not getattr(Positional, h)] for h in HOOKS}
    body = [[f"`{h}`", ", ".join(names)] for h, names in givers.items()]
    return markdown(["hook", "schemes that give their own"], body, text_columns=2)


def last_eval(run: str) -> dict:
    """The last row of results/<run>/metrics.jsonl that holds a val loss."""
    return [row for row in read_log(RESULTS / run / "metrics.jsonl") if row.get("val_loss") is not None][-1]


def streams() -> str:
    """The breadth study's seed-1 streams: each cache against dense attention, and the largest head on key 0."""
    groups = {run: g["label"] for g in load("study-breadth/eval/compare.json")["groups"] for run in g["runs"]}
    paths = sorted(RESULTS.glob("study-breadth/*/eval/stream.json"))
    found = {BREADTH[groups[r["checkpoint"]]]: r for r in (load(str(p.relative_to(RESULTS))) for p in paths)}
    body, tokens, uniform = [], set(), set()
    for name in (n for n in BREADTH.values() if n in found):
        result = found[name]
        methods = list(result["methods"].items())  # dense, window 0+W, sinks 1+(W-1), sinks 4+(W-4), recompute
        shown = methods[:2] + methods[3:]  # sinks 1+(W-1) is the sinks table's
        attention = result["first_token_attention"]
        body.append([name] + [ppl(m["mean"]) for _, m in shown] + [f"{max(attention['max_head']):.4f}"])
        tokens.add(result["stream_tokens"])
        uniform.add(attention["uniform"])
    note = (
        f"Perplexity over a stream of {', '.join(f'{t:,}' for t in tokens)} held-out tokens fed one at a time "
        "[95% bootstrap interval over its blocks of 256 tokens]; one seed per row. Key 0: the largest head's "
        f"mean attention on the stream's first token (a uniform share is {', '.join(map(str, uniform))}; a sink "
        "head, Gu et al. 2024, is above 0.3). From `results/study-breadth/*/eval/stream.json`."
    )
    return markdown(["run (seed 1)"] + [m for m, _ in shown] + ["key 0, largest head"], body, note)


SINK_RUNS = {  # results/sinks/<run> -> its row name
    "sinks": "learned sink token (`experiment=sinks`)",
    "sinks-rope": "no sink token, BOS first (`positional=rope`)",
    "sinks-nothing": "nothing slot (`positional=rope model.sink_logit=true`)",
    "sinks-nothing-rms": "nothing slot, gain-free QK-norm (`model.qk_norm=rms`)",
}


def sinks() -> str:
    """The sinks runs: stream perplexity per cache, what evicting the first token costs, and where attention parks."""
    body, steps, tokens = [], set(), set()
    for run, name in SINK_RUNS.items():
        result, logged = load(f"sinks/{run}/stream.json"), last_eval(f"sinks/{run}")
        steps.add(f"{logged['step']:,}")
        tokens.add(f"{result['stream_tokens']:,}")
        methods = result["methods"]
        window, one_sink = (next(m for m in methods if m.startswith(kind)) for kind in ("window", "sinks 1+"))
        pair = next(p for p in result["pairs"] if {p["a"], p["b"]} == {window, one_sink})
        evicting = bootstrap.shown(pair, 1 if pair["a"] == window else -1)  # window minus one sink: evicting key 0
        caches = [ppl(methods["dense"]["mean"])] + [ppl(methods[m]["mean"], digits=2) for m in (window, one_sink)]
        key0 = result["first_token_attention"]
        heads = ["-" if h is None else f"{max(h):.4f}" for h in (key0["max_head"], key0.get("nothing_max_head"))]
        cost = "-" if "nothing_cost" not in logged else f"x{math.exp(logged['nothing_cost']):.1f}"
        body.append([f"{name}, val loss {logged['val_loss']:.3f}", *caches, evicting, *heads, cost])
    note = (
        f"One seed per run, {', '.join(sorted(steps))} steps. Perplexity over a stream of {', '.join(tokens)} "
        "held-out tokens [95% bootstrap interval over its blocks of 256]; W is the training length (plus the "
        "learned sink token where there is one). Evicting key 0: window 0+W minus sinks 1+(W-1) in mean NLL "
        "[95% interval of the paired bootstrap over blocks]. Key 0 and nothing: the largest head's mean "
        "attention on the stream's first token (the learned sink token where there is one) and on the nothing "
        "slot. No slot: the perplexity factor when the slot is taken away (`train.sink_metric`, the last eval "
        "of `metrics.jsonl`). From `results/sinks/<run>/`."
    )
    head = ["run", "dense", "window 0+W", "sinks 1+(W-1)", "evicting key 0, nats", "key 0", "nothing", "no slot"]
    return markdown(head, body, note)


SINK_STUDY = {  # seed group in results/sinks-2025 -> its row name
    "rope": "RoPE, BOS first",
    "rope [model.attn_gate=True]": "RoPE + head gate (`model.attn_gate=true`)",
    "rope [model.sink_logit=True]": "RoPE + sink logit (`model.sink_logit=true`)",
}


def spread(values: list[float], digits: int) -> str:
    """The mean of a group's seeds and each seed's value."""
    return f"{sum(values) / len(values):.{digits}f} ({', '.join(f'{v:.{digits}f}' for v in values)})"


def sink_study() -> str:
    """The sinks preset at 3 seeds: each group's streams pooled over its seeds (evaluation/study.py), what a plain
    window costs against 4 sinks, the val loss and where layer 0's attention parks, seed by seed."""
    pooled, body = load("sinks-2025/eval/streams.json"), []
    for label, name in SINK_STUDY.items():
        group = pooled["groups"][label]
        runs = [Path(run).parent.name for run in group["runs"]]
        last = [last_eval(f"sinks-2025/{run}") for run in runs]
        key0 = [load(f"sinks-2025/{run}/eval/stream.json")["first_token_attention"] for run in runs]
        window, sinks4 = (next(m for m in group["methods"] if m.startswith(k)) for k in ("window", "sinks 4+"))
        pair = next(p for p in pooled["pairs"] if (p["a"], p["b"]) == (f"{label}: {window}", f"{label}: {sinks4}"))
        caches = [group["methods"][m] for m in ("dense", window, sinks4)]
        slot = [max(k["nothing_max_head"]) for k in key0 if "nothing_max_head" in k]
        cost = [row["nothing_cost"] for row in last if "nothing_cost" in row]
        values = [spread([row["val_loss"] for row in last], 3), *map(ppl, caches), bootstrap.shown(pair)]
        values += [spread([max(k["max_head"]) for k in key0], 3)] + [spread(v, 2) if v else "-" for v in (slot, cost)]
        body.append([f"{name} ({len(runs)})", *values])
    note = (
        "`experiment=sinks`, seeds 1, 2, 3 (the count after each name); val loss: the last eval's, the mean (each "
        "seed's). Perplexity over a stream of 12,800 held-out tokens, pooled over the seeds [95% interval over its "
        "blocks of 256 and the seeds]. Window - sinks: in mean NLL [paired over blocks and seeds]. Key 0: the largest "
        "head's mean attention on the stream's first token (uniform 0.0054; a sink head: above 0.3); slot: on the sink "
        "logit's slot; without it: the nats lost when the slot is taken away (the last eval). Every pair: "
        "[results/sinks-2025/REPORT.md](results/sinks-2025/REPORT.md)."
    )
    head = ["run (seeds)", "val loss", "dense", "window 0+256", "sinks 4+252", "window - sinks, nats", "key 0"]
    return markdown(head + ["slot", "without it, nats"], body, note)


PASSKEY = [  # evaluation/passkey.py's files under results/extension, in the order shown
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
    results = [load(f"extension/{path}") for path in PASSKEY]
    lengths, depths = results[0]["lengths"], results[0]["depths"]
    body, wilson = [], {}
    for result in results:
        gains = "QK gains" if result["qk_norm"] == "learned" else "gain-free"
        name = f"{MODELS[result['scheme']]} ({result['train_length']}), {gains}, {result['step']:,} steps"
        if (result.get("variant") or "none") != "none":  # an extension set at eval time on the first row's model
            window = next((r["window"] for r in result["results"] if r.get("window")), None)
            name = f"+ {VARIANTS[result['variant']]}" + (f" (w {window})" if window else "") + ", training-free"
        by_cell = {(r["length"], r["depth"]): r["accuracy"] for r in result["results"]}
        body.append([name] + [" / ".join(accuracy(by_cell[n, d]) for d in result["depths"]) for n in lengths])
        wilson |= {(r["correct"], r["trials"]): r["ci"] for r in result["results"]}
    ends = [f"{c}/{n}: [{wilson[c, n][0]:.2f}, {wilson[c, n][1]:.2f}]" for c, n in sorted(wilson) if c in (0, n)]
    trials = ", ".join(map(str, sorted({r["trials"] for r in results})))
    digits = ", ".join(map(str, sorted({r["key_digits"] for r in results})))
    note = (
        f"Passkey accuracy at depths {' / '.join(f'{d:g}' for d in depths)} (0: the key first, 1: just before the "
        f"question), {trials} trials per cell, {digits}-digit keys, teacher-forced greedy; a `+` row scores the first "
        "row's model with an extension set at eval time (factor = length / 256). Wilson 95% intervals over a cell's "
        f"trials, e.g. {'; '.join(ends)}; every cell's in [results/extension/REPORT.md](results/extension/REPORT.md). "
        "From `results/extension/<run>/eval/passkey*.json`."
    )
    return markdown(["model (trained at), fine-tune"] + [str(n) for n in lengths], body, note)


def task_cell(c: dict | None) -> str:
    if c is None:
        return "n/a"
    sd = f" ±{c['sd']:.2f}" if c["sd"] else ""  # the sd over seeds, where they differ
    return marked(accuracy(round(c["accuracy"], 2)), c["mark"]) + sd


def tasks(folder: str = "tasks") -> str:
    """Exact match per scheme at each task's longest training length, 2x and 8x it: the mean over seeds ±sd."""
    by_task = load(f"{folder}/eval/tasks.json")["cells"]
    # each task's longest training length (where a scheme must be right first), 2x and 8x it
    columns = [(task, k, k * TASKS[task].train[1]) for task in by_task for k in (1, 2, 8)]
    head = ["scheme"] + [f"{task} {n}" + (f" ({k}x)" if k > 1 else "") for task, k, n in columns]
    labels = dict.fromkeys(label for groups in by_task.values() for label in groups)
    shown = {label: [by_task[task].get(label, {}).get(str(n)) for task, _, n in columns] for label in labels}
    rests = {(len(c["seeds"]), c["samples"], c["trials"]) for row in shown.values() for c in row if c is not None}
    seeds = "-".join(map(str, sorted({s for s, _, _ in rests})))
    per_seed = ", ".join(map(str, sorted({trials // s for s, _, trials in rests})))
    if all(n * s == t for s, n, t in rests):
        samples = f"all on the same {per_seed} held-out samples"
    else:
        samples = f"each on {per_seed} held-out samples of its own"
    note = (
        f"Exact match ([results/{folder}/REPORT.md](results/{folder}/REPORT.md)), the mean of {seeds} seeds ±sd, "
        f"{samples}; n/a: past a learned table; **bold**: highest; ~: no paired difference from it detected."
    )
    return markdown(head, [[label] + [task_cell(c) for c in row] for label, row in shown.items()], note)


TABLES = {"schemes": schemes, "hooks": hooks, "core": core, "breadth": breadth, "content": content, "qk-norm": qk_norm}
TABLES |= {"2025": releases, "tasks-2025": partial(tasks, "tasks-2025")}
TABLES |= {"extension": extension, "passkey": passkey, "streams": streams, "sinks": sinks, "tasks": tasks}
TABLES |= {"sinks-2025": sink_study}


@cache
def table(name: str, depth: int) -> str:
    """The lines of the table called name, its links written for a doc `depth` folders below the repository root."""
    if name not in TABLES:
        raise SystemExit(f"error: <!-- table: {name} --> names no table; pick one of {', '.join(TABLES)}")
    text = re.sub(r"\]\((?!https?:|#)", "](" + "../" * depth, TABLES[name]())  # links are written from the root
    wrap = dict(width=120, break_long_words=False, break_on_hyphens=False)
    return "".join((line if line.startswith("|") else textwrap.fill(line, **wrap)) + "\n" for line in text.split("\n"))


def fill(text: str, depth: int) -> str:
    """text with every table between markers written anew."""
    return MARKER.sub(lambda m: m[1] + table(m["name"], depth) + m[4], text)


def docs(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    ap = argparse.ArgumentParser(description="Write the tables of README.md and docs/*.md from results/.")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table differs")
    args = ap.parse_args(argv)
    found, failed = set(), False
    for path in docs(root):
        text, depth, doc = path.read_text(), len(path.relative_to(root).parts) - 1, path.relative_to(root)
        found |= {m["name"] for m in MARKER.finditer(text)}
        stale = [m["name"] for m in MARKER.finditer(text) if m["body"] != table(m["name"], depth)]
        if args.check:
            for name in stale:
                print(f"{doc}: table {name} differs from results/ (python -m evaluation.doc_tables)")
            failed |= bool(stale)
        elif stale:
            write_text(path, fill(text, depth))
            print(f"written {doc}")
    for name in TABLES.keys() - found:
        print(f"table {name} is in no doc: place <!-- table: {name} --> <!-- /table --> in one, or drop it here")
        failed = True
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
