"""The layers import downward only: settings -> positional -> model -> utils -> data -> evaluation -> gallery,
analyses -> bench and the entry points. A module may import its own layer and those below it, never one above (a
circle between layers would make a scheme depend on the training loop that runs it).

python -m pytest -q tests/test_layering.py
Every import statement counts, those inside functions too: a deferred import is still a dependency.
"""

import ast

import pytest
from conftest import ROOT

LAYERS = [  # tuples, not sets: the tests' order must not depend on hashing (pytest -n compares it across workers)
    ("settings",),
    ("positional",),
    ("model",),
    ("utils",),
    ("data",),
    ("evaluation",),
    ("gallery", "analyses"),
    ("bench", "train", "eval", "sample", "viz"),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def modules():
    for name in RANK:
        folder = ROOT / name
        yield from sorted(folder.glob("*.py")) if folder.is_dir() else [ROOT / f"{name}.py"]


def imported(path) -> set[str]:
    """The top-level names of the project's modules that a file imports (relative imports stay in its package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & RANK.keys()


def layer_of(path) -> str:
    return path.parent.name if path.parent != ROOT else path.stem


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_module_imports_no_layer_above_its_own(path):
    own = layer_of(path)
    above = sorted(name for name in imported(path) if RANK[name] > RANK[own])
    assert not above, f"{path.relative_to(ROOT)} ({own}) imports {above}, a layer above it"


def test_the_walk_finds_every_layer():
    """A renamed or moved folder would leave its modules unchecked."""
    found = {layer_of(p) for p in modules()}
    assert found == RANK.keys(), sorted(RANK.keys() - found)
