"""The held-out documents of a checkpoint's own dataset, found from the checkpoint alone; one per distinct work.

python eval.py checkpoint=out/rope eval.prepare=true     (prepares them if the data folder is gone)
The Shakespeare split holds every play twice, in modern and in First Folio spelling: near-duplicates, so the
evaluations draw from one document of each work. A model fine-tuned on data=passkey is evaluated on its corpus's
held-out works (data.base): the passkey samples are short, and drawn from the training split.
"""

from pathlib import Path

import numpy as np

from data import sources, tokenizer
from data.loader import TokenSplit
from data.prepare import data_dir, prepare
from utils.errors import UserError


def corpus(data: dict) -> dict:
    """data=passkey's corpus (data.base), else data."""
    return data["base"] if data.get("source") == "passkey" else data


def held_out_folder(ckpt: dict, allow_prepare: bool) -> Path:
    """The prepared folder the checkpoint names (or its config does), prepared here if asked."""
    data, tok = corpus(ckpt["config"]["data"]), ckpt["config"]["tokenizer"]
    folder = Path(ckpt["data_dir"])
    if data is not ckpt["config"]["data"] or not (folder / "meta.json").exists():
        folder = data_dir(data, tok)
    if not (folder / "meta.json").exists():
        if not allow_prepare:
            raise UserError(
                f"the held-out data of this checkpoint is not prepared at {folder}; add eval.prepare=true "
                f"to prepare it from the checkpoint's data config"
            )
        folder = prepare(data, tok)
    if tokenizer.read_spec(folder) != ckpt["tokenizer"]:
        raise UserError(f"the data at {folder} was tokenized differently from this checkpoint; re-prepare it")
    return folder


def document_names(data: dict, n_docs: int) -> list[str]:
    """A name per held-out document: Shakespeare's file stems (in prepare's order) from the corpus, else doc<i>."""
    if data.get("source") == "shakespeare":
        try:
            stems = [stem for stem, _ in sources.shakespeare_documents(data, "val")]
        except UserError:  # the corpus package is gone since the data was prepared: no names to be had
            stems = []
        if len(stems) == n_docs:
            return stems
    return [f"doc{i}" for i in range(n_docs)]


def distinct_works(names: list[str], source: str | None) -> list[int]:
    """Indices of the first document of each work (Shakespeare: the modern spelling, whose stem sorts first)."""
    first = {}
    for i, name in enumerate(names):
        first.setdefault(sources.work_of(name) if source == "shakespeare" else name, i)
    return list(first.values())


def held_out_works(ckpt: dict, allow_prepare: bool) -> list[tuple[str, np.ndarray]]:
    """(name, tokens) of one held-out document per distinct work (BOS first), so no text is scored twice."""
    docs = TokenSplit(held_out_folder(ckpt, allow_prepare), "val").documents()
    data = corpus(ckpt["config"]["data"])
    names = document_names(data, len(docs))
    return [(names[i], docs[i]) for i in distinct_works(names, data.get("source"))]
