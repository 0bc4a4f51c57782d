"""Grids: elementary cellular automata written as token grids, with row and column position ids (offline, seeded).

python train.py data=grids positional=rope2d         (GridsData below: 16 rows of 14 cells, 256 tokens)
python eval.py checkpoint=out/rope2d eval.mode=grids  (held-out grids at the training size, taller, wider, both)
A grid is one document: BOS, then `height` rows of a left wall `|`, `width` cells (`.` dead, `#` alive) and a right
wall (a newline: a decoded document prints the grid). Row 0 is random, each later row the automaton data.rule
(Wolfram's numbering) of the row above, walls read as dead: a cell depends on three cells at fixed 2D offsets, at a
raster distance that holds at one width only (why this task: docs/data.md). Position ids are M-RoPE's for an image
after text (Qwen2-VL): BOS at (0, 0, 0), row r and column j (0 the left wall) at (1, 1 + r, 1 + j).
"""

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from data.loader import write_splits
from data.tokenizer import BOS
from settings import UserError, setting
from utils.schema import MAX_COUNT, Corpus, Source, fixed, folder_name, seed

CHARS = ".#|\n"  # dead, alive, left wall, right wall; BOS is id len(CHARS)
DEAD, ALIVE, LEFT, RIGHT = range(4)
AXES = 3  # (temporal, height, width)


def tokenizer_spec() -> dict:
    """A tiktoken spec of one token per character of CHARS, plus BOS."""
    ranks = {base64.b64encode(c.encode()).decode(): i for i, c in enumerate(CHARS)}
    return {"kind": "grid", "pattern": r"[\s\S]", "ranks": ranks, "special": {BOS: len(CHARS)}}


def evolve(first: np.ndarray, height: int, rule: int) -> np.ndarray:
    """(height, width) 0/1 cells: `first` as row 0, then the automaton `rule`, dead cells past the walls."""
    table = np.array([(rule >> i) & 1 for i in range(8)], dtype=np.uint8)  # bit i: the cell for neighbourhood i
    rows = [first.astype(np.uint8)]
    for _ in range(height - 1):
        padded = np.pad(rows[-1], 1)
        rows.append(table[4 * padded[:-2] + 2 * padded[1:-1] + padded[2:]])
    return np.stack(rows)


def random_grid(rng: np.random.Generator, height: int, width: int, rule: int, density: float) -> np.ndarray:
    return evolve((rng.random(width) < density).astype(np.uint8), height, rule)


def tokens(cells: np.ndarray) -> np.ndarray:
    """BOS, then each row as left wall, cells, right wall: 1 + height x (width + 2) ids."""
    walled = np.pad(cells, ((0, 0), (1, 1)), constant_values=(LEFT, RIGHT))
    return np.concatenate(([len(CHARS)], walled.ravel())).astype(np.int64)


def positions(height: int, width: int) -> np.ndarray:
    """(3, 1 + height x (width + 2)) ids: BOS at (0, 0, 0), grid row r and column j at (1, 1 + r, 1 + j)."""
    rows, cols = np.meshgrid(np.arange(height), np.arange(width + 2), indexing="ij")
    grid = np.stack((np.ones(rows.size, dtype=np.int64), 1 + rows.ravel(), 1 + cols.ravel()))
    return np.concatenate((np.zeros((AXES, 1), dtype=np.int64), grid), axis=1)


def write(tmp: Path, data: dict, log, base=None):
    """data=grids into tmp: data.train_docs and data.val_docs grids, seeded by (data.seed, split)."""
    height, width, rule = data["height"], data["width"], data["rule"]
    meta = {"vocab_size": len(CHARS) + 1, "bos": len(CHARS), "dtype": "uint8", "position_axes": AXES}
    pos = positions(height, width)

    def docs(i, split):
        rng = np.random.default_rng([int(data["seed"]), i])
        cells = (random_grid(rng, height, width, rule, data["density"]) for _ in range(int(data[f"{split}_docs"])))
        return ((tokens(c), pos) for c in cells)

    write_splits(tmp, data, tokenizer_spec(), meta, docs, f"grids of {height} x {width} (rule {rule})", log)


@dataclass
class GridsData(Corpus):
    """Automaton grids with (temporal, height, width) ids (this module); train.seq_len must be height x (width + 2)."""

    name: str = folder_name("grids")
    source: Source = fixed("grids", "data")
    height: int = setting(16, "pass at least 2 rows: row 0 is random, the rest follow the rule", ge=2, le=4096)
    width: int = setting(14, "pass at least 1 cell per row", ge=1, le=4096)  # between a left and a right wall token
    rule: int = setting(30, "pass an elementary automaton's number (e.g. 30, 90, 110)", ge=0, le=255)  # Wolfram's
    density: float = setting(0.5, "pass a probability, e.g. 0.5", gt=0, lt=1)  # the chance a cell of row 0 lives
    # training grids (400 steps of 32 rows read 12,800)
    train_docs: int = setting(16000, "pass how many training grids to generate", ge=1, le=MAX_COUNT)
    # held-out grids of the same size, for val_loss (eval.mode=grids draws its own, any size)
    val_docs: int = setting(256, "pass how many held-out grids to generate", ge=1, le=MAX_COUNT)
    seed: int = seed()  # grids from generators seeded by (seed, split)
    bos_aligned: bool = True  # always: rows with position ids are whole documents (data/loader.py)
    eval_mode: ClassVar = "grids"

    @staticmethod
    def check_rows(data, seq_len: int):
        """A training row holds exactly one grid: BOS, then height rows of width cells between two wall tokens."""
        tokens = data.height * (data.width + 2)
        if seq_len != tokens:
            raise UserError(
                f"train.seq_len={seq_len}: a row holds one grid, {data.height} rows of {data.width} cells and 2 "
                f"walls = {tokens} tokens after BOS; pass train.seq_len={tokens}"
            )
