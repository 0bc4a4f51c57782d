"""Every setting of every entry point, walked with the boundary values of its type: each value is accepted (and then
within the field's declared range) or refused in one line `<key>=<value> ...; <what to do>` naming the key.

python -m pytest -q tests/test_walk.py
In process: each entry point's config (train, eval, sample, viz, longrope, prepare; every data=, optim=, tokenizer=,
cache= option and every positional= scheme) is composed, settings.py walk() lists its fields, and each field
gets 0, -1, huge, inf, nan, an empty string, a word and a list where its type wants neither, a ${...} that names no
setting, and for a path a missing one, a file, a folder, an unreadable file and an unwritable folder. The override is
applied as Hydra applies it (its error worded as hydra_cli words it), then the entry point's check before any work
runs (utils/schema.py preflight). A value accepted must be in the field's declared range, read from its declaration
(max_new_tokens=-1 is declared, not listed here). A few bad inputs of each entry point also run end to end: exit
status 2, one line on stderr, no traceback, no file of an existing run folder changed.
"""

import copy
import math
import os
import re
import shutil
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
from conftest import ROOT, TINY, config, run
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, ListConfig, OmegaConf

import settings
from model.kv_cache import CacheError
from positional import PositionLimitError
from utils import checks, schema
from utils.errors import UserError, compose_message, group_value_message, groups

HUGE = str(10**18)
NUMBERS = ["0", "-1", HUGE, "1e30", "inf", "-inf", "nan"]
WORDS = ["''", "abc", "[1,2]", "${nosuch}"]  # empty, a word, a list, a reference to no setting
LISTS = ["[]", "[0]", "[-1]", f"[{HUGE}]", "[inf]", "[nan]", "[abc]", "0", "abc"]
PATHS = ["missing", "file", "folder", "unreadable", "unwritable"]


def options_of(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "configs" / group).glob("*.yaml"))


def others(group: str) -> list[list[str]]:
    """group=<option> for each option but the default (train.yaml's defaults list), with what it needs given."""
    default = {k: v for d in OmegaConf.load(ROOT / "configs" / "train.yaml").defaults if isinstance(d, DictConfig)
               for k, v in d.items()}.get(group)  # fmt: skip
    needs = {"data=text": ["data.path={text}"]}
    return [[f"{group}={o}", *needs.get(f"{group}={o}", [])] for o in options_of(group) if o != default]


VARIANTS = {  # entry point -> the override lists whose configs hold every class of its settings
    "train": [[]] + others("data") + others("optim") + others("tokenizer") + others("positional"),
    "eval": [["checkpoint={rope}"]],
    "sample": [["checkpoint={rope}", f"cache={o}"] for o in options_of("cache")],
    "viz": [[]],
    "longrope": [["checkpoint={rope}", "target_length=64"]],
    "prepare": [[]] + others("data"),
}
CASES = [(name, overrides) for name, variants in VARIANTS.items() for overrides in variants]


@pytest.fixture(scope="module")
def places(tmp_path_factory, tiny_checkpoint):
    """The paths the walk fills in: runs to read, and one of each kind of path."""
    root = tmp_path_factory.mktemp("walk")
    text = root / "text.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 400)
    (root / "folder").mkdir()
    (root / "file.txt").write_text("not a checkpoint\n")
    (root / "unreadable.pt").write_text("")
    (root / "unreadable.pt").chmod(0)
    (root / "readonly").mkdir()
    (root / "readonly").chmod(0o555)
    return {
        "rope": str(tiny_checkpoint),
        "text": str(text),
        "missing": str(root / "no" / "such"),
        "file": str(root / "file.txt"),
        "folder": str(root / "folder"),
        "unreadable": str(root / "unreadable.pt"),
        "unwritable": str(root / "readonly" / "sub"),
    }


def kind_of(cls, name: str):
    return settings.value_type(cls, name)


def values_for(cls, f, places) -> list[str]:
    """The boundary values of a field's declared type, as override literals."""
    kind = kind_of(cls, f.name)
    if "group" in f.metadata or is_dataclass(kind):
        return ["0", "-1", "''", "abc"]
    if "files" in f.metadata:
        return [places[p] for p in PATHS] + ["''", "0"]
    origin = typing.get_origin(kind)
    if origin is list or kind is list:
        inner = typing.get_args(kind)[0] if typing.get_args(kind) else typing.Any
        if typing.get_origin(inner) is list:
            return ["[]", "[[0,0]]", "[[-1,5]]", f"[[{HUGE},1]]", "[[inf,1]]", "[[1]]", "[1,2]", "abc"]
        return LISTS
    if kind is str:
        return ["''", "0", "-1", "abc", "[1,2]", "${nosuch}"]
    if kind in (int, float):
        return NUMBERS + WORDS + (["1.5"] if kind is int else [])
    odd = ["0", "-1", "1.5", "inf", "nan", "''", "abc", "[1,2]", "${nosuch}"]  # bool, an enum, Any
    return odd + ["null"] * (kind is typing.Any)  # a mixed type takes null only where it is the default


