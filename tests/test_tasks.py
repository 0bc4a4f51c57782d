"""The tasks' data: every generator's answer agrees with an independent computation, lengths are what the table
says, only the answer span is scored, rows and random positions are a function of (seed, first), and a model that
echoes its input scores 0 on reverse."""

import re

import numpy as np
import pytest
import torch
from conftest import random_model

from data import tasks, tokenizer
from data.loader import TokenSplit
from utils.errors import UserError

LENGTHS = {name: sorted({*range(t.train[0], t.train[1] + 1), *t.test}) for name, t in tasks.TASKS.items()}


def parse(tokens) -> tuple[str, str]:
    """(prompt, answer) of a sample's tokens, checking its frame: BOS, "|" once, "." once and last."""
    text = tasks.decode(tokens)
    assert tokens[0] == tasks.BOS_ID and (np.asarray(tokens) == tasks.BOS_ID).sum() == 1
    assert text.count("|") == 1 and text.count(".") == 1 and text.endswith(".")
    prompt, answer = text[:-1].split("|")
    return prompt, answer


def check_copy(prompt, answer, n):
    assert re.fullmatch(f"[a-z]{{{n}}}", prompt) and answer == prompt


def check_reverse(prompt, answer, n):
    assert re.fullmatch(f"[a-z]{{{n}}}", prompt) and answer == "".join(reversed(list(prompt)))


def check_add(prompt, answer, n):
    a, b = prompt.split("+")
    assert re.fullmatch(f"[0-9]{{{n}}}", a) and re.fullmatch(f"[0-9]{{{n}}}", b)
    assert re.fullmatch(f"[0-9]{{{n + 1}}}", answer)
    assert int(answer[::-1]) == int(a[::-1]) + int(b[::-1])  # Python's integers, read most-significant first


