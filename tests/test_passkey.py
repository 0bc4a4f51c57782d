"""Passkey retrieval: generation puts the key where it says, scoring is exact, data=passkey is drawn from the training
split only and is the same for the same seed, and eval.mode=passkey writes its cells."""

import json

import numpy as np
import pytest
import torch
from conftest import ROOT
from hydra import compose, initialize_config_dir
from torch import nn

from data import tokenizer
from data.loader import RowSampler, TokenSplit
from data.passkey import Template, filler_stream
from data.prepare import prepare
from evaluation.bootstrap import wilson
from evaluation.passkey import score
from evaluation.report import model_label
from positional.rope_scaling import Scaling
from utils import runtime


@pytest.fixture(scope="module")
def enc_and_stream(shakespeare_dir):
    spec = tokenizer.read_spec(shakespeare_dir)
    enc = tokenizer.load(spec)
    return enc, tokenizer.bos_id(spec, enc), filler_stream(TokenSplit(shakespeare_dir, "val").documents()[:1])


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_generation_places_the_key_where_it_says(depth, enc_and_stream):
    enc, bos, stream = enc_and_stream
    template = Template(enc, 5)
    key, start, length = "40917", 1234, 160
    s = template.sample(bos, stream[start:], key, depth, length, start)
    k = template.key_tokens(key)
    n = template.filler_length(key, length)
    cut = round(depth * n)
    assert len(s.tokens) == length + 1 and s.tokens[0] == bos and s.depth == depth
    assert np.array_equal(s.tokens[s.needle : s.needle + len(k)], k)  # the needle's key where it says
    assert np.array_equal(s.tokens[s.answer :], k) and s.answer == length + 1 - len(k)  # the answer ends the sample
    assert s.needle == 1 + cut + len(template.before)
    assert np.array_equal(s.tokens[1 : 1 + cut], stream[start : start + cut])  # filler before the needle ...
    after = s.needle + len(k) + len(template.middle) + len(k) + len(template.after)
    assert np.array_equal(s.tokens[after : after + n - cut], stream[start + cut : start + n])  # ... and after it
    assert np.array_equal(s.tokens[after + n - cut : s.answer], template.question)
    text = enc.decode(s.tokens[1:].tolist())
    assert f"The pass key is {key}. Remember it. {key} is the pass key." in text
    assert text.endswith(f"What is the pass key? The pass key is {key}")
    if depth == 0:
        assert text.startswith(" The pass key is")
    if depth == 1:
        assert f"{key} is the pass key. What is the pass key?" in text


class Oracle(nn.Module):
    """A stand-in model whose argmax at every position is the sample's true next token, except where told."""

    def __init__(self, samples, wrong: dict | None = None):
        super().__init__()
        self.index = {tuple(s.tokens[:-1].tolist()): i for i, s in enumerate(samples)}
        self.samples = samples
        self.wrong = wrong or {}  # (sample index, input position) -> the token predicted there instead

    def forward(self, idx, keep_from=0, variant=None):
        logits = torch.zeros(idx.size(0), idx.size(1) - keep_from, 50)
        for b, row in enumerate(idx.tolist()):
            i = self.index[tuple(row)]
            target = self.samples[i].tokens[1:].copy()
            for (j, pos), tok in self.wrong.items():
                if j == i:
                    target[pos] = tok
            logits[b, torch.arange(len(target) - keep_from), torch.from_numpy(target[keep_from:])] = 1.0
        return logits


def test_scoring_is_exact(enc_and_stream):
    _, bos, stream = enc_and_stream
    tiny = Template(_DigitsEnc(), 3)  # ids < 50, so the stand-in's logits stay small
    rng = np.random.default_rng(0)
    samples = [tiny.sample(bos % 50, rng.integers(10, 50, 200), str(100 + i), 0.5, 160) for i in range(6)]
    rt = runtime.setup("cpu", "fp32", 0)
    assert (score(Oracle(samples), samples, batch_tokens=320, rt=rt) == 1).all()  # batches of 2, every key read back
    last_key = len(samples[0].tokens) - 2  # the input position that predicts the key's last token
    wrong = {(1, last_key): 3, (4, samples[4].answer - 1): 7, (2, 5): 9}  # two key tokens, one filler token
    got = score(Oracle(samples, wrong), samples, batch_tokens=320, rt=rt)
    k = len(samples[0].tokens) - samples[0].answer  # key tokens: a space and 3 digits
    assert got.tolist() == [1, 1 - 1 / k, 1, 1, 1 - 1 / k, 1]  # one wrong key token fails a trial; filler is not asked
    runtime.teardown()


