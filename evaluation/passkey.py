"""Passkey retrieval (Mohtashami & Jaggi 2023): does the model find a number hidden anywhere in a long text?

python eval.py checkpoint=out/rope-passkey-256 eval.mode=passkey
python eval.py checkpoint=out/rope-passkey-256 eval.mode=passkey eval.lengths=[256,1024] eval.trials=100
python eval.py checkpoint=out/rope-passkey-256 eval.mode=passkey eval.rope_scaling=rerope   (or yarn, all, ...)
A cell per (length, depth), eval.trials each; trial t of a length puts the same key in the same held-out filler at
every depth. A trial is right when the argmax at each key position is the key's token, which is exactly greedy
decoding of the key. The model must know the format (a fine-tune on data=passkey) for this to measure reach. Wilson
95% intervals: sound at 0 and 1, where a normal interval collapses.
"""

import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from data import tokenizer
from data.passkey import PasskeyData, Template, draw, filler_stream
from evaluation import plots, report
from evaluation.bootstrap import wilson
from evaluation.heldout import held_out_works
from evaluation.length import resolve_lengths
from evaluation.variants import plan_variants
from utils import checkpoint
from utils.errors import UserError
from utils.progress import progress, say


def key_digits(ckpt: dict, requested: int | None) -> int:
    """eval.key_digits, or the digits the model was fine-tuned on (data=passkey), else data=passkey's default."""
    if requested is not None:
        return requested
    data = ckpt["config"]["data"]
    return int(data["key_digits"]) if data.get("source") == "passkey" else PasskeyData.key_digits


@torch.no_grad()
def score(model, samples: list, batch_tokens: int, rt, variant=None) -> np.ndarray:
    """The share of each sample's key tokens that are the argmax at their position (teacher-forced): 1 where greedy
    decoding reads the key back exactly. Samples of one length, batched to about batch_tokens tokens."""
    per_batch = max(1, batch_tokens // (len(samples[0].tokens) - 1))
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
    """{depth: n samples of `length`}: trial t of every depth shares one key and one filler, seeded by (seed, length),
    so a length's cells are the same whatever else is asked."""
    rng = np.random.default_rng([seed, length])
    draws = [draw(template, rng, stream, length) for _ in range(n)]
    return {d: [template.sample(bos, stream[s:], key, d, length, s) for key, s in draws] for d in depths}


def file_stem(variant: str) -> str:
    return "passkey" if variant == "none" else f"passkey-{variant}"


def run_passkey(path, cfg, rt, out_dir: Path) -> dict:
    """eval.mode=passkey: each variant asked for into passkey[-<variant>].json and .png; returns the first's result."""
    model, ckpt = checkpoint.load_model(path, rt.device)
    lengths = resolve_lengths(cfg.eval.lengths, ckpt["seq_len"])
    variants, _, at = plan_variants(path, cfg.eval, model, ckpt, lengths)
    return [score_variant(model, ckpt, path, cfg.eval, rt, out_dir, lengths, v, partial(at, v)) for v in variants][0]


def score_variant(model, ckpt: dict, path, ev, rt, out_dir, lengths: list[int], variant: str, at) -> dict:
    """Accuracy per (length, depth) cell under one variant (at(length): its Variant and what its cells record); writes
    <file_stem>.json and .png."""
    enc, table = tokenizer.load(ckpt["tokenizer"]), model.pe.max_positions
    template = Template(enc, key_digits(ckpt, ev.key_digits))
    if lengths[0] < template.shortest():
        raise UserError(
            f"eval.lengths={lengths}: a passkey sample needs at least {template.shortest()} tokens; ask for longer"
        )
    works = held_out_works(ckpt, ev.prepare)
    stream, bos = filler_stream([doc for _, doc in works]), tokenizer.bos_id(ckpt["tokenizer"], enc)
    depths = sorted({float(d) for d in ev.depths})
    rows, t0 = [], time.time()
    for length in progress(lengths, "passkey", unit="length"):
        if table is not None and length > table:
            note = f"n/a: learned table covers {table} positions"
            rows += [{"length": length, "depth": d, "accuracy": None, "trials": 0, "note": note} for d in depths]
            continue
        t = time.time()
        value, setting = at(length)  # the same trials under every variant
        for depth, samples in trials(template, stream, bos, length, depths, ev.trials, ev.seed).items():
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
        "scheme": report.scheme_label(ckpt),
        "variant": variant,
        "positional": ckpt["model_config"]["positional"],
        "qk_norm": ckpt["model_config"].get("qk_norm", "rms"),  # learned gains: the heads may pass the rms cap
        "train_length": ckpt["seq_len"],
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
    print(passkey_table(result))
    report.write_result(out_dir, file_stem(variant), result, partial(plots.plot_passkey, result))
    return result


def _cell(r: dict) -> str:
    return "n/a" if r["accuracy"] is None else f"{r['accuracy']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"


def passkey_table(result: dict) -> str:
    """A row per depth, a column per length: accuracy [95% interval]."""
    cells = {(r["length"], r["depth"]): r for r in result["results"]}
    col = max(len(_cell(r)) for r in result["results"]) + 2
    lines = [
        f"{report.model_label(result)} @ step {result['step']}, trained at {result['train_length']} on "
        f"{result['train_data']}: passkey accuracy ({result['key_digits']}-digit keys, {result['trials']} trials "
        "per cell)",
        f"{'depth':>6}" + "".join(f"{n:>{col}}" for n in result["lengths"]),
    ]
    for d in result["depths"]:
        lines.append(f"{d:>6.2f}" + "".join(f"{_cell(cells[(n, d)]):>{col}}" for n in result["lengths"]))
    lines.append("[lo, hi]: Wilson 95% interval; filler from the held-out works " + ", ".join(result["works"]))
    lines += sorted({r["note"] for r in result["results"] if r.get("note")})
    return "\n".join(lines)
