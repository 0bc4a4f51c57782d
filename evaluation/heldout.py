"""The held-out documents of a checkpoint's own dataset, found from the checkpoint alone.

python eval.py checkpoint=out/rope eval.prepare=true     (prepares them if the data folder is gone)
"""

import json
from pathlib import Path

from data.loader import TokenSplit
from data.prepare import data_dir, load_meta, prepare
from utils.errors import UserError


def held_out_documents(ckpt: dict, allow_prepare: bool):
    """The checkpoint's own held-out documents, from the prepared folder it names (or its config)."""
    folder = Path(ckpt["data_dir"])
    if not (folder / "meta.json").exists():
        folder = data_dir(ckpt["config"]["data"], ckpt["config"]["tokenizer"])
    if not (folder / "meta.json").exists():
        if not allow_prepare:
            raise UserError(
                f"the held-out data of this checkpoint is not prepared at {folder}; add eval.prepare=true "
                f"to prepare it from the checkpoint's data config"
            )
        folder = prepare(ckpt["config"]["data"], ckpt["config"]["tokenizer"])
    if json.loads((folder / "tokenizer.json").read_text()) != ckpt["tokenizer"]:
        raise UserError(f"the data at {folder} was tokenized differently from this checkpoint; re-prepare it")
    load_meta(folder)
    return TokenSplit(folder, "val").documents()
