"""Passkey retrieval (Mohtashami & Jaggi 2023): does the model find a number hidden anywhere in a long text?

python eval.py checkpoint=out/rope-passkey-256 eval.mode=passkey
python eval.py checkpoint=out/rope-passkey-256 eval.mode=passkey eval.lengths=[256,1024] eval.trials=100
python eval.py checkpoint=out/rope-passkey-256 eval.mode=passkey eval.rope_scaling=rerope   (or yarn, all, ...)
Cells: every (length, depth), lengths eval.lengths (default 0.5, 1, 2, 4, 8, 16 x the training length), depths
eval.depths (default 0, 0.25, 0.5, 0.75, 1: where the needle sits in the filler, data/passkey.py), eval.trials per
cell (default 50). A trial of a length draws a key and a place in the checkpoint's held-out works (laid end to end,
never seen in training: data=passkey draws from the training split) and puts the needle at every depth of that
same filler, so the depths of a length differ only in where the needle is. Seeded by eval.seed.
Scoring: one forward over the sample's first L tokens; a trial is right when the argmax at each key position is
the key's token. That is exactly greedy decoding of the key: a greedy decode emits the key iff each of its tokens is
the argmax given the tokens before, which are the key's own. Nothing is asked of what follows the key.
A model must know the format (a short fine-tune on data=passkey) for this to measure reach and not the format.
Accuracy per cell with a Wilson 95% interval (binomial, right at 0 and 1, where a normal interval collapses),
as passkey.json, a table and a heatmap (passkey.png) in <run>/eval/. Each cell also keeps the mean share of key
tokens right (token_accuracy; chance is about 1/10 a digit): progress that exact match does not show yet.
Each training-free extension asked for (eval.rope_scaling, eval.log_scaling, eval.rerope; eval.py) scores the same
trials, as passkey-<variant>.json and .png.
"""

import json
import math
import time

import numpy as np
import torch

from data import tokenizer
from data.passkey import Template, draw, filler_stream
from evaluation.heldout import held_out_works
from evaluation.report import _pyplot, scheme_label
from utils import checkpoint
from utils.errors import UserError
from utils.progress import progress, say
from utils.schema import PasskeyData

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile
DEFAULT_DIGITS = PasskeyData.key_digits  # a checkpoint trained on other data: data=passkey's default


def wilson(correct: int, n: int, z: float = Z95) -> list[float]:
    """The Wilson score interval for a binomial proportion (Wilson 1927): [lo, hi] around correct / n."""
    if n == 0:
        return [0.0, 1.0]
    p, z2 = correct / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return [max(0.0, centre - half), min(1.0, centre + half)]


def key_digits(ckpt: dict, requested: int | None) -> int:
    """eval.key_digits, or the digits the model was fine-tuned on (data=passkey), else the data config's default."""
    if requested is not None:
        return requested
    data = ckpt["config"]["data"]
    return int(data["key_digits"]) if data.get("source") == "passkey" else DEFAULT_DIGITS