def check_mqar(prompt, answer, n):
    pairs, queries = prompt.split("?")
    table = {}
    for pair in pairs.split(","):
        key, value = pair.split(":")
        assert re.fullmatch("[a-z]{2}", key) and re.fullmatch("[0-9]", value) and key not in table
        table[key] = value
    asked = queries.split(",")
    assert len(table) == n and len(asked) == max(1, n // 2) == len(set(asked))
    assert answer == "".join(table[k] for k in asked)


def check_vt(prompt, answer, n):
    body, query = prompt.split("?")
    statements = body.split(";")
    assert statements[-1] == "" and len(statements) == n + 1
    value, parent = {}, {}
    for s in statements[:-1]:
        var, rhs = s.split("=")
        assert re.fullmatch("[a-z]{2}", var) and var not in value  # every variable assigned once
        if rhs.isdigit():
            value[var] = rhs
        else:
            assert rhs in value  # defined before it is used
            value[var], parent[var] = value[rhs], rhs
    chain = [query]
    while chain[-1] in parent:
        chain.append(parent[chain[-1]])
    assert len(chain) == min(4, n) and answer == value[query]
    assert all(child in chain for child, p in parent.items() if p in chain)  # no distractor reads the chain


def check_needle(prompt, answer, n):
    body, query = prompt.split("?")
    found = re.findall(r"([A-Z]{2}):([0-9]{2})", body)
    filler = re.sub(r"[A-Z]{2}:[0-9]{2}", "", body)
    assert len(found) == 4 and len({k for k, _ in found}) == 4
    assert re.fullmatch(f"[a-z]{{{n}}}", filler)
    assert answer == dict(found)[query]


CHECKS = {
    "copy": check_copy,
    "reverse": check_reverse,
    "add": check_add,
    "mqar": check_mqar,
    "vt": check_vt,
    "needle": check_needle,
}


def expected_length(task, n):
    """Token counts, BOS to ".", counted from each format by hand."""
    q, c = max(1, n // 2), 1 + -(-(n - min(4, n)) // min(4, n))
    return {"copy": 2 * n + 3, "reverse": 2 * n + 3, "add": 3 * n + 5, "mqar": 5 * n + 4 * q + 2,
            "vt": 6 * n - c + 7, "needle": n + 28}[task]  # fmt: skip


@pytest.mark.parametrize("task", list(tasks.TASKS))
def test_answers_agree_with_an_independent_computation(task):
    rng = np.random.default_rng(7)
    for n in LENGTHS[task]:
        for _ in range(20 if n <= 64 else 4):
            doc = tasks.encode(*tasks.TASKS[task].sample(rng, n))
            CHECKS[task](*parse(doc), n)
            assert len(doc) == expected_length(task, n) == tasks.token_length(task, n)


def test_a_wrong_answer_fails_its_check():
    """The checks can fail: each rejects its task's sample with the answer's first character changed."""
    rng = np.random.default_rng(0)
    for task, check in CHECKS.items():
        prompt, answer = tasks.TASKS[task].sample(rng, 8 if task != "needle" else 32)
        wrong = {"a": "b", "0": "1"}.get(answer[0], "a" if answer[0].isalpha() else "0") + answer[1:]
        with pytest.raises((AssertionError, KeyError, ValueError)):
            check(prompt, wrong, 8 if task != "needle" else 32)


def test_addition_operands_may_start_with_zero():
    """Operands are uniform over 0..10^n - 1, zero-padded: the leading digit is 0 about one time in ten."""
    rng = np.random.default_rng(1)
    leading = [side[-1] for _ in range(2000) for side in tasks.add(rng, 6)[0].split("+")]
    assert 0.07 < leading.count("0") / len(leading) < 0.13


def test_vt_interleaves_its_chains_and_needles_go_anywhere():
    """vt's asked chain sits anywhere among the distractors; a needle goes before, between or after any filler
    letter (n + 1 places), the ends included."""
    rng = np.random.default_rng(3)
    where = set()
    for _ in range(200):
        body, query = tasks.vt(rng, 16)[0].split("?")
        where.add([s.split("=")[0] for s in body.split(";")].index(query))
    assert len(where) > 8  # where the statement defining the asked variable falls, of 3..15
    places = set()
    for _ in range(300):
        body = tasks.needle(rng, 16)[0].split("?")[0]
        places |= {len(re.sub("[A-Z0-9:]", "", body[: m.start()])) for m in re.finditer("[A-Z]{2}:", body)}
    assert places == set(range(17))


def test_bar_and_dot_appear_once_where_the_answer_is():
    rng = np.random.default_rng(2)
    for t in tasks.TASKS.values():
        for n in (t.train[0], t.test[-1]):
            prompt, answer = t.sample(rng, n)
            doc = tasks.encode(prompt, answer)
            assert np.flatnonzero(doc == tasks.BAR).tolist() == [1 + len(prompt)]
            assert np.flatnonzero(doc == tasks.DOT).tolist() == [len(doc) - 1]
            span = tasks.answer_span(doc)
            assert tasks.decode(doc[span]) == answer + "." and span.start == 2 + len(prompt)
            padded = np.append(doc, [tasks.PAD] * 5)
            assert tasks.answer_span(padded) == span


def test_the_table_tests_at_4x_and_at_8x_where_samples_stay_short():
    for task, t in tasks.TASKS.items():
        lo, hi = t.train
        assert 1 <= lo < hi and list(t.test) == sorted(t.test) and t.test[-1] >= 4 * hi
        assert t.test[-1] >= 8 * hi or tasks.token_length(task, 8 * hi) > 1200
        assert tasks.token_length(task, t.test[-1]) <= 1200
    assert max(tasks.token_length(t, tasks.TASKS[t].train[1]) for t in tasks.TASKS) == 99  # the docstring's figure


def test_tokenizer_spec_reads_and_writes_the_same_ids():
    enc = tokenizer.load(tasks.tokenizer_spec())
    assert enc.n_vocab == tasks.VOCAB_SIZE and tokenizer.bos_id(tasks.tokenizer_spec(), enc) == tasks.BOS_ID
    for task in tasks.TASKS:
        doc = tasks.held_out(task, 9, 1, 0)[0]
        assert enc.encode_ordinary(tasks.decode(doc)) == doc[1:].tolist()
        assert enc.decode(doc.tolist()) == tokenizer.BOS + tasks.decode(doc)


def test_held_out_is_a_function_of_seed_task_and_length():
    a = tasks.held_out("vt", 20, 10, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, tasks.held_out("vt", 20, 10, seed=1), strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, tasks.held_out("vt", 20, 10, seed=2), strict=True))
    assert {len(x) for x in a} == {tasks.token_length("vt", 20)}
    copies = {tasks.decode(x) for x in tasks.held_out("copy", 16, 50, seed=3)}
    reverses = {tasks.decode(x) for x in tasks.held_out("reverse", 16, 50, seed=3)}
    assert len(copies) == 50 and {s.split("|")[0] for s in copies}.isdisjoint(s.split("|")[0] for s in reverses)
    with pytest.raises(UserError, match="data.tasks"):
        tasks.held_out("sort", 4, 1, 0)


def write(folder, task_names, seed=3, train_docs=400, val_docs=60):
    data = {"name": "tasks", "source": "tasks", "tasks": task_names, "train_docs": train_docs,
            "val_docs": val_docs, "seed": seed, "cache_dir": None}  # fmt: skip
    folder.mkdir()
    tasks.write(folder, data, lambda *args: None)
    return folder


@pytest.fixture(scope="module")
def every_task(tmp_path_factory):
    return write(tmp_path_factory.mktemp("tasks") / "all", list(tasks.TASKS))


def kind(prompt):
    """Which task wrote a prompt, read off its format (copy and reverse look alike)."""
    for task, pattern in [("add", r"[0-9]+\+[0-9]+"), ("mqar", r"[a-z]{2}:[0-9](,[a-z]{2}:[0-9])*\?.*"),
                          ("vt", r"([a-z]{2}=\w+;)+\?[a-z]{2}"), ("needle", r"[a-zA-Z0-9:]+\?[A-Z]{2}"),
                          ("letters", r"[a-z]+")]:  # fmt: skip
        if re.fullmatch(pattern, prompt):
            return task
    raise AssertionError(prompt)


def test_writing_tasks_draws_the_mixture_in_its_training_ranges(every_task, tmp_path):
    import json

    meta = json.loads((every_task / "meta.json").read_text())
    assert meta["tasks"] == list(tasks.TASKS) and meta["max_tokens"] == 99
    assert (meta["vocab_size"], meta["bos"], meta["pad"], meta["dtype"]) == (72, tasks.BOS_ID, tasks.PAD, "uint8")
    train = TokenSplit(every_task, "train")
    docs = train.documents()
    assert len(docs) == 400 and max(len(d) for d in docs) <= meta["max_tokens"]
    kinds = [kind(parse(d)[0]) for d in docs]
    assert {"add", "mqar", "vt", "needle", "letters"} == set(kinds)
    assert 90 < kinds.count("letters") < 180  # copy and reverse: a third of 400, expected 133
    val = TokenSplit(every_task, "val").documents()
    assert len(val) == 60 and not np.array_equal(np.concatenate(val[:5]), np.concatenate(docs[:5]))

    two = TokenSplit(write(tmp_path / "two", ["add", "needle"]), "train").documents()
    digits = [len(parse(d)[0].split("+")[0]) for d in two if kind(parse(d)[0]) == "add"]
    filler = [len(re.sub(r"[A-Z0-9:]|\?.*", "", parse(d)[0])) for d in two if kind(parse(d)[0]) == "needle"]
    assert len(digits) + len(filler) == 400 and min(len(digits), len(filler)) > 150
    assert set(digits) == set(range(1, 9)) and 16 <= min(filler) and max(filler) <= 64
    again = write(tmp_path / "again", ["add", "needle"])
    assert (again / "train_000.bin").read_bytes() == (tmp_path / "two" / "train_000.bin").read_bytes()
    other = write(tmp_path / "other", ["add", "needle"], seed=4)
    assert (other / "train_000.bin").read_bytes() != (again / "train_000.bin").read_bytes()
    with pytest.raises(UserError, match="data.tasks"):
        write(tmp_path / "bad", ["copy", "sort"])


def test_rows_score_only_the_answer_span_and_pad(every_task):
    split = TokenSplit(every_task, "train")
    rows = tasks.TaskRows(split, 100, seed=1)
    x, y = rows.batch(0, 64)
    width = x.shape[1]
    assert x.shape == y.shape == (64, width) and rows.n_rows == 400
    for xi, yi in zip(x.numpy(), y.numpy(), strict=True):
        end = int(np.flatnonzero(xi == tasks.DOT)[0]) + 1 if tasks.DOT in xi else width + 1  # the sample's length
        doc = np.append(xi, yi[-1])[:end]  # the sample, "." being the last target when it fills the row
        span = tasks.answer_span(doc)
        scored = np.flatnonzero(yi != -1)
        assert scored.tolist() == list(range(span.start - 1, span.stop - 1))
        assert tasks.decode(yi[scored]) == parse(doc)[1] + "."
        assert xi[0] == tasks.BOS_ID and (xi[end:] == tasks.PAD).all() and tasks.PAD not in yi


def test_rows_are_a_function_of_seed_and_first_row(every_task):
    split = TokenSplit(every_task, "train")
    x, y = tasks.TaskRows(split, 100, seed=5).batch(16, 8)
    rows = tasks.TaskRows(split, 100, seed=5)
    whole = rows.batch(0, 24)
    assert torch.equal(whole[0][16:], x) and torch.equal(whole[1][16:], y)
    assert torch.equal(rows.batch(16, 8)[0], x)
    assert not torch.equal(tasks.TaskRows(split, 100, seed=6).batch(16, 8)[0], x)
    later = rows.batch(400 + 16, 8)[0]  # the next epoch: another order of the same samples
    assert not torch.equal(later, x)
    assert {tuple(r) for r in rows.batch(400, 400)[0].tolist()} == {tuple(r) for r in rows.batch(0, 400)[0].tolist()}


def test_random_positions_are_sorted_distinct_in_range_and_per_batch(every_task):
    split = TokenSplit(every_task, "train")
    assert tasks.TaskRows(split, 100, seed=1).positions(0, 8) is None
    rows = tasks.TaskRows(split, 100, seed=1, random_positions=512)
    first, second = rows.positions(0, 8), rows.positions(8, 8)
    for at, pos in ((0, first), (8, second)):
        inputs = max(len(rows._doc(at + j)) for j in range(8)) - 1  # the longest sample's, drawn exactly
        assert pos.shape == (rows.width(at, 8),) and pos.dtype == torch.int64
        assert (pos[:inputs].diff() > 0).all() and pos.min() >= 0 and pos.max() < 512
        assert (pos[inputs:] == pos[inputs - 1]).all()  # the width's rounding: PAD only, after every sample
    assert not torch.equal(first, second) and first.max() > 100  # beyond the row: positions of longer samples
    assert torch.equal(tasks.TaskRows(split, 100, seed=1, random_positions=512).positions(8, 8), second)
    assert not torch.equal(tasks.TaskRows(split, 100, seed=2, random_positions=512).positions(8, 8), second)
    x, y = rows.batch(8, 8)
    loss = random_model("rope", vocab_size=tasks.VOCAB_SIZE)(x, y, pos=second)  # the shape a model reads
    assert torch.isfinite(loss)
    with pytest.raises(UserError, match="random_positions=64"):
        tasks.TaskRows(split, 100, seed=1, random_positions=64)


def test_batches_hold_one_length_and_an_epoch_every_sample_once(tmp_path):
    """Given batch_size, an epoch's rows are bucketed by length: (almost) every batch holds samples of one length,
    the batches come in no length order, and the epoch still holds every sample once, a function of the seed."""
    split = TokenSplit(write(tmp_path / "copy", ["copy"]), "train")  # 16 lengths, 25 samples each on average
    rows = tasks.TaskRows(split, 100, seed=1, batch_size=8)
    order = rows.order(0)
    assert sorted(order.tolist()) == list(range(rows.n_rows))
    assert np.array_equal(order, tasks.TaskRows(split, 100, seed=1, batch_size=8).order(0))
    assert not np.array_equal(order, rows.order(1))
    lengths = [rows.lengths[order[i : i + 8]] for i in range(0, rows.n_rows, 8)]
    one = [len(set(b.tolist())) == 1 for b in lengths]
    assert sum(one) >= 0.7 * len(one)  # a batch straddles two lengths only where a length's samples run out
    assert not all(np.diff([b.max() for b in lengths]) >= 0)  # not sorted from short to long
    x, _ = rows.batch(8, 8)
    assert x.shape[1] < tasks.TaskRows(split, 100, seed=1).batch(8, 8)[0].shape[1]  # narrower than mixed lengths


@pytest.mark.parametrize("scheme", ["rope", "learned"])
def test_a_batch_as_wide_as_its_longest_sample_scores_as_the_full_row(every_task, scheme):
    """The model is causal: the PAD after a sample changes none of its scores, so a batch cut to its longest sample
    (rounded up to WIDTH_STEP) has the loss of the full train.seq_len row, in less time."""
    split = TokenSplit(every_task, "train")
    rows = tasks.TaskRows(split, 100, seed=3)
    model = random_model(scheme, vocab_size=tasks.VOCAB_SIZE)
    widths = set()
    for first in (0, 8, 16, 24):
        x, y = rows.batch(first, 4)
        longest = max(int(np.flatnonzero(r == tasks.DOT)[0]) if tasks.DOT in r else 100 for r in x.numpy())
        widths.add(x.shape[1])
        assert x.shape[1] % tasks.WIDTH_STEP == 0 or x.shape[1] == 100
        assert longest <= x.shape[1] < longest + tasks.WIDTH_STEP
        full_x = torch.full((4, 100), tasks.PAD, dtype=torch.long)
        full_y = torch.full((4, 100), -1, dtype=torch.long)
        full_x[:, : x.shape[1]], full_y[:, : y.shape[1]] = x, y
        torch.testing.assert_close(model(x, y), model(full_x, full_y))
    assert min(widths) < 100  # some batches are narrower than the row


def test_a_sample_longer_than_the_row_names_train_seq_len(every_task):
    split = TokenSplit(every_task, "train")
    longest = int(np.diff(np.append(split.doc_starts, split.n_tokens)).max())
    with pytest.raises(UserError, match=rf"train.seq_len=40: .* {longest} tokens .* train.seq_len={longest - 1}"):
        tasks.TaskRows(split, 40, seed=1)
    tasks.TaskRows(split, longest - 1, seed=1)  # a row of exactly the longest sample holds it
    with pytest.raises(UserError, match=f"train.seq_len={longest - 2}: "):
        tasks.TaskRows(split, longest - 2, seed=1)


def exact(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row: are all its scored tokens right."""
    return np.array([np.array_equal(p[t != -1], t[t != -1]) for p, t in zip(pred, y, strict=True)])


def copy_prompt(x: np.ndarray) -> np.ndarray:
    """Predictions of a model that writes the prompt back after "|" (then "."), and echoes elsewhere."""
    pred = x.copy()
    for p, row in zip(pred, x, strict=True):
        bar = int(np.flatnonzero(row == tasks.BAR)[0])
        prompt = row[1:bar]
        p[bar : bar + len(prompt)], p[bar + len(prompt)] = prompt, tasks.DOT
    return pred


def test_echoing_the_input_scores_zero_on_reverse(tmp_path):
    split = TokenSplit(write(tmp_path / "reverse", ["reverse"], train_docs=300), "train")
    x, y = (t.numpy() for t in tasks.TaskRows(split, 40, seed=1).batch(0, 300))
    assert exact(np.where(y != -1, y, 0), y).all()  # the scorer gives credit: the true answers score 1
    assert not exact(x, y).any()  # token t + 1 predicted as token t: never right, at any n
    palindromes = np.array([p == p[::-1] for p in (parse(row[row != tasks.PAD])[0] for row in x)])
    assert palindromes.sum() > 10  # n = 1 and a few n = 2, 3: reversing them is copying them
    assert np.array_equal(exact(copy_prompt(x), y), palindromes)
    for n in (2, *tasks.TASKS["reverse"].test):  # held-out samples, scored from answer_span
        for doc in tasks.held_out("reverse", n, 100, seed=0):
            span, prompt = tasks.answer_span(doc), doc[1 : 1 + n]
            assert not np.array_equal(doc[span.start - 1 : span.stop - 1], doc[span])  # echo
            right = np.array_equal(np.append(prompt, tasks.DOT), doc[span])  # copy the prompt
            assert right == (n == 2 and prompt[0] == prompt[1])