class _DigitsEnc:
    """A tokenizer stub: every character its own id below 50 (digits 0-9, then letters by code)."""

    def encode_ordinary(self, text):
        return [int(c) if c.isdigit() else 10 + ord(c) % 40 for c in text]


def test_wilson_interval():
    lo, hi = wilson(0, 50)
    assert lo == 0 and hi == pytest.approx(3.8415 / 53.8415, abs=1e-4)  # z^2 / (n + z^2)
    assert wilson(50, 50)[0] == pytest.approx(1 - 3.8415 / 53.8415, abs=1e-4)
    assert wilson(25, 50) == pytest.approx([0.3664, 0.6336], abs=1e-4)


def _text_corpus(folder):
    """One document: data=text holds out its tail from the last line break before 3/4 of it (data/sources.py), here
    the only line break, and only the tail names Quixote."""
    rng = np.random.default_rng(0)
    words = "the king and queen of a land far away rode out to see their people in spring".split()
    train = " ".join(rng.choice(words, 1200))
    held_out = " ".join(w for _ in range(300) for w in ("Quixote", str(rng.choice(words))))
    assert len(held_out) > len(train) / 2  # so the cut at 3/4 falls in the tail, past the line break
    (folder / "corpus.txt").write_text(train + "\n" + held_out)


def _passkey_config(folder, seed=0):
    base = {
        "name": "text",
        "source": "text",
        "path": str(folder / "corpus.txt"),
        "doc_separator": None,
        "val_fraction": 0.25,
        "seed": 0,
        "bos_aligned": False,
        "cache_dir": str(folder / "cache"),
    }
    return {
        "name": "passkey",
        "source": "passkey",
        "base": base,
        "train_docs": 300,
        "val_docs": 20,
        "min_tokens": 112,
        "max_tokens": 192,
        "key_digits": 5,
        "seed": seed,
        "bos_aligned": True,
        "cache_dir": str(folder / "pk"),
    }


def test_passkey_data_comes_from_the_training_split_only_and_is_seeded(tmp_path):
    _text_corpus(tmp_path)
    tok = {"kind": "bpe", "vocab_size": 300, "train_chars": 10**6}
    base = prepare(_passkey_config(tmp_path)["base"], tok, log=None)
    assert "Quixote" in split_text(base, "val") and "Quixote" not in split_text(base, "train")
    folder = prepare(_passkey_config(tmp_path), tok, log=None)
    spec = tokenizer.read_spec(folder)
    enc = tokenizer.load(spec)
    for split in ("train", "val"):
        docs = TokenSplit(folder, split).documents()
        assert len(docs) == (300 if split == "train" else 20)
        for doc in docs:
            text = enc.decode(doc[1:].tolist())
            assert "Quixote" not in text and "The pass key is" in text and 112 <= len(doc) - 1 <= 192
    again = _passkey_config(tmp_path)
    again["cache_dir"] = str(tmp_path / "pk2")
    same = TokenSplit(prepare(again, tok, log=None), "train").documents()
    assert all(np.array_equal(a, b) for a, b in zip(same, TokenSplit(folder, "train").documents(), strict=True))
    other = TokenSplit(prepare(_passkey_config(tmp_path, seed=1), tok, log=None), "train").documents()
    assert not np.array_equal(other[0], same[0])
    rows = RowSampler(TokenSplit(folder, "train"), 192, 0, bos_aligned=True)  # the loader every data config uses
    x, _ = rows.batch(0, 8)
    first = [enc.decode(r.tolist()) for r in x]
    assert all(r[0] == spec["special"]["<|bos|>"] for r in x.tolist())
    assert all("The pass key is" in t.split("<|bos|>")[1] for t in first)  # a row holds its sample from its BOS


