"""Many runs in one table and plot: runs that differ only in seed are one row, differences within noise are marked.

python train.py -m seed=1,2,3 positional=rope,alibi && python eval.py sweep_dir=multirun/<time>
python eval.py -m checkpoint=out/rope,out/alibi         -> the same comparison in the eval sweep folder
Writes compare.{json,txt,png}. Runs are grouped by their training config less IGNORED, plus the step and the text
scored; a run saved before an option existed lacks its key and matches a run at that option's off value (OFF) only.
Each column's lowest perplexity is marked `*`, and `~` marks every row whose paired bootstrap difference from it has
a 95% interval holding 0: not distinguishable from the best on this text and these seeds.
"""

import json
from functools import partial
from itertools import combinations
from pathlib import Path

import numpy as np

from evaluation import bootstrap, plots, report

IGNORED = (  # where and how a run was logged or stored, never what it learned
    "seed out_dir device compile logger data.cache_dir train.resume train.overwrite train.log_interval "
    "train.eval_interval train.eval_batches train.ckpt_interval train.sample_tokens train.time_limit_min"
).split()


def flatten(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    return {k: v for key, sub in tree.items() for k, v in flatten(sub, f"{prefix}{key}.").items()}


def run_config(result: dict) -> dict:
    """The flattened training config that defines a run's group (its checkpoint path where none is recorded)."""
    if "train_config" not in result:
        return {"checkpoint": result["checkpoint"]}
    flat = flatten(result["train_config"])
    kept = {k: v for k, v in flat.items() if not any(k == i or k.startswith(i + ".") for i in IGNORED)}
    return {**kept, "step": result.get("step"), "pieces": result.get("pieces")}


OFF = (None, False, "none", 0, 1.0)  # an option's value when off: what a run saved before the option had


def agree(a: dict, b: dict, key: str) -> bool:
    """Equal values for key, where a key only one config has (a run saved before the option) matches at OFF only."""
    if key in a and key in b:
        return a[key] == b[key]
    value = a.get(key, b.get(key))
    return any(type(value) is type(off) and value == off for off in OFF)


def same_run(a: dict, b: dict) -> bool:
    return all(agree(a, b, k) for k in a.keys() | b.keys())


def group_runs(results: list[dict]) -> list[dict]:
    """Groups of runs with the same run_config, in first-seen order, each labelled by its scheme and, where groups share
    a scheme, the config values that set it apart from a strict majority of them (a baseline reads `rope`, its variants
    `rope [model.window=64]`)."""
    groups = []
    for res in results:
        config = run_config(res)
        group = next((g for g in groups if same_run(g["config"], config)), None)
        if group is None:
            groups.append({"config": config, "runs": [res]})
        else:
            group["config"] = {**group["config"], **config}  # the newest keys, for the label
            group["runs"].append(res)
    for g in groups:
        config, scheme = g["config"], g["runs"][0]["scheme"]
        twins = [h["config"] for h in groups if h["runs"][0]["scheme"] == scheme]
        differ = [
            k for k in sorted(config) if k != "pieces" and 2 * sum(agree(config, h, k) for h in twins) <= len(twins)
        ]
        g["key"] = json.dumps(config, sort_keys=True, default=str)
        g["scheme"] = scheme
        g["seeds"] = [r.get("train_config", {}).get("seed") for r in g["runs"]]
        g["label"] = scheme + (" [" + ", ".join(f"{k}={config[k]}" for k in differ) + "]" if differ else "")
    return groups


def cell_of(row: dict) -> tuple:
    return row["variant"], row["length"], row["mode"]


def aggregate(group: dict, cell: tuple) -> tuple[dict, np.ndarray | None]:
    """A group's row for one cell, and its bootstrap draws of mean NLL (None for an n/a cell)."""
    cells = [next(r for r in res["results"] if cell_of(r) == cell) for res in group["runs"]]
    first = cells[0]
    row = {k: first[k] for k in ("scheme", "variant", "length", "mode", "stride", "tokens", "note") if k in first}
    row.update(run_label=group["label"], runs=len(cells), seeds=group["seeds"])
    if any(c.get("ppl") is None for c in cells):
        return {**row, "ppl": None, "nll": None}, None
    nll = float(np.mean([c["nll"] for c in cells]))
    row.update(nll=nll, ppl=float(np.exp(nll)), ppl_runs=[c["ppl"] for c in cells])
    row["ppl_sd"] = float(np.std(row["ppl_runs"], ddof=1)) if len(cells) > 1 else None
    if any("piece_nll" not in c for c in cells):  # a length.json from before the intervals
        return row, None
    pieces = group["runs"][0]["pieces"]
    tokens = np.array([p["tokens"] for p in pieces], dtype=np.float64)
    block_nll = np.array([c["piece_nll"] for c in cells]) * tokens  # (runs, pieces) summed NLL
    idx = bootstrap.block_draws(len(pieces), [[p["work"], p["start"], p["tokens"]] for p in pieces])
    draws = bootstrap.resample(block_nll, tokens, idx, run_key=[group["key"], *cell])
    row["ci"] = bootstrap.ppl_interval(draws)
    row["piece_nll"] = [round(float(x), 6) for x in block_nll.mean(axis=0) / tokens]
    return row, draws


def difference(rows: list[dict], draws: list[np.ndarray], i: int, j: int) -> dict:
    """Rows scored on the same pieces share their block draws, so their difference is paired (runs trained at
    different lengths score different pieces)."""
    return {**bootstrap.difference(draws[i], draws[j]), "paired": rows[i]["pieces_key"] == rows[j]["pieces_key"]}


def mark_noise(rows: list[dict], draws: list[np.ndarray | None]) -> list[dict]:
    """Mark each column's best row `*` and the rows within noise of it `~` (vs_best); return every pair's difference."""
    pairs, columns = [], {}
    for i, row in enumerate(rows):
        if draws[i] is not None:
            columns.setdefault((row["length"], row["mode"]), []).append(i)
    for (length, mode), idx in columns.items():
        best = min(idx, key=lambda i: rows[i]["ppl"])
        rows[best]["mark"] = "*"
        for i in (i for i in idx if i != best):
            rows[i]["vs_best"] = {"best": report.label(rows[best]), **difference(rows, draws, i, best)}
            rows[i]["mark"] = "~" if rows[i]["vs_best"]["within_noise"] else ""
        for i, j in combinations(idx, 2):
            pair = {"a": report.label(rows[i]), "b": report.label(rows[j]), "length": length, "mode": mode}
            pairs.append({**pair, **difference(rows, draws, i, j)})
    return pairs


def compare(results: list[dict], out_dir: Path) -> str:
    """One table and one plot over many length.json results: a row per group of seeds, scheme and variant."""
    if not results:
        raise ValueError("no eval results to compare")
    groups = group_runs(results)
    cells = list(dict.fromkeys(cell_of(r) for res in results for r in res["results"]))
    rows, draws = [], []
    for g in groups:
        # the cells every run of the group scored (one seed may hold sliding windows its others skipped)
        have = set.intersection(*({cell_of(r) for r in run["results"]} for run in g["runs"]))
        for cell in (c for c in cells if c in have):
            row, d = aggregate(g, cell)
            row["pieces_key"] = json.dumps(g["runs"][0].get("pieces"))
            rows.append(row)
            draws.append(d)
    pairs = mark_noise(rows, draws)
    same_text = len({row.pop("pieces_key") for row in rows}) <= 1
    lengths = sorted({r["length"] for r in rows})
    train_lengths = sorted({res["train_length"] for res in results})
    title = f"perplexity by evaluation length (trained at {', '.join(map(str, train_lengths))})"
    text = report.table(rows, lengths, title, same_text) + "\n" + legend(groups, same_text)
    summary = [{"label": g["label"], "seeds": g["seeds"], "runs": [r["checkpoint"] for r in g["runs"]]} for g in groups]
    result = {"runs": [res["checkpoint"] for res in results], "groups": summary, "results": rows, "pairs": pairs}
    report.write_result(out_dir, "compare", result, partial(plots.plot_compare, rows, train_lengths[0]), text)
    return text


def legend(groups: list[dict], same_text: bool) -> str:
    how = "paired bootstrap difference in mean NLL, the same pieces drawn for both"
    if not same_text:  # runs of other training lengths scored other pieces: their draws are independent
        how = "bootstrap difference in mean NLL, unpaired between runs that scored different pieces"
    lines = [
        f"*: lowest in its column; ~: within noise of it (the 95% interval of the {how} and a seed group's runs "
        "resampled, holds 0); ±: sd over seeds"
    ]
    for g in groups:
        seeds = ", ".join(str(s) for s in g["seeds"])
        lines.append(f"{g['label']}: {len(g['runs'])} run{'s' * (len(g['runs']) > 1)} (seed {seeds})")
    return "\n".join(lines)
