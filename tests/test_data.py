"""Corpus split, tokenizer, shards and the row sampler."""

import json
import re

import numpy as np
import pytest
from conftest import config
from omegaconf import OmegaConf

from data import sources, tokenizer
from data.loader import RowSampler, TokenSplit
from data.prepare import prepare
from utils.errors import UserError


def shakespeare_cfg():
    return OmegaConf.to_container(config().data, resolve=True)


def test_val_holds_whole_works_with_their_folio_twins():
    cfg = shakespeare_cfg()
    train = sources.shakespeare_documents(cfg, "train")
    val = sources.shakespeare_documents(cfg, "val")
    train_works = {sources.work_of(stem) for stem, _ in train}
    val_works = {sources.work_of(stem) for stem, _ in val}
    assert val_works == set(cfg["val_works"]) and not train_works & val_works
    assert len(val) == 2 * len(val_works)  # each held-out play in both spellings
    assert {"titus_andronicus_gut_f", "tragedy_of_titus_andronicus_gut"} <= {s for s, _ in train}
    assert all(len(text) > 100_000 for _, text in val)  # long plays: room for 16x the training length


def test_no_val_text_leaks_into_train():
    """Word 6-grams are nearly unique to a play (0.2% shared between different plays) while a Folio twin shares
    over 20% with its modern twin: a twin on the wrong side of the split would show."""
    cfg = shakespeare_cfg()

    def grams(text, n=6):
        words = re.findall(r"[a-z]+", text.lower())
        return {tuple(words[i : i + n]) for i in range(len(words) - n)}

    train = sources.shakespeare_documents(cfg, "train")
    train_grams = set().union(*(grams(t) for _, t in train))
    for stem, text in sources.shakespeare_documents(cfg, "val"):
        own = grams(text)
        assert len(own & train_grams) < 0.02 * len(own), stem
    twins = dict(sources.shakespeare_documents({**cfg, "val_works": ["othello"]}, "train"))
    modern, folio = grams(twins["hamlet_gut"]), grams(twins["hamlet_gut_f"])
    assert len(modern & folio) > 0.1 * len(modern)


def test_bpe_round_trip_and_bos(shakespeare_dir):
    spec = tokenizer.read_spec(shakespeare_dir)
    enc = tokenizer.load(spec)
    assert enc.n_vocab == 4096
    for text in ["To be, or not to be: that is the question.", "Ünïcödé ✓ 日本語 \n\t  spaces", ""]:
        assert enc.decode(enc.encode_ordinary(text)) == text
    bos = tokenizer.bos_id(spec, enc)
    assert bos == enc.n_vocab - 1 and enc.decode([bos]) == "<|bos|>"


def test_shards_hold_every_document_after_a_bos(shakespeare_dir):
    spec = tokenizer.read_spec(shakespeare_dir)
    enc = tokenizer.load(spec)
    val = TokenSplit(shakespeare_dir, "val")
    docs = [t for _, t in sources.shakespeare_documents(shakespeare_cfg(), "val")]
    assert len(val.doc_starts) == len(docs)
    for i, text in enumerate(docs):
        ids = val.document(i)
        assert ids[0] == val.bos and val.bos not in ids[1:]
        assert enc.decode(ids[1:].tolist()) == text


def test_rows_are_deterministic_and_disjoint_across_ranks(shakespeare_dir):
    split = TokenSplit(shakespeare_dir, "train")
    a, b = RowSampler(split, 64, seed=3), RowSampler(split, 64, seed=3)
    x0, y0 = a.batch(0, 4)
    x1, _ = a.batch(4, 4)  # what rank 1 reads in a 2-process run
    assert np.array_equal(x0.numpy(), b.batch(0, 4)[0].numpy())
    assert np.array_equal(x0[:, 1:].numpy(), y0[:, :-1].numpy())  # targets are inputs shifted by one
    assert not any(np.array_equal(r0, r1) for r0 in x0.numpy() for r1 in x1.numpy())
    other = RowSampler(split, 64, seed=4).batch(0, 4)[0]
    assert not np.array_equal(x0.numpy(), other.numpy())
    epoch = [a._row(k).tobytes() for k in range(a.n_rows)]  # one epoch visits every row once
    assert len(set(epoch)) == a.n_rows