def split_text(folder, split) -> str:
    enc = tokenizer.load(tokenizer.read_spec(folder))
    return "".join(enc.decode(d[1:].tolist()) for d in TokenSplit(folder, split).documents())


def test_passkey_eval_writes_every_cell(tiny_checkpoint):
    import eval as eval_entry

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(
            "eval",
            overrides=[f"checkpoint={tiny_checkpoint}", "eval.mode=passkey", "eval.lengths=[64,96]",
                       "eval.depths=[0,1]", "eval.trials=4", "logger.wandb=false", "device=cpu"],
        )  # fmt: skip
    eval_entry.run(cfg)
    result = json.loads((tiny_checkpoint / "eval" / "passkey.json").read_text())
    cells = {(r["length"], r["depth"]) for r in result["results"]}
    assert cells == {(64, 0.0), (64, 1.0), (96, 0.0), (96, 1.0)}
    for r in result["results"]:
        assert (
            r["trials"] == 4
            and r["accuracy"] == r["correct"] / 4
            and r["ci"] == pytest.approx(wilson(r["correct"], 4), abs=1e-4)
        )
    assert (tiny_checkpoint / "eval" / "passkey.png").stat().st_size > 0


def test_passkey_eval_scores_each_extension_with_the_model_set_up_for_it(tiny_checkpoint, monkeypatch):
    """eval.rope_scaling / eval.log_scaling / eval.rerope in passkey mode: every variant gets its own
    passkey-<variant>.json, and each of its cells is scored under that variant at that length's factor (the value
    each score call receives), the model as trained first; none was once silently ignored."""
    import eval as eval_entry
    from evaluation import passkey

    seen, score_of = [], passkey.score

    def recording(model, samples, batch_tokens, rt, variant):
        s = variant.scaling or Scaling()
        seen.append((s.kind, s.factor, s.window, variant.log_length))
        return score_of(model, samples, batch_tokens, rt, variant)

    monkeypatch.setattr(passkey, "score", recording)
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(
            "eval",
            overrides=[f"checkpoint={tiny_checkpoint}", "eval.mode=passkey", "eval.lengths=[64,96]",
                       "eval.depths=[0,1]", "eval.trials=2", "logger.wandb=false", "device=cpu",
                       "eval.rope_scaling=all", "eval.rerope=true", "eval.log_scaling=true", "eval.rerope_window=16"],
        )  # fmt: skip
    first = eval_entry.run(cfg)
    variants = [
        "none",
        "log",
        "linear",
        "ntk",
        "dynamic_ntk",
        "yarn",
        "yarn_released",
        "llama3",
        "rerope",
        "leaky_rerope",
    ]
    expected = []
    for v in variants:
        for factor in (2.0, 3.0):  # lengths 64 and 96 over the training length 32
            kind = "none" if v in ("none", "log") else v
            setup = (kind, 1.0 if kind == "none" else factor, 16 if v in ("rerope", "leaky_rerope") else None)
            expected += [(*setup, 32 if v == "log" else None)] * 2  # a score call per depth
    assert [(s, f if s != "none" else 1.0, w, g) for s, f, w, g in seen] == expected
    assert first["variant"] == "none"  # eval.py returns the model as trained
    for v in variants:
        result = json.loads((tiny_checkpoint / "eval" / passkey.file_stem(v)).with_suffix(".json").read_text())
        assert result["variant"] == v and len(result["results"]) == 4
        assert (tiny_checkpoint / "eval" / passkey.file_stem(v)).with_suffix(".png").stat().st_size > 0
    rerope = json.loads((tiny_checkpoint / "eval" / "passkey-rerope.json").read_text())
    assert all(r["window"] == 16 and r["leak"] is None for r in rerope["results"])
    assert model_label(rerope) == "rope + rerope (w 16)"