def declared_ok(f, value) -> bool:
    """Whether the declaration admits value (as composed): its bounds, choices, test, pattern, emptiness, length.
    The test's own reading of the metadata setting() stores, so a walker that skipped a check shows here."""
    meta = f.metadata
    if value is None:  # null is a value of a typed field where its type is optional (Hydra checks that)
        return not (f.type in (typing.Any, "Any") and f.default is not None)
    if isinstance(value, ListConfig | DictConfig):
        value = OmegaConf.to_container(value)
    if "choices" in meta and not any(value == c and type(value) is type(c) for c in meta["choices"]):
        return False
    if "test" in meta and not settings.passes(meta["test"], value):
        return False
    if "match" in meta and not (isinstance(value, str) and re.fullmatch(meta["match"], value)):
        return False
    if meta.get("nonempty") and not value and value != 0:
        return False
    if "length" in meta and len(value) != meta["length"]:
        return False
    bounds = {"ge": float.__ge__, "gt": float.__gt__, "le": float.__le__, "lt": float.__lt__}
    for x in value if isinstance(value, list) else [value]:
        for name, op in bounds.items():
            if name in meta and not (settings.number(x) and math.isfinite(x) and op(float(x), float(meta[name]))):
                return False
    return True


def outcome(base: DictConfig, name: str, overrides: list[str], override: str) -> tuple[DictConfig | None, str | None]:
    """(the config, None) if the entry point would go on with override applied, else (None, its one-line refusal).
    A group's option composes afresh (the defaults list changes); a value is applied to the composed config as Hydra
    applies an override."""
    key = override.partition("=")[0]
    try:
        if key in GROUPS[name]:
            with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
                cfg = compose(name, overrides=[*overrides, override])
        else:
            cfg = copy.deepcopy(base)
            ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides([override]), cfg)
    except CompactHydraException as e:
        return None, compose_message(e, name)
    except ValueError as e:  # group=<a number>: Hydra's bare ValueError, which hydra_cli words
        if not str(e).startswith("Config group override must be"):
            raise
        return None, group_value_message([override])
    try:
        checks.preflight(cfg)
    except (UserError, PositionLimitError, CacheError) as e:
        return None, str(e)
    return cfg, None


GROUPS = {name: groups(name) for name in VARIANTS}  # positional=..., optim=...: a defaults list's choice
FORM = re.compile(r"~?[A-Za-z_][\w.\[\]]*=\S")  # <key>=<value> ..., then "; <what to do>"


def bad_message(message: str, key: str) -> str | None:
    """Why a refusal is not one line `<key>=<value> ...; <what to do>` naming key, or None."""
    if "\n" in message:
        return "more than one line"
    if not FORM.match(message) or "; " not in message:
        return "not of the form <key>=<value> ...; <what to do>"
    if not re.search(rf"(^|[\s(~]){re.escape(key)}(\[\d+\])*=", message):
        return f"does not name {key}="
    return None


def walk_cases(base: DictConfig, seen: set):
    """(key, class, field) for every field walk() reaches in base, each field object once per entry point."""
    for prefix, _node, cls in settings.walk(base):
        for f in fields(cls):
            if id(f) not in seen:
                seen.add(id(f))
                yield f"{prefix}{f.name}", cls, f


@pytest.mark.parametrize("name, overrides", CASES, ids=[" ".join([n, *o]) for n, o in CASES])
def test_every_value_of_every_setting_is_accepted_in_range_or_refused_in_one_line(name, overrides, places):
    overrides = [o.format(**places) for o in overrides]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        base = compose(name, overrides=overrides)
    checks.preflight(base)  # the variant itself passes
    first = VARIANTS[name][0]  # walked there: a variant walks what its option adds
    seen = set() if overrides == [o.format(**places) for o in first] else set(map(id, fields_of(name, first, places)))
    failures, walked = [], 0
    for key, cls, f in walk_cases(base, seen):
        for value in values_for(cls, f, places):
            walked += 1
            cfg, message = outcome(base, name, overrides, f"{key}={value}")
            if message is not None:
                if why := bad_message(message, key):
                    failures.append(f"{key}={value}: {why}: {message}")
            elif not declared_ok(f, OmegaConf.select(cfg, key)) and "group" not in f.metadata:
                failures.append(f"{key}={value} accepted as {OmegaConf.select(cfg, key)!r}, outside its declaration")
    assert not failures, "\n".join(failures)
    assert walked or seen, "nothing walked"  # a variant may add no class (irope: rope's options, preset)


