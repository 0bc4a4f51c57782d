"""Tasks: six synthetic tasks with exact answers, generated offline from a seed, trained short and tested long.

python train.py experiment=tasks positional=alibi data.tasks=[copy,reverse]   (a mixture of two; default: all six)
python eval.py checkpoint=out/tasks-rope eval.mode=tasks                      (exact match at each test length)
A sample is one document, BOS + prompt + "|" + answer + ".", one token per character of CHARS, then BOS and PAD.
"|" and "." appear nowhere else, so the scored tokens are exactly the answer and its closing "." (answer_span). A task
has a length parameter n, and a sample's token count depends on n alone (token_length, BOS to "."):
  copy     n random letters; the answer the same letters.                abc|abc.                        2n + 3
  reverse  n random letters; the answer them reversed.                    abc|cba.                        2n + 3
  add      a+b, two zero-padded n-digit numbers written least-significant digit first, the answer their sum in
           n + 1 digits, the same way: the reversed format of Lee et al. 2023 and Zhou et al. 2024, which a causal
           model can write digit by digit, carry included.    123 + 45 at n=3: 321+540|8610.             3n + 5
  mqar     multi-query associative recall (Zoology, Arora et al. 2023): n pairs key:value (keys two letters,
           distinct in a sample; values one digit), then q = max(1, n // 2) of the keys, none twice; the answer
           their values in query order.                                   ab:1,cd:2,ef:3?cd|2.            5n + 4q + 2
  vt       variable tracking (RULER, Hsieh et al. 2024): n statements over distinct two-letter variables, a chain of
           h = min(4, n) (x1=7; x2=x1; ...) and the others in distractor chains of at most h with their own values,
           interleaved at random; a query of the chain's last variable; the answer its value.
                                                           ab=7;cd=3;ef=ab;gh=ef;ij=gh;?ij|7.         6n - c + 7
           (c = 1 + ceil((n - h) / h) chains: a chain's first statement holds a digit, the others a variable)
  needle   multi-key needle in a haystack (RULER): n lowercase filler letters with 4 needles KEY:value (keys two
           uppercase letters, distinct; values two digits) at uniformly random places, so a needle never appears
           by chance; a query of one needle's key; the answer its value.
                                                          qwAB:12erCD:34tyEF:56GH:78u?CD|34.         n + 28
Lengths (TASKS). A training range starts where the task means something (mqar at 2 pairs, vt at a whole 4-hop
chain, needle at 16 filler letters) and ends where its longest sample is under 100 tokens (vt's, 99), so
train.seq_len=98 holds any sample of any mixture. The test lengths are the longest training n (in distribution: a
scheme that fails there did not learn the task), then 2x, 4x and 8x it. At 8x a sample is 259 tokens (copy, reverse),
197 (add), 450 (mqar), 743 (vt) or 540 (needle), 7.4, 6.8, 7.8, 7.5 and 5.9 times the longest training sample.
Random positions (Ruoss et al. 2023): TaskRows(random_positions=L) gives each batch one sorted random subset of
range(L) as its positions, so a model trained short sees the positions of long samples.
"""

import base64
import string
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, NamedTuple

import numpy as np
import torch

from data.loader import SPLITS, write_splits
from data.tokenizer import BOS
from settings import choices, setting
from utils.errors import UserError
from utils.schema import MAX_COUNT, Corpus, Source, folder_name, seed

LOWER, UPPER, DIGITS = string.ascii_lowercase, string.ascii_uppercase, string.digits
CHARS = LOWER + UPPER + DIGITS + "|.+=;:,?"  # BOS is id len(CHARS), PAD the next one
BOS_ID, PAD, VOCAB_SIZE = len(CHARS), len(CHARS) + 1, len(CHARS) + 2
BAR, DOT = CHARS.index("|"), CHARS.index(".")
HOPS, NEEDLES = 4, 4  # vt's chain length (at most), needle's keys
_IDS = np.full(128, 255, dtype=np.uint8)  # ASCII code -> token id
_IDS[[ord(c) for c in CHARS]] = np.arange(len(CHARS))
_LETTERS, _UPPER, _DIGITS = (np.array(list(s)) for s in (LOWER, UPPER, DIGITS))