def text_cfg(path, **kw):
    return {
        "name": "text",
        "source": "text",
        "path": str(path),
        "doc_separator": None,
        "val_fraction": 0.25,
        "seed": 0,
        "cache_dir": None,
        **kw,
    }


def test_text_source_reads_files_folders_and_globs(tmp_path):
    for i in range(8):
        (tmp_path / f"doc{i}.txt").write_text(f"document {i}\n" * 20)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.txt").write_text("deep\n")
    folder = sources.text_documents(text_cfg(tmp_path), "train") + sources.text_documents(text_cfg(tmp_path), "val")
    assert len(folder) == 9
    assert len(sources.text_documents(text_cfg(tmp_path / "doc*.txt"), "val")) == 2  # 25% of 8
    one = sources.text_documents(text_cfg(tmp_path / "doc0.txt"), "train")[0]
    tail = sources.text_documents(text_cfg(tmp_path / "doc0.txt"), "val")[0]
    assert one + tail == (tmp_path / "doc0.txt").read_text() and tail.startswith("document")


def test_text_source_cuts_documents_at_a_separator(tmp_path):
    (tmp_path / "all.txt").write_text("<|doc|>".join(f"story {i}" for i in range(10)))
    cfg = text_cfg(tmp_path / "all.txt", doc_separator="<\\|doc\\|>", val_fraction=0.2)
    train, val = sources.text_documents(cfg, "train"), sources.text_documents(cfg, "val")
    assert len(train) == 8 and len(val) == 2 and not set(train) & set(val)


def _missing(folder):
    return folder / "missing.txt"


def _empty(folder):
    (folder / "empty.txt").write_text("")
    return folder / "empty.txt"


def _not_utf8(folder):
    (folder / "latin1.txt").write_bytes("caf\u00e9 cr\u00e8me".encode("latin-1"))
    return folder / "latin1.txt"


@pytest.mark.parametrize(
    "make, message", [(_missing, "matches no files"), (_empty, "holds no text"), (_not_utf8, "is not UTF-8")]
)
def test_text_source_bad_input(tmp_path, make, message):
    with pytest.raises(UserError, match=message):
        sources.text_documents(text_cfg(make(tmp_path)), "train")


def test_prepare_a_local_text_corpus(tmp_path):
    (tmp_path / "texts").mkdir()
    for i in range(5):
        (tmp_path / "texts" / f"{i}.txt").write_text(f"Line {i} of a small corpus with some words.\n" * 50)
    cfg = text_cfg(tmp_path / "texts", cache_dir=str(tmp_path / "cache"), val_fraction=0.2)
    out = prepare(cfg, {"kind": "bpe", "vocab_size": 300, "train_chars": 10**6}, log=None)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["train"]["n_docs"] == 4 and meta["splits"]["val"]["n_docs"] == 1
    assert prepare(cfg, {"kind": "bpe", "vocab_size": 300, "train_chars": 10**6}, log=None) == out  # cached


def test_hf_datasets_path_on_a_local_file(tmp_path):
    pytest.importorskip("datasets")
    rows = [{"text": f"doc {i} " + "word " * (5 if i % 3 else 50)} for i in range(30)]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "name": "local",
        "source": "hf",
        "hf_path": "json",
        "hf_name": None,
        "hf_split": "train",
        "hf_val_split": None,
        "data_files": str(path),
        "text_field": "text",
        "max_docs": None,
        "val_docs": 3,
        "val_min_chars": 100,
        "cache_dir": str(tmp_path / "cache"),
    }
    val = list(sources.documents(cfg, "val"))
    train = list(sources.documents(cfg, "train"))
    assert len(val) == 3 and all(len(t) >= 100 for t in val)
    assert len(train) == 27 and not set(val) & set(train)
    out = prepare(cfg, {"kind": "bpe", "vocab_size": 300, "train_chars": 10**6}, log=None)
    assert TokenSplit(out, "val").n_tokens > 0
