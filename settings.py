"""Settings: a config field with its declared range, and the one walker that checks a composed config against them.

python train.py train.seq_len=0          error: train.seq_len=0 must be >= 1; pass a positive length
python train.py positional.bsae=1        error: positional.bsae is not an option of positional=rope (its options: ...)
A field is declared with setting(default, hint, ge=1, ...) or group(name); a check between fields is a Rule in its
class's RULES. problem() walks a composed config and returns the first value outside its range as one line;
files_problem() then checks paths, so a bad value is named before a missing file. Types and choices are OmegaConf's
to check while Hydra composes; invalid() and unknown() word its errors. The bottom layer: it imports no project module.
"""

import difflib
import enum
import math
import operator
import re
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


class UserError(Exception):
    """Bad input: entry points print the message as one line and exit 2 (utils/errors.py cli)."""


BOUNDS = {"ge": (">=", operator.ge), "gt": (">", operator.gt), "le": ("<=", operator.le), "lt": ("<", operator.lt)}
CHECKS = {*BOUNDS, "length", "nonempty", "match", "choices", "test", "must", "files"}
# each config group's options (group name -> option -> class), filled by utils/schema.py: an unknown key is looked for
# in the other options of its group, so data.path under data=shakespeare can say that data=text has it
OPTIONS: dict[str, dict[str, type]] = {}


def choices(name: str, *values: str) -> type[enum.StrEnum]:
    """The type of a field that takes one of these strings (OmegaConf checks it as Hydra composes; a member equals,
    hashes and formats as its string)."""
    return enum.StrEnum(name, {v: v for v in values})


def setting(default, hint: str, **check):
    """A dataclass field whose value is checked by problem(): ge, gt, le, lt (a number, or every number of a list),
    length (a list's exact length), nonempty (a list or a string), match (a regular expression the whole string
    matches), choices (the values a field of mixed type may take), test (a predicate; must: what it asks, "be a ...").
    files: a function of a path that says what is wrong with it ("does not exist") or None, checked by
    files_problem(). hint says what to do, after the "; " of the one-line error. A null value passes where the type
    allows it."""
    assert set(check) <= CHECKS and hint and check, (check, hint)
    metadata = {**check, "hint": hint}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: OmegaConf.to_container(OmegaConf.create(default)), metadata=metadata)
    return field(default=default, metadata=metadata)


def fixed(value: str, group_name: str):
    """The field that says which option of its group a config is (optim.name, data.source): the option's own value,
    set by picking the option (optim=adamw), never alone (optim.name=adamw would keep Muon's settings)."""
    return setting(
        value,
        f"pick another with {group_name}=<option> (configs/{group_name}/)",
        test=lambda v: v == value,
        must=f"be {value}, the option {group_name}= picked",
    )


def group(name: str):
    """A field holding the option of config group `name` (optim=muon): typed by that option's class as Hydra
    composes, walked as a sub-config."""
    return field(default="???", metadata={"group": name, "hint": f"pick one (configs/{name}/)"})  # "???": unset


@dataclass(frozen=True)
class Rule:
    """A check between settings, declared in the RULES of the class that holds them: keys are paths from that class
    (a dot reaches into a sub-config), ok(*their values, *the facts it needs) says whether they fit, and message says
    why not and what to do, its {0}, {1}, ... each key as key=value, {<fact>} each fact. needs: facts only a running
    entry point gives (checks.preflight): running (a rule of what a run needs rather than of what a config may say:
    the docs' commands are composed without it), or those of the checkpoint the config reads (checks.facts:
    train_length, max_positions, n_prefix, run). Such a rule is checked then, and skipped by a walk without them."""

    keys: tuple[str, ...]
    ok: Callable[..., bool]
    message: str
    needs: tuple[str, ...] = ()


def show(value) -> str:
    """A value as it is written on the command line (null, true, [1, 2])."""
    if isinstance(value, DictConfig | ListConfig):
        value = OmegaConf.to_container(value, enum_to_str=True)
    if value is None:
        return "null"
    if value == "":
        return "''"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


def config_type(node):
    """The dataclass a config node (or instance) is, or None for a plain value, list or dict."""
    kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else type(node)
    return kind if is_dataclass(kind) else None


def option_names(cls) -> list[str]:
    """cls's fields, the ones its own class body declares first (a scheme's before those every scheme shares)."""
    names = [f.name for f in fields(cls) if f.name != "name"]
    own = [n for n in cls.__dict__.get("__annotations__", {}) if n in names]
    return own + [n for n in names if n not in own]


