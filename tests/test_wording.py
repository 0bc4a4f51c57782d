"""The repository speaks of the product only: no words about how, or in what steps, it was developed.

python -m pytest -q tests/test_wording.py
Reads every file git knows (tracked, or new and not ignored, so a document fails before it is committed), except
binary and data files, and fails on references to a tracker's items, on the units of development work, and on words
about the machines used to develop it (PATTERNS lists what each pattern catches). A hex colour or a link's fragment is
not a tracker reference.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA_SUFFIXES = {".png", ".pt", ".json", ".jsonl", ".bin"}  # binary or data: nobody reads them as prose

# The words looked for are spelled in pieces, so that no line of this file reads as the prose it refuses.
UNIT, ITEM, H = "ses" + "sion", "is" + "sue", "#"
LENT, LEND, TOOL = "le" + "nt", "le" + "nd", "dev" + "ice tool"
PATTERNS = {
    # "#" and 1-3 digits standing alone: not in a word, a URL fragment, an HTML entity, a quoted colour or "$#"
    "tracker reference": rf"(?<![\w&{H}/\"'=$]){H}\d{{1,3}}(?![\w-])|\b{ITEM}s? ?{H}?\d+\b",
    "unit of development work": rf"\b{UNIT}s?\b",
    "tracker item": rf"\bthe {ITEM}\b",  # "the ...'s bar", "where the ... placed it"
    "borrowed machine": rf"\b{LENT} GPUs?\b|\bGPUs? {LENT}\b|\bGPU {LEND}ing\b",
    "tool that lends it": rf"\b{TOOL}\b",
}
FLAGGED = [
    text.format(h=H, s=UNIT, S=UNIT.capitalize(), i=ITEM, I=ITEM.capitalize(), lent=LENT, tool=TOOL)
    for text in [
        "RoPE did not learn it ({h}17)",
        "see bench/RESULTS.md, {h}19.",
        "{I} {h}14 on a {lent} GPU",
        "the learned-bias family ({i} 15)",
        "{i}s 15 and 16",
        "measured in the fifth {s}",
        "{S}s ran side by side",
        'pytest.fixture(scope="{s}")',
        "the {i}'s bar is not met",
        "It lives here, not where the {i} placed it",
        "a GPU {lent} for a day",
        "the {tool}'s limit",
    ]
]
CLEAN = [
    'ax.plot(x, y, color="#1f77b4")',
    "colors = ['" + H + "000', '" + H + "ff7f0e']",
    "fill: #1f77b4;",
    "https://github.com/owner/repo/blob/main/a.py#L10",
    "[evaluation](docs/evaluation.md#passkey-retrieval)",
    "http://example.org/page#12",
    "&" + H + "39;quoted&" + H + "39;",
    '[ $# -gt 0 ] || { echo "${#failed[@]} failed"; }',
    "# 2 nodes: run on each",
    "a tissue of 12 layers; no " + ITEM + "s found",
]
RULES = [(kind, re.compile(pattern, re.IGNORECASE)) for kind, pattern in PATTERNS.items()]


def offences(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, the line) for every line of text that speaks of the development process."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for kind, rule in RULES:
            if rule.search(line):
                found.append((number, kind, line.strip()))
    return found


def repository_files() -> list[Path]:
    """Every file git knows here, tracked or new and not ignored; the test is skipped outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of the repository's files")
    paths = sorted({ROOT / name for name in out.decode().split("\0") if name})
    return [p for p in paths if p.is_file() and p.suffix not in DATA_SUFFIXES]  # a deleted file is still listed


def prose(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


@pytest.mark.parametrize("text", FLAGGED)
def test_a_reference_to_the_development_process_is_flagged(text):
    assert offences(text), text


@pytest.mark.parametrize("text", CLEAN)
def test_colours_links_and_shell_are_not_flagged(text):
    assert not offences(text), offences(text)


def test_this_file_passes_its_own_check_read_in_full():
    own = Path(__file__).resolve()
    assert not offences(own.read_text()), offences(own.read_text())


def test_no_file_speaks_of_the_development_process():
    found = []
    for path in repository_files():
        text = prose(path)
        for number, kind, line in offences(text) if text is not None else []:
            found.append(f"{path.relative_to(ROOT)}:{number}: {kind}: {line[:120]}")
    assert not found, f"{len(found)} lines speak of the development process:\n" + "\n".join(found)
