"""README.md and docs/*.md against what they describe: every table that comes from results/ is the one
evaluation/doc_tables.py writes, every command they show composes its config (and every command dev/LOG.md,
bench/RESULTS.md and results/*/README.md show), every link and layout entry exists.

python -m pytest -q tests/test_docs.py
A command is found in a fenced code block (lines joined at a trailing backslash) or an inline code span. Each
`python train.py|eval.py|sample.py|viz.py ...` (also after torchrun, and `python -m data.prepare` or
`python -m evaluation.longrope_search`) composes its Hydra config with its overrides, once per value of a -m sweep,
and passes the range checks its entry point makes before any work (utils/schema.py), so a renamed key fails here
before it fails a user. No training, no files read. A command whose comment reads `# error: <message>` must fail
with exactly that message. Other scripts (bench/*.py, runs/*.sh, python -m <module>) must exist and take the flags
and environment variables shown, runs/gpu.sh the phases it knows; `python -c` code must parse.
"""

import importlib.util
import re
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import ROOT
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from evaluation import doc_tables
from utils import checks
from utils.errors import UserError

DOCS = doc_tables.docs()


def check_train(cfg):
    """train.py's checks before any work: every range and rule, then the model built on the meta device."""
    checks.check(cfg)
    checks.check_model(cfg)


def check_viz(cfg):
    """viz.py's: the model of a scheme drawn at init is built too."""
    checks.check(cfg)
    if not (cfg.checkpoint or cfg.sweep_dir):
        checks.check_model(cfg)


