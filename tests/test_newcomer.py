"""A newcomer's first hour: the README's commands run one after another, and what each prints along the way.

python -m pytest -q tests/test_newcomer.py
The README's commands, in the order shown, never train two runs into one folder, and every checkpoint one of them
reads is made by a command shown before it.
"""

from conftest import ROOT
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_docs import segments, shown_commands

READS = ("checkpoint", "init_from", "sweep_dir")  # the overrides that name a run (or a sweep) to read


def readme_commands() -> list[tuple[str, str, list[str]]]:
    """(line, script, overrides) of every entry point the README runs, in the order it shows them."""
    out = []
    for line in shown_commands((ROOT / "README.md").read_text()):
        for words in segments(line)[0]:
            words = [w for w in words if not (w[:1].isupper() and "=" in w)]  # SCHEMES=... before bash
            if words[0] == "torchrun":
                words = words[next(i for i, w in enumerate(words) if w.endswith(".py")) :]
            elif words[0] in ("python", "python3") and len(words) > 1 and words[1].endswith(".py"):
                words = words[1:]
            else:
                continue
            out.append((line, words[0], words[1:]))
    return out


def given(overrides: list[str], key: str) -> str | None:
    return next((w.split("=", 1)[1] for w in overrides if w.startswith(f"{key}=")), None)


def written(overrides: list[str]) -> str | None:
    """The folder a train.py command writes: its run folder, or a sweep's folder where the command names it."""
    if "-m" in overrides or "--multirun" in overrides:
        return given(overrides, "hydra.sweep.dir")  # else a new dated folder each time: never another run's
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.run, resolve=True)["dir"]


def test_no_two_readme_training_commands_write_one_folder():
    """A newcomer who runs the README's training commands one after another never meets 'already holds a
    checkpoint': each run writes a folder of its own."""
    folders = {}
    for _, script, overrides in readme_commands():
        if script == "train.py" and (folder := written(overrides)) is not None:
            folders.setdefault(folder.rstrip("/"), set()).add(" ".join(overrides))  # shown twice: one run
    shared = {folder: lines for folder, lines in folders.items() if len(lines) > 1}
    assert not shared, shared


def test_every_run_a_readme_command_reads_is_made_by_a_command_before_it():
    """checkpoint=, init_from= and sweep_dir= name only folders an earlier README command wrote (the passkey
    evaluation's fine-tune is shown before it)."""
    made = set()
    for line, script, overrides in readme_commands():
        for key in READS:
            if (path := given(overrides, key)) is not None:
                assert path.rstrip("/") in made, f"{line}: nothing shown before it makes {path}"
        if script == "train.py" and (folder := written(overrides)) is not None:
            made.add(folder.rstrip("/"))
    assert {"out/rope", "out/rope-passkey-256", "multirun/seeds"} <= made
