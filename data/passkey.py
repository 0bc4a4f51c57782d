"""Passkey retrieval samples (Mohtashami & Jaggi 2023): a random number hidden in filler text, asked for at the end.

python train.py init_from=out/rope data=passkey train.max_steps=1200 model.qk_norm=learned   (learn the task at 256)
python eval.py checkpoint=out/rope-passkey-256 eval.mode=passkey         (how far it reaches: evaluation/passkey.py)
A sample of length L is L + 1 token ids; a model reads the first L and is scored on the key at the end:
  BOS  filler[:cut]  NEEDLE  filler[cut:]  QUESTION  KEY
  NEEDLE   " The pass key is" KEY ". Remember it." KEY " is the pass key."
  QUESTION " What is the pass key? The pass key is"
  KEY      the tokens of " " + a random number of key_digits digits (the first not 0)
Each piece is tokenized on its own and the ids laid end to end, so where the key lies is known exactly whatever the
tokenizer merges. The filler is consecutive tokens of corpus text, cut = round(depth x its length): depth 0 puts the
needle right after BOS, depth 1 right before the question.
data=passkey writes such samples as a prepared folder with the tokenizer of the corpus at data.base, filler from its
training split only (its held-out works stay unseen, for evaluation).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from data import tokenizer
from data.loader import TokenSplit, load_meta, write_splits
from settings import Rule, group, setting
from utils.errors import UserError
from utils.schema import MAX_COUNT, MAX_TOKENS, Corpus, Source, fixed, folder_name, seed


@dataclass
class PasskeyData(Corpus):
    """Passkey retrieval samples (Mohtashami & Jaggi 2023) over the training split of a corpus (this module)."""

    name: str = folder_name("passkey")
    source: Source = fixed("passkey", "data")
    # the corpus: filler from its training split, and its tokenizer (configs/data/passkey.yaml)
    base: Any = group("data")
    # samples in the training split (16,948 rows of 256: a 1,200-step fine-tune of 32 rows reads each about 2.3 times)
    train_docs: int = setting(20000, "pass how many samples to generate", ge=1, le=MAX_COUNT)
    # for val_loss, over the same split
    val_docs: int = setting(256, "pass how many samples to generate", ge=1, le=MAX_COUNT)
    # sample lengths uniform in [min_tokens, max_tokens] tokens, BOS not counted; max: the training length by
    # default, so a BOS-aligned row holds a sample whole
    min_tokens: int = setting(64, "pass a sample length in tokens", ge=1, le=MAX_TOKENS)
    max_tokens: int = setting("${oc.select:train.seq_len,256}", "pass a sample length in tokens", ge=1, le=MAX_TOKENS)
    key_digits: int = setting(5, "pass how many digits the pass key has", ge=1, le=100)
    seed: int = seed()  # keys, lengths, depths and filler positions
    bos_aligned: bool = True  # every training row starts at a sample's BOS
    eval_mode: ClassVar = "passkey"

    RULES: ClassVar = (
        Rule(("max_tokens", "min_tokens"), lambda hi, lo: hi >= lo, "{0} is below {1}; pass a range of sample lengths"),
    )


NEEDLE = (" The pass key is", ". Remember it.", " is the pass key.")  # KEY goes between them
QUESTION = " What is the pass key? The pass key is"


@dataclass(frozen=True)
class Sample:
    tokens: np.ndarray  # L + 1 ids, BOS first, the key last
    key: str
    depth: float
    needle: int  # index of the needle's first key token
    answer: int  # index of the answer's first token: tokens[answer:] is the key
    filler_start: int  # where the filler was taken from in its stream


class Template:
    """The passkey format in one tokenizer's ids."""

    def __init__(self, enc, key_digits: int):
        self.enc, self.key_digits = enc, key_digits
        self.before, self.middle, self.after = (self.ids(t) for t in NEEDLE)
        self.question = self.ids(QUESTION)

    def ids(self, text: str) -> np.ndarray:
        return np.array(self.enc.encode_ordinary(text), dtype=np.int64)

    def key_tokens(self, key: str) -> np.ndarray:
        return self.ids(" " + key)

    def fixed_tokens(self, key: str) -> int:
        """Tokens of a sample that are not filler (BOS not counted)."""
        k = len(self.key_tokens(key))
        return len(self.before) + len(self.middle) + len(self.after) + 3 * k + len(self.question)

    def filler_length(self, key: str, length: int) -> int:
        """Filler tokens in a sample of `length` (negative: too short for the template)."""
        return length - self.fixed_tokens(key)

    def shortest(self) -> int:
        """The shortest sample with room for the smallest and for the largest key (a tokenizer may merge digits)."""
        return max(self.fixed_tokens(k) for k in ("1" + "0" * (self.key_digits - 1), "9" * self.key_digits))

    def sample(self, bos: int, filler: np.ndarray, key: str, depth: float, length: int, filler_start=0) -> Sample:
        """The sample of `length` (L + 1 ids) with the needle at `depth` of `filler`."""
        n = self.filler_length(key, length)
        if n < 0:
            raise UserError(
                f"a passkey sample of {length} tokens is too short for its template; ask for >= {self.shortest()}"
            )
        if len(filler) < n:
            raise ValueError(f"{len(filler)} filler tokens for a sample that needs {n}")
        k = self.key_tokens(key)
        cut = round(depth * n)
        parts = [[bos], filler[:cut], self.before, k, self.middle, k, self.after, filler[cut:n], self.question, k]
        tokens = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
        return Sample(tokens, key, float(depth), 1 + cut + len(self.before), len(tokens) - len(k), int(filler_start))


