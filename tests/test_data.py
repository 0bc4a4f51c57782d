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


def fake_split(folder, docs, bos=99):
    """A prepared train split of one shard holding docs (lists of token ids, each written after a BOS)."""
    stream = np.concatenate([[bos, *d] for d in docs]).astype(np.uint16)
    stream.tofile(folder / "train_000.bin")
    np.save(folder / "train_docs.npy", np.cumsum([0] + [len(d) + 1 for d in docs[:-1]]))
    info = {"shards": [{"file": "train_000.bin", "tokens": len(stream)}], "n_docs": len(docs), "n_tokens": len(stream)}
    meta = {"vocab_size": 100, "bos": bos, "dtype": "uint16", "splits": {"train": info}}
    (folder / "meta.json").write_text(json.dumps(meta))
    return TokenSplit(folder, "train"), stream


def test_bos_aligned_rows_start_at_documents(tmp_path):
    """Rows of 4 targets over documents of 9, 1, 2 and 6 tokens: a long document's rest starts rows behind a BOS,
    short documents are packed whole, a cut one starts the next row at its own BOS, the shard's end is dropped."""
    split, stream = fake_split(tmp_path, [list(range(1, 10)), [11], [21, 22], list(range(31, 37))])
    sampler = RowSampler(split, 4, seed=0, bos_aligned=True)
    rows = {tuple(sampler._row(k)) for k in range(sampler.n_rows)}  # as stored; batch() makes the first token BOS
    assert rows == {
        (99, 1, 2, 3, 4),  # the first document from its BOS
        (4, 5, 6, 7, 8),  # its rest: the first token becomes a BOS
        (8, 9, 99, 11, 99),  # its last row holds the next document whole, then the start of the one after
        (99, 21, 22, 99, 31),  # which starts its own row (21, 22 are read twice)
        (99, 31, 32, 33, 34),  # (35, 36: past the shard's last full row)
    }
    x, y = sampler.batch(0, sampler.n_rows)
    assert (x[:, 0] == 99).all() and sorted(map(tuple, y.tolist())) == sorted(r[1:] for r in rows)
    plain = RowSampler(split, 4, seed=0)
    assert {tuple(plain._row(k)) for k in range(plain.n_rows)} == {tuple(stream[i : i + 5]) for i in range(0, 17, 4)}


def test_a_split_shorter_than_one_row_is_one_line_naming_train_seq_len(tmp_path):
    """A corpus too small for the training length (a short text file, a long train.seq_len): a UserError naming the
    key and the split's size, not a Python exception."""
    split, _ = fake_split(tmp_path, [[1, 2, 3], [4, 5]])  # 7 tokens with their BOS
    assert RowSampler(split, 4, seed=0).n_rows == 1
    for aligned in (False, True):
        with pytest.raises(UserError, match=r"train.seq_len=8: the train split of .* holds 7 tokens") as e:
            RowSampler(split, 8, seed=0, bos_aligned=aligned)
        assert "\n" not in str(e.value)


def test_bos_aligned_rows_on_the_corpus(shakespeare_dir):
    """Every training row starts with BOS and is the stored stream after it; every token is a target (but the
    shard's last partial row, and a document's BOS where a row ends just before it); rows are a pure function of
    (seed, row), so a resumed run and each DDP rank read the rows they would have; the default is the plain
    tiling, unchanged."""
    split = TokenSplit(shakespeare_dir, "train")
    aligned, plain = RowSampler(split, 64, 3, bos_aligned=True), RowSampler(split, 64, 3)
    x, y = aligned.batch(0, aligned.n_rows)
    assert (x[:, 0] == split.bos).all()
    stream = np.asarray(split.shards[0], dtype=np.int64)
    starts = aligned.starts[0]
    assert np.array_equal(np.sort(starts), np.unique(starts))  # an epoch reads each row once
    order = aligned._order
    assert np.array_equal(y.numpy(), stream[starts[order][:, None] + np.arange(1, 65)])
    targets = np.zeros(len(stream), dtype=bool)
    for s in starts:
        targets[s + 1 : s + 65] = True
    bos = stream == split.bos  # a BOS is no target where a row ends just before it
    assert (targets | bos)[: starts.max()].all() and len(stream) - 1 - np.flatnonzero(targets).max() < 64
    at_doc_start = np.isin(starts, split.doc_starts)
    assert at_doc_start.sum() == len(split.doc_starts) and not at_doc_start.all()  # a document's rest behind a BOS
    resumed = RowSampler(split, 64, 3, bos_aligned=True).batch(100, 8)[0]
    assert np.array_equal(resumed.numpy(), x[100:108].numpy())
    px, _ = plain.batch(0, 8)
    r = plain._order[:8]  # one shard: plain row r starts at r * seq_len
    assert np.array_equal(px.numpy(), stream[r[:, None] * 64 + np.arange(64)]) and not (px[:, 0] == split.bos).all()


def test_a_prompt_outside_a_character_tokenizer_is_one_line():
    """A task checkpoint's tokenizer has a token for each of its characters and no byte fallback: tiktoken panics on
    any other character (a pyo3 PanicException, past every except clause), so the prompt is checked first and the
    characters named. A BPE, with a token for every byte, encodes anything."""
    from data.tasks import tokenizer_spec

    spec = tokenizer_spec()
    enc = tokenizer.load(spec)
    assert tokenizer.encode(spec, enc, "abc|", "prompt") == enc.encode_ordinary("abc|")
    with pytest.raises(UserError, match=r"prompt holds 'é€', which this checkpoint's tokenizer has no token for; use"):
        tokenizer.encode(spec, enc, "aé€b", "prompt")
    with pytest.raises(BaseException, match="(?i)panic|not found|key"):  # what sample.py met before
        enc.encode_ordinary("aé€b")


def test_a_data_cache_that_is_a_symlink_loop_is_one_line(tmp_path):
    """data.cache_dir pointing into a loop of links: one line naming the key, where Path.resolve raised a
    RuntimeError (an OSError from Python 3.13)."""
    from data.prepare import cache_root

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(UserError, match=rf"data.cache_dir={tmp_path}/a/data cannot be followed \(.*\); point it at"):
        cache_root({"cache_dir": str(tmp_path / "a" / "data")})
