"""Whole files: every file written is whole or absent, output folders are checked before the work, JSON is checked
as it is read.

python eval.py checkpoint=out/rope     eval/length.{json,txt,png}, each written by replacing()
A write goes to .<name>.tmp<pid><suffix>, is synced and renamed over <name>: a crash midway never leaves a torn file.
A failed write removes its temp file; one left by kill -9 goes at the next write once its process is gone.
"""

import errno
import glob
import json
import os
import re
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path

from utils.errors import UserError

FULL = (errno.ENOSPC, errno.EDQUOT)  # a full disk, or a full quota


@contextmanager
def replacing(path):
    """Yield a temp path; on success sync and rename it over path. On failure remove it and raise one OSError
    naming path, unchained (a library's error about its half-written file would follow it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{path.suffix}")  # a writer may read the format from the suffix
    try:
        yield tmp
        sync(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        cause = e  # the OSError behind e (itself or its cause/context), if any
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from None
    sync(path.parent)


def sync(path: Path):
    """fsync a file, or a folder (a rename is durable once its folder is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path, text: str):
    with replacing(path) as tmp:
        tmp.write_text(text)


def write_json(path, value, indent: int | None = 1):
    write_text(path, json.dumps(value, indent=indent))


def save_figure(fig, path, **savefig):
    """Save a matplotlib figure whole or not at all, then close it."""
    import matplotlib.pyplot as plt

    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, **savefig)
    finally:
        plt.close(fig)


def remove_stale_temps(path):
    """Remove path's temp files whose writer is gone (a reused pid keeps its file: a leftover, never a loss)."""
    path = Path(path)
    ours = re.compile(rf"\.{re.escape(path.name)}\.tmp(\d+)(?:{re.escape(path.suffix)})?")
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.tmp*"):
        found = ours.fullmatch(tmp.name)
        if found and not alive(int(found.group(1))):
            with suppress(FileNotFoundError):  # another process may clean up too
                tmp.unlink()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # only the check
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def check_writable(folder, key: str):
    """Make folder and write a file in it before the work, so a bad folder or full disk fails first, in one line."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check"):
            pass
    except OSError as e:
        raise cannot_write(e, folder, key) from None


def cannot_write(e: OSError, path, key: str = "") -> UserError:
    """One line for a failed write (full disk, folder made read-only since the check)."""
    fix = "free some space there" if e.errno in FULL else "make it writable" if key == "" else f"pass another {key}"
    where = f"{key}: " if key else ""
    return UserError(f"{where}cannot write {e.filename or path} ({e.strerror}); {fix}, then run again")


def read_json(path, need: dict | None = None, fix: str = "make it again", kind: str = ""):
    """The JSON object in path, holding need's keys with need's types; anything else is one line:
    `<path> is not <kind>: it <what>; <fix>` (`<path> <what>; <fix>` without kind)."""
    path = Path(path)

    def refuse(what: str):
        raise UserError(f"{path} is not {kind}: it {what}; {fix}" if kind else f"{path} {what}; {fix}") from None

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        refuse("does not exist")
    except (OSError, UnicodeDecodeError) as e:
        refuse(f"cannot be read ({getattr(e, 'strerror', None) or e})")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        refuse("is empty" if not text.strip() else f"is cut short or not JSON ({e.msg} at line {e.lineno})")
    if need is not None and (why := shape_problem(value, need)):
        refuse(why)
    return value


def shape_problem(value, need: dict, within: str = "") -> str | None:
    """What value lacks of need ({key: type or types}; a bool is no int), or None; within: value's key (config.data)."""
    where = f"{within}." if within else ""
    if not isinstance(value, dict):
        return f"holds {f'{within} as' if within else 'a'} {type(value).__name__} where an object is expected"
    for key, kind in need.items():
        if key not in value:
            return f"has no {where}{key}"
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value[key], kinds) or isinstance(value[key], bool) and bool not in kinds:
            names = " or ".join(t.__name__ for t in kinds)
            return f"holds {where}{key} as {type(value[key]).__name__} where {names} is expected"
    return None


# a tokenizer spec (data/tokenizer.py, kept in checkpoints): tiktoken's encoding by name, or a BPE or character set
# by its pattern, ranks (base64 of the bytes -> id) and special tokens
BOS = "<|bos|>"
SPEC = {"tiktoken": {"name": str, "bos": str}, "other": {"pattern": str, "ranks": dict, "special": dict}}


def spec_problem(spec) -> str | None:
    """What keeps spec from being a tokenizer, or None."""
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
        return "has no kind"
    if why := shape_problem(spec, SPEC["tiktoken" if spec["kind"] == "tiktoken" else "other"]):
        return why
    if spec["kind"] == "tiktoken":
        return None
    for table in ("ranks", "special"):
        if not all(isinstance(k, str) and isinstance(v, int) for k, v in spec[table].items()):
            return f"holds {table} that are not text -> id"
    if spec.get("bos", BOS) not in spec["special"]:
        return f"has no {spec.get('bos', BOS)} token"
    return None


# ---- paths a setting names, checked after every range (settings.files_problem) ----


def unreadable(path: Path) -> str | None:
    return None if os.access(path, os.R_OK) else "cannot be read (permission denied)"


def prompt_file(value: str) -> str | None:
    """prompt=@path: why it is not a text file to read, or None (a prompt without @ is text)."""
    if not value.startswith("@"):
        return None
    path = Path(value[1:]).expanduser()
    if not path.exists():
        return "names a file that does not exist"
    return "names a folder, not a text file" if path.is_dir() else unreadable(path)


def writable_folder(value: str) -> str | None:
    """Why value is not a folder that exists or can be made and written into, or None."""
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        return "is a file, not a folder"
    there = next(p for p in [path, *path.parents] if p.exists() or p == Path(p.anchor or "."))
    if not there.is_dir():
        return f"cannot be made: {there} is a file"
    return None if os.access(there, os.W_OK | os.X_OK) else f"cannot be written ({there} is read-only to this user)"


def text_files(pattern: str) -> list[Path]:
    """The files data.path names: a file, a folder's (not hidden), or a glob's."""
    if not pattern:
        raise UserError("data=text needs data.path=<file, folder or glob of UTF-8 text>")
    path = Path(os.path.expanduser(str(pattern)))
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    elif path.is_file():
        files = [path]
    else:
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    if not files:
        raise UserError(f"data.path={pattern} matches no files; give a text file, a folder or a glob")
    return files


def text_paths(value: str) -> str | None:
    try:
        files = text_files(value)
    except UserError:
        return "matches no files"
    return next(filter(None, map(unreadable, files)), None)