def filler_stream(docs) -> np.ndarray:
    """Documents laid end to end without their BOS tokens: the text filler is cut from."""
    return np.concatenate([np.asarray(d[1:], dtype=np.int64) for d in docs])


def draw(template: Template, rng: np.random.Generator, stream: np.ndarray, length: int) -> tuple[str, int]:
    """A random key of key_digits digits, and a random start in stream with room for its filler at this length."""
    key = str(int(rng.integers(10 ** (template.key_digits - 1), 10**template.key_digits)))
    n = max(0, template.filler_length(key, length))
    if len(stream) < n:
        raise UserError(f"a passkey sample of {length} tokens needs {n} tokens of filler; the text has {len(stream)}")
    return key, int(rng.integers(0, len(stream) - n + 1))


def samples(template: Template, stream: np.ndarray, bos: int, n: int, lengths: tuple[int, int], seed: list[int]):
    """n training samples: lengths uniform in [lo, hi], depths in [0, 1], keys and filler at random."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        length = int(rng.integers(lengths[0], lengths[1] + 1))
        depth = float(rng.random())
        key, start = draw(template, rng, stream, length)
        yield template.sample(bos, stream[start:], key, depth, length, start)


def write(tmp: Path, data: dict, log, base: Path):
    """data=passkey into tmp: its train and val samples, both drawn from the training split of the corpus at `base`."""
    spec = tokenizer.read_spec(base)
    enc, meta = tokenizer.load(spec), load_meta(base)
    template = Template(enc, int(data["key_digits"]))
    lo, hi = int(data["min_tokens"]), int(data["max_tokens"])
    if lo < template.shortest():
        raise UserError(f"data.min_tokens={lo} is shorter than the passkey template; pass >= {template.shortest()}")
    stream = filler_stream(TokenSplit(base, "train").documents())
    meta = {key: meta[key] for key in ("vocab_size", "bos", "dtype")}

    def docs(i, split):
        n = int(data[f"{split}_docs"])
        return (s.tokens for s in samples(template, stream, meta["bos"], n, (lo, hi), [int(data["seed"]), i]))

    write_splits(tmp, data, spec, meta, docs, f"passkey samples of {lo}-{hi} tokens", log)