ENTRY = {  # script or module -> (config name, its checks before any work)
    "train.py": ("train", check_train),
    "eval.py": ("eval", checks.check),
    "sample.py": ("sample", checks.check),
    "viz.py": ("viz", check_viz),
    "data.prepare": ("prepare", checks.check),
    "evaluation.longrope_search": ("longrope", checks.check),
}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
CODE = re.compile(r"`([^`\n]+)`")
RUNS = re.compile(r"(^|[\s;&|])(python3?|torchrun|bash) \S")
ENV = re.compile(r"([A-Z_][A-Z0-9_]*)=(.*)", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def shown_commands(text: str) -> list[str]:
    """The command lines of text's fenced blocks and the inline code spans that run something."""
    lines = [line for block in FENCE.findall(text) for line in block.replace("\\\n", " ").splitlines()]
    lines += CODE.findall(FENCE.sub("", text))
    return [line.strip() for line in lines if RUNS.search(line)]


def segments(line: str) -> tuple[list[list[str]], str]:
    """A shell line as its simple commands (split at &&, ||, ;, |) and its comment."""
    hash_ = re.search(r"(?:^|\s)#\s?", line)
    code, comment = (line[: hash_.start()], line[hash_.end() :]) if hash_ else (line, "")
    lexer = shlex.shlex(code, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    out = [[]]
    for word in lexer:
        if word in ("&&", "||", ";", "|"):
            out.append([])
        else:
            out[-1].append(word)
    return [words for words in out if words], comment.strip()


def compose_all(name: str, overrides: list[str], check) -> int:
    """Compose config `name` with overrides, once per combination of a -m sweep's values, and run its checks."""
    parsed = OverridesParser.create().parse_overrides([o for o in overrides if o not in ("-m", "--multirun")])
    jobs = BasicSweeper.split_arguments(parsed, None)[0]
    for job in jobs:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose(name, overrides=list(job))
        # a fine-tune's checks need the checkpoint it starts from (utils/finetune.py reads it first): not here
        if check is not None and not (name == "train" and cfg.init_from):
            check(cfg)
    return len(jobs)


def flags_taken(path, words: list[str]) -> list[str]:
    """The --flags of words that the script at path does not define."""
    source = path.read_text()
    flags = {w.split("=", 1)[0] for w in words if w.startswith("--")}
    return sorted(f for f in flags if f'"{f}"' not in source)


HYDRA_FLAGS = {"--cfg": 1, "-c": 1, "--package": 1, "-p": 1, "--info": 0, "--help": 0, "--hydra-help": 0}


def without_hydra_flags(args: list[str]) -> list[str]:
    """The overrides of a command line, less Hydra's own flags (--cfg job prints the config) and their values."""
    out, skip = [], 0
    for word in args:
        if skip:
            skip -= 1
        elif word in HYDRA_FLAGS:
            skip = HYDRA_FLAGS[word]
        else:
            out.append(word)
    return out


def check_command(words: list[str]) -> int:
    """Check one simple command as the docs show it; the number of configs composed."""
    env = {}
    while words and ENV.fullmatch(words[0]):
        key, value = ENV.fullmatch(words[0]).groups()
        env[key], words = value, words[1:]
    program, args = words[0], words[1:]
    if program == "torchrun":  # its own --options, then the script and its overrides
        at = next(i for i, w in enumerate(args) if w.endswith(".py"))
        program, args = "python", args[at:]
    if program in ("python", "python3"):
        if args[0] == "-c":  # a program given inline: it must parse
            compile(args[1], "<python -c>", "exec")
            return 0
        if args[0] == "-m":
            target, args = args[1], args[2:]
            spec = importlib.util.find_spec(target)
            assert spec is not None, f"python -m {target}: no such module"
            path = Path(spec.origin) if spec.origin else None
        else:
            target, args = args[0], args[1:]
            path = ROOT / target
            assert path.exists(), f"python {target}: no such file"
        if target in ENTRY:
            name, check = ENTRY[target]
            return compose_all(name, without_hydra_flags(args), check)
        if path is not None and path.is_relative_to(ROOT) and not path.is_relative_to(ROOT / ".venv"):
            assert not flags_taken(path, args), f"{target} takes no {flags_taken(path, args)}"
            overrides = [w for w in args if "=" in w and not w.startswith("-")]
            if overrides and "run_config" in path.read_text():  # bench scripts that take train.py overrides
                return compose_all("train", overrides, None)
        return 0
    if program == "bash":
        script = ROOT / args[0]
        assert script.exists(), f"bash {args[0]}: no such file"
        source = script.read_text()
        unknown = [k for k in env if not re.search(rf"\$\{{?{k}\b", source)]
        assert not unknown, f"{args[0]} reads no {unknown}"
        phases = re.search(r'^PHASES="([^"]+)"', source, re.M)
        if phases:  # a script of phases (runs/gpu.sh) runs only those named, and refuses a call that names none
            named = args[1:]
            assert named and set(named) <= set(phases[1].split()), f"{args[0]} takes phases of {phases[1]!r}: {named}"
        n = 0
        for key in ("EVAL_ARGS", "STREAM_ARGS", "PASSKEY_ARGS"):
            if key in env:
                n += compose_all("eval", ["checkpoint=out/rope", *shlex.split(env[key])], checks.check)
        if args[0] == "runs/study.sh":  # its trailing words are train.py overrides for every run
            scheme = env.get("SCHEMES", "rope").split()[0]
            n += compose_all("train", [f"positional={scheme}", "seed=1", *args[1:]], check_train)
        if args[0] == "runs/tasks.sh":  # and here for every run, over the battery's recipe (and a preset's)
            presets = env.get("PRESETS", "").split()
            experiment = f"[tasks,{presets[0]}]" if presets and not env.get("SCHEMES", "rope").split() else "tasks"
            n += compose_all(
                "train", [f"experiment={experiment}", "data.tasks=[copy]", "seed=1", *args[1:]], check_train
            )
        return n
    return 0  # pip, and the like


SHOWN = [*DOCS, ROOT / "dev" / "LOG.md", ROOT / "bench" / "RESULTS.md", *sorted((ROOT / "results").glob("*/README.md"))]


def commands() -> list[tuple[str, str]]:
    return [(path.relative_to(ROOT).as_posix(), line) for path in SHOWN for line in shown_commands(path.read_text())]


@pytest.mark.parametrize("doc,line", commands(), ids=lambda x: x[:70])
def test_every_shown_command_composes_its_config(doc, line):
    words, comment = segments(line)
    if comment.startswith("error:"):  # the documented error, word for word
        with pytest.raises(UserError) as e:
            for w in words:
                check_command(w)
        assert f"error: {e.value}" == comment, doc
    else:
        for w in words:
            check_command(w)


@pytest.mark.parametrize(
    "line",
    [
        "python train.py train.seqlen=3",  # a misspelled key
        "python train.py positional=alibii",  # an option that does not exist
        "python train.py -m positional=alibi,ropee",  # one value of a sweep
        "python train.py positional.rotary_fraction=2",  # out of range
        "python eval.py checkpoint=out/rope eval.strid=64",
        "python eval.py checkpoint=out/rope eval.mode=streem",
        "python sample.py checkpoint=out/rope temprature=0.8",
        "python viz.py viz.factr=8",
        "python -m data.prepare data=shakespere",
        "python -m evaluation.longrope_search checkpoint=out/rope target_lenght=1024",
        "torchrun --nproc_per_node=8 train.py model=d13",
        "python bench/cpu_bench.py --step 8",
        "python bench/cpu_bench.py train.seqlen=3",
        "python analyses/head_focus_v2.py out/rope",
        "python -m evaluation.studies study",
        "bash runs/study.sh train.seqlen=3",
        "SCHEMES= PRESETS=llama4 bash runs/tasks.sh model.chunck=16",
        "SCHEME=rope bash runs/study.sh",
        'EVAL_ARGS="eval.tokns=1" bash runs/study.sh',
        "bash runs/gpu.sh",  # no phase: it exits 2
        "LIMIT=100 bash runs/gpu.sh benchh",
    ],
)
def test_a_wrong_command_fails(line):
    words, _ = segments(line)
    with pytest.raises(Exception):  # noqa: B017 (Hydra's, omegaconf's, a UserError or an assertion: any of them)
        for w in words:
            check_command(w)


def test_commands_are_split_as_a_shell_does():
    words, comment = segments("""A=1 B="x y" bash runs/study.sh k=v && python eval.py p="ROMEO." # note""")
    assert words == [["A=1", "B=x y", "bash", "runs/study.sh", "k=v"], ["python", "eval.py", "p=ROMEO."]]
    assert comment == "note"
    text = "```bash\npython train.py a=1 \\\n    b=2\nls\n```\nthen `python viz.py` and `x=1`"
    assert shown_commands(text) == ["python train.py a=1      b=2", "python viz.py"]


def test_a_sweep_composes_each_value():
    assert compose_all("train", ["-m", "positional=alibi,rope,nope", "seed=1,2"], None) == 6


def test_tables_equal_the_stored_results(capsys):
    assert doc_tables.main(["--check"]) == 0, capsys.readouterr().out


@pytest.fixture
def copy_of_docs(tmp_path):
    for path in DOCS:
        target = tmp_path / path.relative_to(ROOT)
        target.parent.mkdir(exist_ok=True)
        shutil.copy(path, target)
    return tmp_path


def test_a_changed_cell_is_found_and_rewritten(copy_of_docs, capsys):
    readme = copy_of_docs / "README.md"
    text = readme.read_text()
    start = text.index("<!-- table: core -->")
    cell = re.compile(r"\d+\.\d").search(text, start)  # the first number of the table
    readme.write_text(text[: cell.start()] + "9" + text[cell.start() + 1 :])
    assert doc_tables.main(["--check"], root=copy_of_docs) == 1
    assert "README.md: table core differs" in capsys.readouterr().out
    assert doc_tables.main([], root=copy_of_docs) == 0
    assert readme.read_text() == text
    assert doc_tables.main(["--check"], root=copy_of_docs) == 0


def test_a_table_in_no_doc_is_reported(copy_of_docs, capsys):
    page = copy_of_docs / "docs" / "sinks.md"
    page.write_text(re.sub(r"<!-- table: sinks -->.*?<!-- /table -->\n", "", page.read_text(), flags=re.S))
    assert doc_tables.main(["--check"], root=copy_of_docs) == 1
    assert "table sinks is in no doc" in capsys.readouterr().out


def test_tables_carry_the_stored_numbers():
    """Spot checks against the JSON itself, not through doc_tables: a cell and an interval of each kind."""
    study = {(r["run_label"], r["length"], r["mode"]): r for r in doc_tables.load("study/eval/compare.json")["results"]}
    rope = study[("rope", 4096, "nonoverlap")]
    assert f"{rope['ppl']:.1f} ±{rope['ppl_sd']:.1f} [{rope['ci'][0]:.1f}, {rope['ci'][1]:.1f}]" in doc_tables.core()
    key = doc_tables.load("extension/rope-passkey/eval/passkey-rerope.json")["results"][-1]
    assert (key["correct"], key["trials"]) == (50, 50) and "50/50: [0.93, 1.00]" in doc_tables.passkey()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_link_and_anchor_exists(path):
    text = FENCE.sub("", path.read_text())
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{path.name}: {target}"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", FENCE.sub("", linked.read_text()), re.M)
            assert anchor in {slug(h) for h in headings}, f"{path.name}: {target}"


def test_the_layout_names_only_what_exists():
    text = (ROOT / "README.md").read_text()
    tree = FENCE.search(text, text.index("## Layout")).group(1)
    folder = ROOT
    for line in tree.splitlines():
        words = line.split()
        if not line.startswith(" "):
            folder = ROOT / words[0] if words[0].endswith("/") else ROOT
        for word in (w.strip(",;:()") for w in words):
            if re.fullmatch(r"[\w.-]+(/|\.py|\.sh|\.md|\.yaml)", word):
                assert (folder / word).exists() or (ROOT / word).exists(), f"layout: {word} under {folder.name}"


def test_readme_is_short_and_gives_ci_s_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    ci = next(line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line)
    for command in re.sub(r"pip install -q", "pip install", ci).split(" && "):
        assert command in text, command
    assert "python -m pytest -q -n auto" in text


def test_the_scheme_table_finds_every_scheme_in_its_own_file():
    """Each scheme says what it does in its own class (about), and the README's table has a row for it, measured where a
    study holds its name: a new scheme file is in the table without an edit anywhere else."""
    import positional

    rows = {name: (about, study) for name, about, study in doc_tables.scheme_rows()}
    for name in positional.names():
        assert positional.SCHEMES[name].__dict__.get("about"), f"positional/{name}.py says nothing in about"
        assert rows[name][0] == positional.SCHEMES[name].about
    assert rows["t5"][1] == ("study", "t5") and rows["fire"][1] == ("study-breadth", "fire")
    assert rows["sinusoidal3d"][1] is None


def test_the_scheme_table_finds_every_preset_in_its_own_yaml():
    """A preset says what it does in its YAML's `# preset:` line, and is measured where a study holds runs of its tag:
    a new preset is one YAML, in the table without an edit anywhere else."""
    rows = {name: (about, found) for name, about, found in doc_tables.scheme_rows()}
    yamls = [p for p in (ROOT / "configs").glob("*/*.yaml") if "# preset:" in p.read_text()]
    assert {"gemma3", "llama4", "rnope_swa", "irope"} <= {p.stem for p in yamls}
    for path in yamls:
        pick = f"experiment={path.stem}" if path.parent.name == "experiment" else path.stem
        assert rows[pick][0] and rows[pick][0] in path.read_text()
    assert rows["experiment=gemma3"][1][0] == "study-presets"
    assert rows["experiment=gemma3"][1][1].startswith("rope [model.n_layer=6")
    assert rows["irope"][1][1].startswith("rope/PPPN")


def test_every_hook_of_the_interface_is_listed_and_given_by_a_scheme():
    """docs/schemes.md's hook table covers each hook of positional/base.py, and each hook is given by some scheme: a
    hook no scheme needs is one to remove, a new one is listed where a reader looks."""
    import positional
    from positional.base import Positional

    helpers = {"check_axes", "per_axis", "check_length", "extra_repr", "max_positions"}  # called, never overridden
    found = {
        n for n, v in vars(Positional).items() if n[0] != "_" and not isinstance(v, type) and (callable(v) or v is None)
    }
    assert found - helpers == set(doc_tables.HOOKS)
    for hook in doc_tables.HOOKS:
        givers = [
            n for n in positional.names() if getattr(positional.SCHEMES[n], hook) is not getattr(Positional, hook)
        ]
        assert givers, f"no scheme gives {hook}: drop it from positional/base.py"