def tokenizer_spec() -> dict:
    """A tiktoken spec of one token per character of CHARS, plus BOS and PAD (data/tokenizer.py loads it)."""
    ranks = {base64.b64encode(c.encode()).decode(): i for i, c in enumerate(CHARS)}
    return {"kind": "tasks", "pattern": r"[\s\S]", "ranks": ranks, "special": {BOS: BOS_ID, "<|pad|>": PAD}}


def letters(rng: np.random.Generator, n: int, alphabet=_LETTERS) -> str:
    return "".join(alphabet[rng.integers(0, len(alphabet), n)])


def distinct_names(rng: np.random.Generator, k: int, alphabet=_LETTERS) -> list[str]:
    """k distinct two-character names."""
    m = len(alphabet)
    return [alphabet[i // m] + alphabet[i % m] for i in rng.choice(m * m, size=k, replace=False)]


# ---- the generators: sample(rng, n) -> (prompt, answer) ----


def copy(rng: np.random.Generator, n: int) -> tuple[str, str]:
    s = letters(rng, n)
    return s, s


def reverse(rng: np.random.Generator, n: int) -> tuple[str, str]:
    s = letters(rng, n)
    return s, s[::-1]


def add(rng: np.random.Generator, n: int) -> tuple[str, str]:
    a, b = ("".join(map(str, rng.integers(0, 10, n))) for _ in range(2))  # digits, least significant first
    return f"{a}+{b}", str(int(a[::-1]) + int(b[::-1])).zfill(n + 1)[::-1]


def mqar(rng: np.random.Generator, n: int) -> tuple[str, str]:
    keys, values = distinct_names(rng, n), rng.integers(0, 10, n)
    asked = rng.choice(n, size=max(1, n // 2), replace=False)
    pairs = ",".join(f"{k}:{v}" for k, v in zip(keys, values.tolist(), strict=True))
    return pairs + "?" + ",".join(keys[i] for i in asked), "".join(str(values[i]) for i in asked)


def vt(rng: np.random.Generator, n: int) -> tuple[str, str]:
    h = min(HOPS, n)
    var = distinct_names(rng, n)
    chains = [var[:h]] + [var[i : i + h] for i in range(h, n, h)]  # chain 0 is the one asked about
    values = rng.integers(0, 10, len(chains))
    order = rng.permutation(np.repeat(np.arange(len(chains)), [len(c) for c in chains]))  # which chain speaks next
    said, statements = [0] * len(chains), []
    for c in order.tolist():
        i, chain = said[c], chains[c]
        statements.append(f"{chain[i]}={values[c] if i == 0 else chain[i - 1]};")
        said[c] += 1
    return "".join(statements) + "?" + chains[0][-1], str(values[0])


def needle(rng: np.random.Generator, n: int) -> tuple[str, str]:
    filler = letters(rng, n)
    keys, values = distinct_names(rng, NEEDLES, _UPPER), [letters(rng, 2, _DIGITS) for _ in range(NEEDLES)]
    cuts = np.sort(rng.integers(0, n + 1, NEEDLES)).tolist()  # where each needle goes in the filler
    pieces, last = [], 0
    for cut, k, v in zip(cuts, keys, values, strict=True):
        pieces += [filler[last:cut], f"{k}:{v}"]
        last = cut
    asked = int(rng.integers(0, NEEDLES))
    return "".join(pieces) + filler[last:] + "?" + keys[asked], values[asked]


class Task(NamedTuple):
    sample: Callable[[np.random.Generator, int], tuple[str, str]]  # (rng, n) -> (prompt, answer)
    train: tuple[int, int]  # n uniform in lo..hi, both included
    test: tuple[int, ...]  # eval.mode=tasks' lengths


TASKS = {
    "copy": Task(copy, (1, 16), (8, 16, 32, 64, 128)),
    "reverse": Task(reverse, (1, 16), (8, 16, 32, 64, 128)),
    "add": Task(add, (1, 8), (4, 8, 16, 32, 64)),
    "mqar": Task(mqar, (2, 8), (8, 16, 32, 64)),
    "vt": Task(vt, (4, 16), (16, 32, 64, 128)),
    "needle": Task(needle, (16, 64), (64, 128, 256, 512)),
}


TaskName = choices("TaskName", *TASKS)  # data.tasks: the tasks above


@dataclass
class TasksData(Corpus):
    """Synthetic tasks with exact answers, trained short and tested long (data/tasks.py): copy, reverse, addition,
    multi-query associative recall, variable tracking, multi-key needle; one task or a mixture:
    python train.py experiment=tasks positional=alibi data.tasks=[copy,reverse]"""

    name: str = folder_name("tasks")
    source: Source = "tasks"
    tasks: list[TaskName] = setting(  # a sample's task is drawn uniformly from these (one: a single-task run)
        list(TASKS), "name one task or several", nonempty=True
    )
    train_docs: int = setting(64000, "pass how many training samples to generate", ge=1, le=MAX_COUNT)
    val_docs: int = setting(512, "pass how many validation samples to generate", ge=1, le=MAX_COUNT)  # for val_loss
    seed: int = seed()  # samples from generators seeded by (seed, split); eval.mode=tasks draws its own
    bos_aligned: bool = True  # always: a row is one sample from its BOS (data/tasks.py TaskRows)
    eval_mode: ClassVar = "tasks"
    # positions: a sorted random subset of range(random_positions) per batch, in training and eval.mode=tasks
    # (Ruoss et al. 2023: the positions of longer sequences seen in short ones); null: 0..T-1
    random_positions: int | None = setting(
        None, "pass the range to draw from, above the longest test sample's tokens, or null for 0..T-1", ge=2
    )


def encode(prompt: str, answer: str) -> np.ndarray:
    """BOS + prompt + "|" + answer + "." as token ids (int64)."""
    ids = _IDS[np.frombuffer(f"{prompt}|{answer}.".encode("ascii"), dtype=np.uint8)]
    if (ids == 255).any():
        raise ValueError(f"a character outside the tasks' vocabulary in {prompt!r} | {answer!r}")
    return np.concatenate(([BOS_ID], ids)).astype(np.int64)


def decode(tokens) -> str:
    """The characters of a sample (BOS and PAD left out)."""
    return "".join(CHARS[int(t)] for t in tokens if 0 <= t < len(CHARS))


def token_length(task: str, n: int) -> int:
    """Tokens in a sample of `task` at length n, BOS to "." (the same for every sample: the formats fix it)."""
    return len(encode(*TASKS[task].sample(np.random.default_rng(0), n)))


def answer_span(tokens: np.ndarray) -> slice:
    """The scored tokens of a sample: after its first "|", up to and including the "." that closes the answer."""
    tokens = np.asarray(tokens)
    bar = int(np.argmax(tokens == BAR))
    if tokens[bar] != BAR:
        raise ValueError("a sample without '|': not a tasks document")
    return slice(bar + 1, bar + 2 + int(np.argmax(tokens[bar + 1 :] == DOT)))


def check_tasks(tasks: list[str]):
    if not tasks or any(t not in TASKS for t in tasks):
        raise UserError(f"data.tasks={tasks}: name one task or several of {', '.join(TASKS)}")


def held_out(task: str, n: int, count: int, seed: int) -> list[np.ndarray]:
    """count samples of `task` at length n, seeded by (seed, task, n): never from a training split's stream."""
    check_tasks([task])
    rng = np.random.default_rng([int(seed), len(SPLITS), zlib.crc32(task.encode()), int(n)])  # 2: no split's word
    return [encode(*TASKS[task].sample(rng, n)) for _ in range(count)]


def samples(rng: np.random.Generator, tasks: list[str], count: int):
    """count training samples: a task drawn uniformly from `tasks`, n uniform in its training range."""
    for _ in range(count):
        task = TASKS[tasks[int(rng.integers(0, len(tasks)))]]
        yield encode(*task.sample(rng, int(rng.integers(task.train[0], task.train[1] + 1))))


def write(tmp: Path, data: dict, log, base=None):
    """data=tasks into tmp: data.train_docs and data.val_docs samples, seeded by (data.seed, split)."""
    tasks = list(data["tasks"])
    check_tasks(tasks)
    longest = max(token_length(t, TASKS[t].train[1]) for t in tasks)  # every format's length grows with n
    meta = {"vocab_size": VOCAB_SIZE, "bos": BOS_ID, "pad": PAD, "dtype": "uint8"}
    meta |= {"tasks": tasks, "max_tokens": longest}

    def docs(i, split):
        return samples(np.random.default_rng([int(data["seed"]), i]), tasks, int(data[f"{split}_docs"]))

    write_splits(tmp, data, tokenizer_spec(), meta, docs, f"samples of {', '.join(tasks)}", log)


WIDTH_STEP = 16  # batch widths are multiples of it: at most 7 shapes up to a 98-token row
WINDOW = 64  # batches whose samples are sorted by length together, so that a batch holds one length


class TaskRows:
    """Training rows of a tasks split: one whole sample per row from its BOS, padded with PAD; targets -1 except the
    answer span. Row k is a pure function of (seed, k), as in RowSampler. Given batch_size, each epoch's shuffled
    samples are sorted by length within windows of WINDOW batches, so a batch holds samples of one length (Ruoss et
    al. 2023 train each batch at one length, which random positions rely on) and is narrower."""

    def __init__(self, split, seq_len: int, seed: int, random_positions: int | None = None, batch_size=None):
        self.split, self.seq_len, self.seed, self.random_positions = split, seq_len, seed, random_positions
        self.n_rows, self.batch_size = len(split.doc_starts), batch_size
        self.lengths = np.diff(np.append(split.doc_starts, split.n_tokens))
        longest = int(self.lengths.max())
        if longest > seq_len + 1:
            raise UserError(
                f"train.seq_len={seq_len}: a row holds one whole sample, and the longest here is {longest} tokens (BOS "
                f"to '.'); pass train.seq_len={longest - 1} or more"
            )
        if random_positions is not None and random_positions < seq_len:
            raise UserError(
                f"data.random_positions={random_positions}: a row's {seq_len} positions are drawn from "
                f"range({random_positions}); pass at least train.seq_len={seq_len}"
            )
        self._epoch, self._order = -1, None

    def order(self, epoch: int) -> np.ndarray:
        """The samples of an epoch in row order: shuffled, then (given batch_size) bucketed by length."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.n_rows)
        if self.batch_size is None:
            return order
        batches, window = [], WINDOW * self.batch_size
        for w in range(0, self.n_rows, window):
            part = order[w : w + window]
            part = part[np.argsort(self.lengths[part], kind="stable")]
            batches += [part[i : i + self.batch_size] for i in rng.permutation(range(0, len(part), self.batch_size))]
        return np.concatenate(batches)

    def _sample(self, k: int) -> int:
        epoch, i = divmod(k, self.n_rows)
        if epoch != self._epoch:
            self._order, self._epoch = self.order(epoch), epoch
        return int(self._order[i])

    def _doc(self, k: int) -> np.ndarray:
        return self.split.document(self._sample(k))

    def inputs(self, first_row: int, n: int) -> int:
        """The input tokens of the batch's longest sample, from the recorded lengths: no sample is read."""
        return int(max(self.lengths[self._sample(first_row + j)] for j in range(n))) - 1

    def width(self, first_row: int, n: int) -> int:
        """The batch's inputs rounded up to a multiple of WIDTH_STEP, at most seq_len. PAD after a causal sample
        changes none of its scores: a narrower batch computes the same loss faster (a mixture of copy, reverse and
        add fills 35 of the 98 tokens a row holds for vt or needle)."""
        return min(self.seq_len, -(-self.inputs(first_row, n) // WIDTH_STEP) * WIDTH_STEP)

    def batch(self, first_row: int, n: int, device="cpu"):
        """(x, y) of n rows from first_row, each (n, width): inputs, and targets -1 but the answers."""
        width = self.width(first_row, n)
        x = np.full((n, width + 1), PAD, dtype=np.int64)
        y = np.full((n, width), -1, dtype=np.int64)
        for j in range(n):
            doc = self._doc(first_row + j)
            x[j, : len(doc)] = doc
            span = answer_span(doc)
            y[j, span.start - 1 : span.stop - 1] = doc[span]  # token t is predicted at position t - 1
        return torch.from_numpy(x[:, :-1]).to(device), torch.from_numpy(y).to(device)

    def positions(self, first_row: int, n: int, device="cpu") -> torch.Tensor | None:
        """None (the model's 0..T-1), or with random_positions=L one sorted random subset of range(L) for the whole
        batch, seeded by (seed, first_row) so a resumed run draws the same. The slots past the longest sample repeat
        the last position (only PAD sits there)."""
        if self.random_positions is None:
            return None
        longest = self.inputs(first_row, n)
        rng = np.random.default_rng([self.seed, first_row, 0x706F73])  # a stream apart from the rows' order
        ids = np.sort(rng.choice(self.random_positions, size=longest, replace=False))
        ids = np.append(ids, np.full(self.width(first_row, n) - longest, ids[-1]))
        return torch.from_numpy(ids).to(device)
