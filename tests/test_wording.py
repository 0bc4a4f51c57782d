"""The repository speaks of the product only: no words about how, or in what steps, it was developed.

python -m pytest -q tests/test_wording.py
Reads every file git knows (tracked, or new and not ignored, so a document fails before it is committed), except
binary and data files and the pattern block below, and fails on references to a tracker's issues, on the units of
development work, and on words about the machines lent to develop it (the block lists what each pattern catches). A
hex colour or a link's fragment is not an issue reference.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA_SUFFIXES = {".png", ".pt", ".json", ".jsonl", ".bin"}  # binary or data: nobody reads them as prose

# wording: pattern block begins (the one place in the repository these words may stand)
PATTERNS = {
    # "#" and 1-3 digits standing alone: not in a word, a URL fragment, an HTML entity, a quoted colour or "$#"
    "issue reference": r"(?<![\w&#/\"'=$])#\d{1,3}(?![\w-])|\bissues? ?#?\d+\b",
    "development session": r"\bsessions?\b",
    "the issue": r"\bthe issue\b",  # "the bar", "where the issue placed it"
    "lent GPU": r"\blent GPUs?\b|\bGPUs? lent\b|\bGPU lending\b",
    "device tool": r"\bdevice tool\b",
}
FLAGGED = [
    "RoPE did not learn it (#17)",
    "see bench/RESULTS.md, #19.",
    "Issue #14 on a lent GPU",
    "the learned-bias family (issue 15)",
    "issues 15 and 16",
    "measured in the fifth session",
    "Sessions ran side by side",
    'pytest.fixture(scope="session")',
    "the issue's bar is not met",
    "It lives here, not where the issue placed it",
    "a GPU lent for a day",
    "the device tool's limit",
]
CLEAN = [
    'ax.plot(x, y, color="#1f77b4")',
    "colors = ['#000', '#ff7f0e']",
    "fill: #1f77b4;",
    "https://github.com/owner/repo/blob/main/a.py#L10",
    "[evaluation](docs/evaluation.md#passkey-retrieval)",
    "http://example.org/page#12",
    "&#39;quoted&#39;",
    '[ $# -gt 0 ] || { echo "${#failed[@]} failed"; }',
    "# 2 nodes: run on each",
    "a tissue of 12 layers; no issues found",
]
# wording: pattern block ends
RULES = [(kind, re.compile(pattern, re.IGNORECASE)) for kind, pattern in PATTERNS.items()]
BLOCK = re.compile(r"^# wording: pattern block begins.*?^# wording: pattern block ends$", re.MULTILINE | re.DOTALL)


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
    """The file's text, or None for a binary file; this test's own pattern block is left out."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    text = data.decode("utf-8", errors="replace")
    return BLOCK.sub("", text) if path == Path(__file__).resolve() else text


@pytest.mark.parametrize("text", FLAGGED)
def test_a_reference_to_the_development_process_is_flagged(text):
    assert offences(text), text


@pytest.mark.parametrize("text", CLEAN)
def test_colours_links_and_shell_are_not_flagged(text):
    assert not offences(text), offences(text)


def test_the_pattern_block_is_left_out_of_this_file_and_only_it():
    own = Path(__file__).resolve()
    assert BLOCK.search(own.read_text())
    assert offences(own.read_text())  # the samples in the block are flagged when the file is read in full
    assert not offences(prose(own))


def test_no_file_speaks_of_the_development_process():
    found = []
    for path in repository_files():
        text = prose(path)
        for number, kind, line in offences(text) if text is not None else []:
            found.append(f"{path.relative_to(ROOT)}:{number}: {kind}: {line[:120]}")
    assert not found, f"{len(found)} lines speak of the development process:\n" + "\n".join(found)
