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


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path, known: set[str]) -> set[str]:
    """The project modules a file imports, by their full names (a relative import resolved in its package)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                root = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{root}.{base}".strip(".")
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return (found & known) - {name}


def test_no_module_imports_itself_through_others():
    """No import circle inside a layer either (model/attention.py and model/flex.py imported each other): follow
    every import statement, deferred ones too, from every module, and never come back to where it started."""
    paths = {module_name(p): p for p in modules()}
    graph = {name: imports(path, set(paths)) for name, path in paths.items()}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            assert name != start, f"{start} imports itself through {sorted(seen)}"
            if name not in seen:
                seen.add(name)
                todo.extend(graph[name])


MAX_LINES = 500  # a file read in one sitting


def test_no_module_is_longer_than_a_sitting():
    lines = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in modules()}
    assert not {p: n for p, n in lines.items() if n > MAX_LINES}, f"split by idea: files over {MAX_LINES} lines"