def unknown(cls, key: str, parent=None) -> str:
    """The one line for key, which is not a field of cls (a misspelled option, or one added with +): the nearest
    key of cls, or the option of its group that has it, or, for a setting a checkpoint fixes (cls.FROM_CHECKPOINT:
    eval.py's positional), where it is set. Never a +key, which would add a setting that nothing reads. parent: the
    config node that lacks it, which says which option of its group it is (positional=t5)."""
    node, _, name = key.rpartition(".")
    names = option_names(cls)
    option = [getattr(parent if parent is not None else cls, k, None) for k in ("name", "kind")]  # optim=muon
    option = next((o for o in option if isinstance(o, str) and o != "???"), None)
    label = f"{node}={option}" if node and option else node or "this config"
    head = f"{key} is not an option of {label} (its options: {', '.join(names)})"
    if key.partition(".")[0] in getattr(cls, "FROM_CHECKPOINT", ()):
        return (
            f"{key} is a setting of the training run, read from the checkpoint as it was trained; train a run with "
            f"it (python train.py {key}=...) and pass that run as checkpoint="
        )
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.7)
    if near:
        return f"{head}; check the spelling ({node + '.' if node else ''}{near[0]}?)"
    others = [o for o, c in OPTIONS.get(node, {}).items() if o != option and field_of(c, name) is not None]
    if others:
        return f"{head}; {node}={others[0]} has {key}: pick that option ({node}={others[0]} {key}=...)"
    return f"{head}; check the spelling"


def field_of(cls, name: str):
    return next((f for f in fields(cls) if f.name == name), None) if cls else None


def value_type(cls, name: str):
    """The declared type of cls.name, less an Optional's None."""
    return not_optional(typing.get_type_hints(cls).get(name, Any))


def not_optional(kind):
    """A type less an Optional's None (list[float] | None -> list[float])."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        kind = args[0] if len(args) == 1 else Any
    return kind


def wanted(kind, example) -> tuple[str, str]:
    """What a value of this declared type must be, and what to do when it is not."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return f"is not one of {', '.join(m.value for m in kind)}", "pick one"
    if typing.get_origin(kind) is list or kind is list:
        return "must be a list", f"e.g. {show(example) if example else '[1,2]'}"
    if kind is bool:
        return "must be true or false", "pick one"
    if is_dataclass(kind):
        return "holds settings, not a value", "set them one by one (--cfg job prints them)"
    words = {int: "a whole number", float: "a number", str: "a string"}
    return f"must be {words.get(kind, 'a value of type ' + getattr(kind, '__name__', str(kind)))}", "pass one"


def invalid(e, key: str | None = None) -> str:
    """One line for an omegaconf ValidationError (a value of the wrong type, a choice not offered), from its fields:
    the key, the class that declares it, and the value given. An element of a list (optim.betas[0]) is worded by its
    declared element type."""
    key = key or e.full_key
    cls = e.object_type if is_dataclass(e.object_type) else None
    name = key.rpartition(".")[2]
    f = field_of(cls, name)
    example = None if f is None or f.default_factory is MISSING else f.default_factory()
    kind = value_type(cls, name) if f else Any
    listed = not_optional(e.ref_type)
    if re.search(r"\[\d+\]$", key) and typing.get_origin(listed) is list:  # an element: its own type
        kind = typing.get_args(listed)[0]
    words, fix = wanted(kind, example)
    hint = f.metadata.get("hint") if f and not words.startswith("is not one of") else None
    return f"{key}={show(e.value)} {words}; {hint or fix}"


def number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def passes(test, value) -> bool:
    """test(value), where a value of another shape than the test reads (a number for a list) fails it."""
    try:
        return bool(test(value))
    except (TypeError, ValueError, AttributeError):
        return False


def value_problem(key: str, value, f) -> str | None:
    """key=value against field f's declared checks and choices (OmegaConf checks a composed config's choices as it
    composes; a dataclass instance built in code, a checkpoint's, is checked here)."""
    meta, hint, kind = f.metadata, f.metadata.get("hint", ""), not_optional(f.type)
    shown = f"{key}={show(value)}"
    if value is None and f.type in (Any, "Any") and f.default is not None:  # of mixed type: null is no value of it
        if "choices" in meta:
            return f"{shown} is not one of {', '.join(show(c) for c in meta['choices'])}; {hint}"
        return f"{shown} must {meta['must']}; {hint}"
    if value is None:
        return None
    if isinstance(kind, type) and issubclass(kind, enum.Enum) and value not in {m.value for m in kind}:
        return f"{shown} is not one of {', '.join(m.value for m in kind)}; pick one"
    if "group" in meta and config_type(value) is None:  # a value where an option's settings belong
        return f"{shown} is not an option of {meta['group']}; pick one with {meta['group']}=<option>"
    if "choices" in meta and not any(value == c and type(value) is type(c) for c in meta["choices"]):
        return f"{shown} is not one of {', '.join(show(c) for c in meta['choices'])}; {hint}"
    if "test" in meta and not passes(meta["test"], value):
        return f"{shown} must {meta['must']}; {hint}"
    if "match" in meta and not (isinstance(value, str) and re.fullmatch(meta["match"], value)):
        return f"{shown} must {meta['must']}; {hint}"
    many = isinstance(value, list | ListConfig)
    if meta.get("nonempty") and (many or isinstance(value, str)) and len(value) == 0:
        return f"{shown} must not be empty; {hint}"
    if "length" in meta and many and len(value) != meta["length"]:
        return f"{shown} must hold {meta['length']} values; {hint}"
    for x in value if many else [value]:
        for name, (sign, op) in BOUNDS.items():
            if name not in meta:
                continue
            if not number(x) or not math.isfinite(x):
                return f"{shown} must {'hold finite numbers' if many else 'be a finite number'}; {hint}"
            if not op(x, meta[name]):
                return f"{shown} must {'hold numbers' if many else 'be'} {sign} {meta[name]}; {hint}"
    return None


