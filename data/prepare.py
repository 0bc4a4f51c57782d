"""Text -> tokenizer -> memmapped token shards with document boundaries, once per dataset and tokenizer.

python -m data.prepare data=text data.path=notes/ tokenizer.vocab_size=8192   (train.py does this on first use)
Layout: <data.cache_dir>/<dataset key>/<tokenizer key>/ holds tokenizer.json, meta.json and the shards (data/loader.py).
The folder is built under a temporary name and renamed into place, so a crash never leaves half a dataset.
data=passkey is generated from another prepared corpus, with its tokenizer; data=grids and data=tasks from a seed,
each with a small tokenizer of its own.
"""

import hashlib
import importlib
import itertools
import json
import os
import shutil
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig

from data import tokenizer
from data.loader import seal, write_splits
from utils import checks, files, runtime, schema  # schema registers the types that configs/data/*.yaml name
from utils.errors import UserError, cli, hydra_cli

ROOT = Path(__file__).resolve().parent.parent


def cache_root(data: dict) -> Path:
    """data.cache_dir, else $NANOPOS_DATA, else .cache/data in the repository."""
    root = data.get("cache_dir") or os.environ.get("NANOPOS_DATA") or ROOT / ".cache" / "data"
    try:
        return Path(root).expanduser().resolve()
    except (RuntimeError, OSError) as e:  # a symlink loop: RuntimeError up to Python 3.12, then OSError (ELOOP)
        key = "data.cache_dir" if data.get("cache_dir") else "NANOPOS_DATA" if os.environ.get("NANOPOS_DATA") else ""
        raise UserError(
            f"{key + '=' if key else 'the data cache '}{root} cannot be followed ({e}); point it at a folder, or "
            f"mend the link"
        ) from None


GENERATED = ("grids", "tasks", "passkey")  # data/<source>.py writes them: write(tmp, data, log, base)
LOADER_KEYS = ("name", "bos_aligned", "random_positions")  # options that leave the documents alone: not in the key


def dataset_key(data: dict) -> str:
    """A folder name that changes whenever the documents would."""
    spec = {k: v for k, v in data.items() if k not in LOADER_KEYS}
    if data["source"] == "text":  # the files, not just the pattern
        spec["files"] = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files.text_files(data["path"])]
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{data['name']}-{digest}"


def tokenizer_key(tok: dict) -> str:
    return f"bpe{tok['vocab_size']}" if tok["kind"] == "bpe" else tok["name"]


def data_dir(data: dict, tok: dict) -> Path:
    return cache_root(data) / dataset_key(data) / tokenizer_key(tok)


def prepare(data: dict, tok: dict, log=print) -> Path:
    """The prepared folder for (data, tokenizer), built if needed."""
    out = data_dir(data, tok)
    log = log or (lambda *args: None)
    if (out / "meta.json").exists():
        return out
    base = prepare(data["base"], tok, log) if "base" in data else None  # passkey's corpus, prepared first
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        log(f"preparing {data['name']} with tokenizer {tokenizer_key(tok)} in {out}")
        if data["source"] in GENERATED:  # its module, imported only when asked for
            importlib.import_module(f"data.{data['source']}").write(tmp, data, log, base)
        else:
            write_corpus(tmp, data, tok, log)
        seal(tmp)
        try:
            tmp.rename(out)  # `out` only ever appears whole
        except OSError:
            if not (out / "meta.json").exists():
                raise  # not a concurrent job that finished first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_corpus(tmp: Path, data: dict, tok: dict, log):
    """Train (or fetch) the tokenizer, then tokenize both splits into tmp."""
    from data.sources import documents  # imported only where a folder is made

    if tok["kind"] == "bpe":
        most = f"at most {tok['train_chars']:,} characters"
        log(f"  training a BPE tokenizer of {tok['vocab_size']:,} tokens on the train split ({most})")
        spec = tokenizer.train_bpe(documents(data, "train"), tok["vocab_size"], tok["train_chars"])
    else:
        spec = tokenizer.tiktoken_spec(tok["name"])
    enc = tokenizer.load(spec)
    bos = tokenizer.bos_id(spec, enc)
    meta = {"vocab_size": enc.n_vocab, "bos": bos, "dtype": "uint16" if enc.n_vocab <= 2**16 else "uint32"}

    def docs(i, split):
        batches = _batched(documents(data, split), 256)
        return (np.array([bos, *ids], dtype=np.int64) for batch in batches for ids in enc.encode_ordinary_batch(batch))

    write_splits(tmp, data, spec, meta, docs, "documents", log)


def _batched(items, n: int):
    items = iter(items)
    while batch := list(itertools.islice(items, n)):
        yield batch


@hydra.main(version_base="1.3", config_path="../configs", config_name="prepare")
def main(cfg: DictConfig):
    def run():
        checks.check(cfg)
        print(prepare(schema.plain(cfg.data), schema.plain(cfg.tokenizer)))

    with runtime.raising("the dataset was not prepared, and its half-built folder is removed"):
        cli(run)


if __name__ == "__main__":
    hydra_cli(main)
