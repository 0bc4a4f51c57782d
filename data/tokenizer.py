"""Tokenizers as tiktoken Encodings: a BPE trained here with rustbpe (default), or tiktoken's gpt2.

python train.py tokenizer=bpe tokenizer.vocab_size=4096     (trained on the train split on first use)
python train.py tokenizer=gpt2                             (needs tiktoken's files: network or a cache)
A tokenizer is a small dict (pattern, merges, special tokens) saved beside the data and in every checkpoint, so
eval.py and sample.py rebuild the same Encoding from a checkpoint alone. Every document starts with BOS.
"""

import base64
import hashlib
import json
import logging
import os
import socket
import tempfile
from pathlib import Path

import tiktoken

from data import loader
from utils.errors import UserError
from utils.files import BOS, spec_problem  # noqa: F401  (BOS: data/grids.py, data/tasks.py)


def train_bpe(texts, vocab_size: int, max_chars: int) -> dict:
    import rustbpe

    logging.getLogger("rustbpe").setLevel(logging.WARNING)  # its progress is a hundred lines
    tok = rustbpe.Tokenizer()
    try:
        tok.train_from_iterator(_limit(texts, max_chars), vocab_size - 1)  # one id left for BOS
    except SystemError as e:
        # rustbpe asks Python's logging for its level as training starts; an exception raised there (a SIGTERM or
        # Ctrl-C handler's Stopped) is left pending and comes back as a SystemError caused by it: raise the cause
        raise (e.__cause__ or e) from None
    ranks = {base64.b64encode(bytes(piece)).decode(): rank for piece, rank in tok.get_mergeable_ranks()}
    return {"kind": "bpe", "pattern": tok.get_pattern(), "ranks": ranks, "special": {BOS: len(ranks)}}


def _limit(texts, max_chars):
    used = 0
    for t in texts:
        if used >= max_chars:
            return
        yield t[: max_chars - used]
        used += len(t)


def tiktoken_spec(name: str) -> dict:
    """tiktoken's own encoding; its <|endoftext|> serves as BOS. Offline, its files must be cached: tiktoken would
    otherwise wait on a download with no timeout."""
    env, host = os.environ, "openaipublic.blob.core.windows.net"
    cache = (
        env.get("TIKTOKEN_CACHE_DIR")
        or env.get("DATA_GYM_CACHE_DIR")
        or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    )
    urls = [f"https://{host}/gpt-2/encodings/main/{f}" for f in ("vocab.bpe", "encoder.json")] if name == "gpt2" else []
    files = [os.path.join(cache, hashlib.sha1(u.encode()).hexdigest()) for u in urls]
    if not (files and all(os.path.exists(f) for f in files)):
        try:
            socket.create_connection((host, 443), timeout=5).close()
        except OSError:
            raise UserError(
                f"tokenizer={name} needs tiktoken's files, which are not cached ({cache}) and cannot be downloaded "
                f"(no network); use the default tokenizer=bpe, or copy the cache there from a machine online"
            ) from None
    enc = tiktoken.get_encoding(name)
    return {"kind": "tiktoken", "name": name, "bos": "<|endoftext|>", "n_vocab": enc.n_vocab}


def read_spec(folder) -> dict:
    """A prepared folder's tokenizer, checked against its meta.json and as a tokenizer."""
    loader.check_files(folder, ["tokenizer.json"], loader.load_meta(folder))
    try:
        spec = json.loads((Path(folder) / "tokenizer.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        loader.damaged(folder, "tokenizer.json cannot be read")
    if why := spec_problem(spec):
        loader.damaged(folder, f"tokenizer.json {why}")
    return spec


def load(spec: dict) -> tiktoken.Encoding:
    if spec["kind"] == "tiktoken":
        return tiktoken.get_encoding(spec["name"])
    ranks = {base64.b64decode(k): v for k, v in spec["ranks"].items()}
    return tiktoken.Encoding(
        name="nanopos-bpe", pat_str=spec["pattern"], mergeable_ranks=ranks, special_tokens=spec["special"]
    )


def encode(spec: dict, enc: tiktoken.Encoding, text: str, key: str) -> list[int]:
    """text's ids. A character outside a character-set tokenizer makes tiktoken panic: refuse it in one line."""
    if spec["kind"] != "tiktoken":
        known = {b[0] for b in map(base64.b64decode, spec["ranks"]) if len(b) == 1}
        if len(known) < 256 and (unknown := sorted({c for c in text if not set(c.encode()) <= known})):
            raise UserError(
                f"{key} holds {''.join(unknown)!r}, which this checkpoint's tokenizer has no token for; use only its "
                f"{len(known)} characters, {bytes(sorted(known)).decode('latin-1')!r}"
            )
    return enc.encode_ordinary(text)


def bos_id(spec: dict, enc: tiktoken.Encoding) -> int:
    return enc.encode_single_token(spec.get("bos", BOS))