def fields_of(name: str, overrides: list[str], places) -> list:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        base = compose(name, overrides=[o.format(**places) for o in overrides])
    return [f for _, _, cls in settings.walk(base) for f in fields(cls)]


def test_every_field_declares_its_type_and_range():
    """Every setting of every entry point, group option and scheme: a bool, a choice (an enum), a sub-config or a
    group's option, or a setting() whose declaration bounds it (a range, choices, a test, a pattern, a path)."""
    undeclared = []
    checked = {"ge", "gt", "le", "lt", "choices", "test", "match", "nonempty", "length", "files", "group"}
    classes = {*schema.ENTRY_POINTS.values(), *(c for options in schema.GROUPS.values() for c in options.values())}
    seen = set()
    while classes:
        cls = classes.pop()
        seen.add(cls)
        for f in fields(cls):
            kind = kind_of(cls, f.name)
            if is_dataclass(kind):
                classes |= {kind} - seen
                continue
            enum = isinstance(kind, type) and issubclass(kind, __import__("enum").Enum)
            if not (kind is bool or enum or checked & set(f.metadata)):
                undeclared.append(f"{cls.__name__}.{f.name}")
    assert not undeclared, f"settings with no declared range: {undeclared}"


# ---- end to end: each entry point as a user runs it ----


def snapshot(*folders) -> dict:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for f in folders for p in sorted(Path(f).rglob("*"))}


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory, shakespeare_dir):
    """A tiny learned-table model (32 positions), trained 1 step."""
    from train import train

    out = tmp_path_factory.mktemp("learned")
    train(config(*TINY, "positional=learned", "train.max_steps=1", "train.warmup_steps=0"), out)
    return out


TRAIN = ["train.py", *TINY, "train.max_steps=2", "train.warmup_steps=1"]
E2E = [  # (command, what the one line must hold); {rope}, {learned}, {file}, {folder}, {run}: paths filled in
    (TRAIN + ["out_dir={run}", "positional=irope"], "positional.layers=PPPN is longer than the network"),
    (TRAIN + ["out_dir={file}"], "out_dir="),
    (TRAIN + ["out_dir={run}", "+train.foo=1"], "train.foo is not an option of train"),
    (["train.py", "-m", *TINY, "train.seq_len=32,0", "hydra.sweep.dir={sweep}"], "(job 2 of 2: train.seq_len=0)"),
    (["train.py", "-m", *TINY, "positional=rope,alibii", "hydra.sweep.dir={sweep}"], "positional=alibii"),
    (["train.py", "-m", *TINY, "seed=1,2", "hydra.sweep.dir={file}"], "hydra.sweep.dir="),
    (TRAIN + ["out_dir={run}", "logger.wandb=true", "logger.mode=online"], "logger.mode=online"),
    (["eval.py", "checkpoint={rope}", "sweep_dir={folder}", "logger.wandb=false"], "checkpoint="),
    (["eval.py", "checkpoint={learned}", "eval.lengths=[64,128]", "logger.wandb=false"], "eval.lengths=[64, 128]"),
    (["eval.py", "checkpoint={rope}", "positional=alibi"], "positional=alibi: eval.py reads positional"),
    (["eval.py", "checkpoint={rope}", "eval.mode=stream", "cache.sinks=100"], "cache.sinks=100"),
    (["sample.py", "checkpoint={rope}", "temperature=1e-30"], "temperature=1e-30"),
    (["sample.py", "checkpoint={rope}", "prompt=${{foo}}"], "prompt=${{foo}} cannot be resolved"),
    (["sample.py", "checkpoint={rope}", "prompt=it's"], "prompt=it's cannot be parsed"),
    (["sample.py", "checkpoint={rope}", "cache=sink", "cache.sinks=100"], "cache.sinks=100"),
    (["viz.py", "viz.factor=1e30", "viz.out={folder}"], "viz.factor=1e+30"),
    (["viz.py", "viz.out={file}"], "viz.out="),
    (["-m", "evaluation.longrope_search", "checkpoint={rope}", "target_length=16"], "target_length=16"),
    (["-m", "data.prepare", "+foo=1"], "foo is not an option"),
]