@torch.no_grad()
def score(model, samples: list, batch_tokens: int, rt, variant=None) -> np.ndarray:
    """The share of each sample's key tokens that are the argmax at their position (teacher-forced); 1 where the
    key is read back exactly, which is greedy decoding of the key (see above). Samples of one length, batched to
    about batch_tokens tokens. variant: an evaluation variant (model/variant.py), None for the model as trained."""
    length = len(samples[0].tokens) - 1
    per_batch = max(1, batch_tokens // length)
    right = np.zeros(len(samples))
    for b in range(0, len(samples), per_batch):
        chunk = samples[b : b + per_batch]
        rows = torch.from_numpy(np.stack([s.tokens for s in chunk])).to(rt.device)
        first = min(s.answer for s in chunk) - 1  # the head runs only from the first prediction of a key token on
        with rt.autocast():
            logits = model(rows[:, :-1], keep_from=first, variant=variant)
        guess = logits.argmax(-1).cpu().numpy()
        for i, s in enumerate(chunk):
            right[b + i] = np.mean(guess[i, s.answer - 1 - first :] == s.tokens[s.answer :])
    return right


def trials(template: Template, stream: np.ndarray, bos: int, length: int, depths, n: int, seed: int) -> dict:
    """{depth: n samples of `length`}: trial t of every depth shares one key and one filler, drawn from a generator
    seeded by (seed, length), so a length's cells are the same whatever else is asked."""
    rng = np.random.default_rng([seed, length])
    draws = [draw(template, rng, stream, length) for _ in range(n)]
    return {d: [template.sample(bos, stream[s:], key, d, length, s) for key, s in draws] for d in depths}


def file_stem(variant: str) -> str:
    """passkey for the model as trained, passkey-<variant> under an eval-time extension (eval.rope_scaling=yarn)."""
    return "passkey" if variant == "none" else f"passkey-{variant}"


def run_passkey(model, ckpt: dict, path, ev, rt, out_dir, lengths: list[int], variant: str, at) -> dict:
    """Accuracy per (length, depth) cell under one variant (eval.py's plan_variants: at(length) gives the Variant
    value for that length and what its cells record of it); writes <file_stem>.json and .png into out_dir."""
    pe, train_length = model.pe, ckpt["seq_len"]
    enc = tokenizer.load(ckpt["tokenizer"])
    bos = tokenizer.bos_id(ckpt["tokenizer"], enc)
    template = Template(enc, key_digits(ckpt, ev.key_digits))
    if lengths[0] < template.shortest():
        raise UserError(
            f"eval.lengths={lengths}: a passkey sample needs at least {template.shortest()} tokens; ask for longer"
        )
    works = held_out_works(ckpt, ev.prepare)
    stream = filler_stream([doc for _, doc in works])
    depths = sorted({float(d) for d in ev.depths})
    rows, t0 = [], time.time()
    for length in progress(lengths, "passkey", unit="length"):
        if pe.max_positions is not None and length > pe.max_positions:
            note = f"n/a: learned table covers {pe.max_positions} positions"
            rows += [{"length": length, "depth": d, "accuracy": None, "trials": 0, "note": note} for d in depths]
            continue
        t = time.time()
        value, setting = at(length)  # the same trials under every variant: only the variant differs
        cells = trials(template, stream, bos, length, depths, ev.trials, ev.seed)
        for depth, samples in cells.items():
            share = score(model, samples, ev.batch_tokens, rt, value)
            k = int((share == 1).sum())
            rows.append(
                {"length": length, "depth": depth, "accuracy": k / len(share), "correct": k, "trials": len(share),
                 "ci": [round(x, 4) for x in wilson(k, len(share))], "token_accuracy": round(float(share.mean()), 4),
                 **setting}
            )  # fmt: skip
        accs = ", ".join(f"{r['accuracy']:.2f} ({r['token_accuracy']:.2f})" for r in rows[-len(depths) :])
        say(f"  {variant:>12} {length:>6}: accuracy (key tokens right) by depth {accs} ({time.time() - t:.1f} s)")
    result = {
        "checkpoint": str(checkpoint.checkpoint_path(path)),
        "scheme": scheme_label(ckpt),
        "variant": variant,  # an eval-time extension (eval.rope_scaling), none: the model as trained
        "positional": ckpt["model_config"]["positional"],
        "qk_norm": ckpt["model_config"].get("qk_norm", "rms"),  # learned gains: the heads may pass the rms cap
        "train_length": train_length,
        "train_data": ckpt["config"]["data"]["name"],
        "step": ckpt["step"],
        "key_digits": template.key_digits,
        "trials": ev.trials,
        "seed": ev.seed,
        "lengths": lengths,
        "depths": depths,
        "works": [name for name, _ in works],
        "device": str(rt.device),
        "seconds": round(time.time() - t0, 1),
        "results": rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = file_stem(variant)
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1))
    print(passkey_table(result))
    plot_passkey(result, out_dir / f"{stem}.png")
    print(f"written {out_dir}/{stem}.json and {stem}.png ({result['seconds']} s)")
    return result


def model_label(result: dict) -> str:
    """The scheme, an eval-time extension, and the QK-norm where it is not the default gain-free one: rope,
    rope + rerope (w 128), rope (qk_norm=learned)."""
    variant, qk_norm = result.get("variant", "none"), result.get("qk_norm", "rms")
    window = next((r["window"] for r in result["results"] if r.get("window")), None)
    extension = "" if variant == "none" else f" + {variant}" + (f" (w {window})" if window else "")
    return result["scheme"] + extension + ("" if qk_norm == "rms" else f" (qk_norm={qk_norm})")


def passkey_table(result: dict) -> str:
    """A row per depth, a column per length: accuracy [95% interval]."""
    cells = {(r["length"], r["depth"]): r for r in result["results"]}

    def cell(r):
        return "n/a" if r["accuracy"] is None else f"{r['accuracy']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"

    col = max(len(cell(r)) for r in result["results"]) + 2
    lines = [
        f"{model_label(result)} @ step {result['step']}, trained at {result['train_length']} on "
        f"{result['train_data']}: passkey accuracy ({result['key_digits']}-digit keys, {result['trials']} trials "
        "per cell)",
        f"{'depth':>6}" + "".join(f"{n:>{col}}" for n in result["lengths"]),
    ]
    for d in result["depths"]:
        lines.append(f"{d:>6.2f}" + "".join(f"{cell(cells[(n, d)]):>{col}}" for n in result["lengths"]))
    lines.append("[lo, hi]: Wilson 95% interval; filler from the held-out works " + ", ".join(result["works"]))
    lines += sorted({r["note"] for r in result["results"] if r.get("note")})
    return "\n".join(lines)


def plot_passkey(result: dict, path):
    """A heatmap: a column per length, a row per depth, coloured by accuracy, each cell with its interval."""
    plt = _pyplot()
    lengths, depths = result["lengths"], result["depths"]
    acc = np.full((len(depths), len(lengths)), np.nan)
    cells = {(r["length"], r["depth"]): r for r in result["results"]}
    fig, ax = plt.subplots(figsize=(1.3 * len(lengths) + 2, 0.6 * len(depths) + 1.8))
    for i, d in enumerate(depths):
        for j, n in enumerate(lengths):
            r = cells[(n, d)]
            text = "n/a"
            if r["accuracy"] is not None:
                acc[i, j] = r["accuracy"]
                text = f"{r['accuracy']:.2f}\n[{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="lightgray")
    image = ax.imshow(np.ma.masked_invalid(acc), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{n}\n({n / result['train_length']:g}x)" for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set(
        xlabel="sample length in tokens (x the training length)",
        ylabel="needle depth",
    )
    ax.set_title(
        f"{model_label(result)} (trained at {result['train_length']}): passkey accuracy\n"
        f"{result['trials']} trials per cell, [95% Wilson interval]",
        fontsize=10,
    )
    fig.colorbar(image, ax=ax, label="accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