def lookup(node, key: str):
    """The value at a rule's key (a path from node); a KeyError if there is none, never a silent skip."""
    if isinstance(node, DictConfig):
        absent = object()
        value = OmegaConf.select(node, key, default=absent)
        if value is absent:
            raise KeyError(key)
        return value
    for part in key.split("."):
        if not hasattr(node, part):
            raise KeyError(key)
        node = getattr(node, part)
    return node


def unresolved(key: str, raw, e, hint: str) -> str:
    """One line for a value whose ${...} cannot be resolved: ${...} names another setting, and \\${ keeps it as text."""
    why = str(e).splitlines()[0].rstrip(".")
    return (
        f"{key}={raw} cannot be resolved ({why}): ${{...}} names another setting; write \\${{ to keep ${{ as text, "
        f"or {hint}"
    )


def read(node, f, key: str):
    """(the value of field f of node, or None) and the one line saying why it cannot be read (a ${...} that names no
    setting), or None."""
    from omegaconf.errors import GrammarParseError, InterpolationResolutionError

    try:
        return getattr(node, f.name), None
    except (InterpolationResolutionError, GrammarParseError) as e:
        raw = OmegaConf.to_container(node, resolve=False)[f.name]
        return None, unresolved(key, raw, e, f.metadata.get("hint", "pass a value"))


def problem(node, prefix: str = "", only=None, facts: dict | None = None, values_only: bool = False) -> str | None:
    """The first setting of node (a composed config, or a dataclass instance) outside its declared range or rules,
    as one line, or None. Sub-configs are walked by their own class; only: check the fields of this node named here
    (its rules still see every field); facts: a checkpoint's (checks.facts), which the rules that need them read;
    values_only: the values alone, no rule."""
    cls = config_type(node)
    if cls is None:  # a plain dict (a config with no schema: data/prepare.py's) holds typed ones
        if isinstance(node, DictConfig):
            return next(filter(None, (problem(node[k], f"{prefix}{k}.", None, facts, values_only) for k in node)), None)
        return None
    composed = isinstance(node, DictConfig)
    if composed:
        extra = [k for k in node.keys() if field_of(cls, str(k)) is None]
        if extra:  # added with +, which skips the check Hydra makes of an override's key
            return unknown(cls, f"{prefix}{extra[0]}", node)
    for f in fields(cls):
        if only is not None and f.name not in only or composed and OmegaConf.is_missing(node, f.name):
            continue
        key = f"{prefix}{f.name}"
        value, found = read(node, f, key)
        found = found or value_problem(key, value, f)
        if found or (found := problem(value, f"{key}.", None, facts, values_only)):
            return found
    for rule in () if values_only else getattr(cls, "RULES", ()):
        if not set(rule.needs) <= set(facts or ()):
            continue
        values = [lookup(node, k) for k in rule.keys]
        if not rule.ok(*values, *(facts[n] for n in rule.needs)):
            shown = (f"{prefix}{k}={show(v)}" for k, v in zip(rule.keys, values, strict=True))
            return rule.message.format(*shown, **(facts or {}))
    return None


def files_problem(node) -> str | None:
    """The first path setting of node (a composed config) that the filesystem does not hold as it must (its
    files= check), as one line, or None. Run after problem(): every value is in range by then."""
    for prefix, sub, cls in walk(node):
        for f in fields(cls):
            value = None if OmegaConf.is_missing(sub, f.name) else getattr(sub, f.name)
            if "files" in f.metadata and value is not None and (why := f.metadata["files"](str(value))):
                return f"{prefix}{f.name}={show(value)} {why}; {f.metadata['hint']}"
    return None


def walk(node, prefix: str = ""):
    """(key prefix, node, its class) for node and every sub-config under it (the configs problem() checks)."""
    cls = config_type(node)
    if cls is None:
        return
    yield prefix, node, cls
    for f in fields(cls):
        if not (isinstance(node, DictConfig) and OmegaConf.is_missing(node, f.name)):
            yield from walk(getattr(node, f.name), f"{prefix}{f.name}.")