@pytest.mark.parametrize("args, needle", E2E, ids=[" ".join(a[:1] + a[-2:]) for a, _ in E2E])
def test_bad_input_end_to_end_is_one_line_and_changes_no_run(args, needle, places, learned_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(places["rope"], run_dir)
    paths = {**places, "learned": str(learned_run), "run": str(run_dir), "sweep": str(tmp_path / "sweep")}
    runs = [places["rope"], learned_run, run_dir]
    before = snapshot(*runs)
    env = {"WANDB_API_KEY": "", "WANDB_MODE": "", "HOME": str(tmp_path)}  # no key: online must be refused
    proc = run(*(a.format(**paths) for a in args), timeout=120, env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert needle.format(**paths) in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert snapshot(*runs) == before  # nothing written into a run folder
    assert not (tmp_path / "sweep").exists()  # a sweep refused before its first job made anything


def test_an_unwritable_out_dir_is_one_line(tmp_path):
    """A folder no permission check can foresee (a read-only or virtual filesystem refuses what the mode bits
    allow; as root, even a 555 folder is writable): Hydra's own mkdir of the run folder, worded."""
    target = "/proc/nanopos/out" if os.geteuid() == 0 else str(tmp_path / "ro" / "out")
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o555)
    proc = run(*TRAIN, f"out_dir={target}", timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: out_dir={target} "), proc.stderr


# ---- the figures of what was asked past what a run can do ----


def shown_labels(axis) -> list[str]:
    """The tick labels an axis shows within its limits (major and minor), as drawn."""
    lo, hi = sorted(axis.get_view_interval())
    ticks = [*axis.get_majorticklocs(), *axis.get_minorticklocs()]
    labels = [*axis.get_ticklabels(), *axis.get_ticklabels(minor=True)]
    return [t.get_text() for x, t in zip(ticks, labels, strict=True) if t.get_text() and lo <= x <= hi]


@pytest.mark.parametrize("first, last", [(300, 700), (16, 64), (110, 950), (100, 12800)])
def test_a_log_axis_shows_plain_numbers_even_within_one_decade(figures, tmp_path, first, last):
    """A stream's tokens seen and the NLL by position, on log axes spanning less than a decade and more: at least
    two labels, each a plain number (not 3 x 10^2, nor no label at all)."""
    from evaluation import plots

    block, n = first, last // first
    methods = {"dense": {"nll": [4.0] * n, "ci": [[50.0, 60.0]] * n}}
    plots.plot_stream({"methods": methods, "block": block, "train_length": first, "scheme": "rope"}, tmp_path / "s.png")
    rows = [{"scheme": "rope", "variant": "none", "length": 256, "mode": m, "ppl": 40.0, "ci": [38.0, 42.0]}
            for m in plots.MODES]  # fmt: skip
    by_position = {"256": [(p, 4.0) for p in range(first - 1, last, max(1, (last - first) // 20))]}
    plots.plot(rows, 256, tmp_path / "length.png", "rope", by_position)
    for fig in figures:
        fig.canvas.draw()
        for ax in fig.axes:
            if ax.get_xscale() == "log" and ax.get_xlabel().startswith(("tokens seen", "position")):
                labels = shown_labels(ax.xaxis)
                assert len(labels) >= 2 and all(re.fullmatch(r"\d+(\.\d+)?", t) for t in labels), labels


def test_a_length_past_a_learned_table_is_marked_na_and_a_table_of_nothing_draws_no_empty_plot(figures, tmp_path):
    from evaluation import plots

    note = "n/a: learned table covers 32 positions"
    rows = [{"scheme": "learned", "variant": "none", "length": n, "mode": m, "ppl": 50.0 if n <= 32 else None,
             "ci": [45.0, 55.0] if n <= 32 else None, **({} if n <= 32 else {"note": note})}
            for n in (16, 32, 64) for m in plots.MODES]  # fmt: skip
    plots.plot(rows, 32, tmp_path / "some.png", "learned")
    plots.plot([r for r in rows if r["ppl"] is None], 32, tmp_path / "none.png", "learned")
    some, none = figures
    assert [t.get_text() for t in some.axes[0].get_xticklabels()] == ["16", "32", "64\nn/a"]
    for fig in (some, none):
        assert "n/a at 64 (learned table covers 32 positions)" in fig._suptitle.get_text()
