"""Every interval written by hand in dev/LOG.md, docs/*.md, bench/RESULTS.md and README.md is in the evidence its
entry names, to its rounding.

python -m pytest -q tests/test_quoted_intervals.py
An entry is a section of a page (from one `##` or `###` heading to the next); its evidence is every JSON file under
each `results/<folder>` the entry names. A quote is `[lo, hi]` with a decimal point, optionally after its value
(`-0.460 nats [-0.499, -0.422]`, `0.4349 ± 0.0300 [...]`), outside the tables evaluation/doc_tables.py writes (tests/
test_docs.py holds those). It is found when one record of the evidence holds lo and hi, and the value where one is
quoted, each within half a unit of the quote's last digit: a list [lo, hi] with the numbers beside it, or a dict with
`lo` and `hi` (a paired difference), read in either direction (a - b, or b - a with its interval negated). An entry
that says its runs are "not kept in `results/`" may quote what no stored file holds. It checks numbers, not which
rows they belong to: a quote that rounds to another record of the same evidence passes.
"""

import json
import re
from functools import cache

import pytest
from conftest import ROOT

PAGES = [
    "dev/LOG.md",
    "bench/RESULTS.md",
    "README.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
]
NUM = r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?"
QUOTE = re.compile(rf"(?:(?P<value>{NUM})(?:\s+nats)?(?:\s+±\s?{NUM})?\s+)?\[(?P<lo>{NUM}),\s+(?P<hi>{NUM})\]")
GENERATED = re.compile(r"<!-- table: [\w-]+ -->\n.*?<!-- /table -->", re.S)
NOT_KEPT = "not kept in `results/`"


def entries(text: str) -> list[str]:
    """The sections of a page, less the generated tables."""
    return re.split(r"^(?=##+ )", GENERATED.sub("", text), flags=re.M)


def quotes(entry: str) -> list[re.Match]:
    return [m for m in QUOTE.finditer(entry) if "." in m["lo"] + m["hi"]]  # [1, 16] is a range, not an interval


def is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def records(tree, out: list) -> list:
    """(lo, hi, the numbers beside them) for every interval in a JSON tree; a paired difference also reversed."""
    if isinstance(tree, dict):
        beside, children = [v for v in tree.values() if is_number(v)], list(tree.values())
        if is_number(tree.get("lo")) and is_number(tree.get("hi")):
            out += [(tree["lo"], tree["hi"], beside), (-tree["hi"], -tree["lo"], [-v for v in beside])]
    elif isinstance(tree, list):
        beside, children = [v for v in tree if is_number(v)], tree
    else:
        return out
    for child in children:
        if isinstance(child, list) and len(child) == 2 and all(map(is_number, child)):
            out.append((child[0], child[1], beside))
        records(child, out)
    return out


@cache
def evidence(folder: str) -> list:
    return [
        r
        for path in sorted((ROOT / "results" / folder).rglob("*.json"))
        for r in records(json.loads(path.read_text()), [])
    ]


def rounds_to(x: float, quoted: str) -> bool:
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(x - float(quoted.replace(",", ""))) <= 0.5 * 10**-digits + 1e-9


def found(quote: re.Match, held: list) -> bool:
    return any(
        rounds_to(lo, quote["lo"])
        and rounds_to(hi, quote["hi"])
        and (quote["value"] is None or any(rounds_to(v, quote["value"]) for v in beside))
        for lo, hi, beside in held
    )


def missing(entry: str) -> list[str]:
    """The quotes of an entry that its evidence does not hold (none where it says its runs are not kept)."""
    if NOT_KEPT in " ".join(entry.split()).lower():
        return []
    held = [r for folder in dict.fromkeys(re.findall(r"results/([\w.-]+)", entry)) for r in evidence(folder)]
    return [" ".join(m[0].split()) for m in quotes(entry) if not found(m, held)]


def cases() -> list:
    out = []
    for page in PAGES:
        for entry in entries((ROOT / page).read_text()):
            if quotes(entry):
                out.append(pytest.param(entry, id=f"{page}: {entry.splitlines()[0][:60]}"))
    return out


@pytest.mark.parametrize("entry", cases())
def test_every_quoted_interval_is_in_the_evidence_its_entry_names(entry):
    assert not missing(entry), "not in " + ", ".join(
        sorted(set(re.findall(r"results/[\w.-]+", entry))) or ["no results/"]
    )


def test_a_miscopied_end_a_flipped_sign_and_unnamed_evidence_are_caught():
    """yarn-ramps holds yarn_released - llama3 at 1024 as -0.00418 [-0.01449, 0.00619], and ntk - yarn_released at 2048
    as +0.02886 [0.00945, 0.04814]: a quote must round from them, and a difference may be read either way."""
    entry = "## x\nEvidence: `results/yarn-ramps`. {}"
    assert not missing(entry.format("-0.004 [-0.014, +0.006] at 1024; -0.029 [-0.048, -0.009], the other way round"))
    assert missing(entry.format("-0.004 [-0.015, 0.006]")) == ["-0.004 [-0.015, 0.006]"]  # as first copied
    assert missing(entry.format("-0.029 [-0.048, -0.010]")) == ["-0.029 [-0.048, -0.010]"]
    assert missing(entry.format("+0.029 [-0.048, -0.009]"))  # the value's sign against its interval's
    assert missing("## x\nno evidence named: 0.5 [0.4, 0.6]") and not missing(
        "## x\nNot kept in\n`results/`: [0.4, 0.6]"
    )
    found_here = quotes("window 0+257 - sinks 1+256, [0.0001, 0.0008]; samples in [1, 16]")
    assert [m[0] for m in found_here] == ["[0.0001, 0.0008]"]
