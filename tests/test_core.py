"""The core runs alone: a training run, eval.py's length table and sample.py load nothing that stands around it.

python -m pytest -q tests/test_core.py
The core is what `python train.py`, `python eval.py` (perplexity by length) and `python sample.py` need with any
scheme: the entry points, model/, positional/ (base.py and the scheme asked for), configs/, data/'s corpus, tokenizer
and loader. Around it stand the other evaluations, studies, pictures, benchmarks, the task / passkey / grid
generators, ReRoPE's far attention and the static decoding step: each is loaded when a setting asks for it (an eval
mode, a scheme, a scaling found by its name), never by the core's own imports. Each entry point runs here in a fresh
interpreter, as a user runs it, and reports the project's modules it loaded.
"""

import json
import re

import pytest
from conftest import ROOT, TINY, run

import positional

AROUND = (
    "analyses",
    "bench",
    "gallery",
    "viz",
    "data.grids",
    "data.passkey",
    "data.tasks",
    "evaluation.attention_map",
    "evaluation.compare",
    "evaluation.doc_tables",
    "evaluation.grids",
    "evaluation.longrope_search",
    "evaluation.passkey",
    "evaluation.probes",
    "evaluation.sink_mass",
    "evaluation.stream",
    "evaluation.study",
    "evaluation.tasks",
    "model.split_attention",
    "model.static_decode",
)
PROJECT = ("settings", "train", "eval", "sample", *(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()))
HARNESS = """
import atexit, json, os, runpy, sys
import model.gpt
built, init, post = [], model.gpt.GPT.__init__, model.gpt.GPTConfig.__post_init__
def counted(self, *args, **kwargs):
    built.append("GPT")
    init(self, *args, **kwargs)
def checked(self):
    built.append("GPTConfig")
    post(self)
model.gpt.GPT.__init__, model.gpt.GPTConfig.__post_init__ = counted, checked
def report():
    with open(os.environ["LOADED"], "w") as f:
        json.dump({"modules": sorted(sys.modules), "built": [built.count("GPT"), built.count("GPTConfig")]}, f)
atexit.register(report)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
BUILT = {}  # entry point -> how many times its run built the network (GPT) and checked its config (GPTConfig)


def loaded(tmp_path, *args) -> set[str]:
    """The project's modules that `python <args>` loaded (and, in BUILT, how often it built the network)."""
    out = tmp_path / "loaded.json"
    proc = run("-c", HARNESS, *args, env={"LOADED": str(out)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    BUILT[args[0]] = report["built"]
    return {m for m in report["modules"] if m.split(".")[0] in PROJECT}


def around(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == a or m.startswith(a + ".") for a in AROUND))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shakespeare_dir):
    """A 2-step ALiBi run, and the modules its training loaded."""
    out = tmp_path_factory.mktemp("core") / "alibi"
    args = ["train.py", "positional=alibi", *TINY, "train.max_steps=2", "train.sample_tokens=8", f"out_dir={out}"]
    modules = loaded(tmp_path_factory.mktemp("loaded"), *args)
    return out, modules


def test_training_loads_its_scheme_alone_and_nothing_around_the_core(trained):
    _, modules = trained
    assert not around(modules), around(modules)
    schemes = {m.split(".")[1] for m in modules if m.startswith("positional.")} & set(positional.names())
    assert schemes == {"alibi"}, schemes


def test_the_reading_guide_lists_the_files_a_run_loads(trained):
    """docs/training.md's table of the files a training run executes names exactly the project files it loaded (less
    empty package markers): a file added to the core, or one left out of it, shows in the guide."""
    _, modules = trained
    files = {ROOT / (m.replace(".", "/") + ".py") for m in modules}
    files |= {ROOT / m.replace(".", "/") / "__init__.py" for m in modules}
    loaded = {str(f.relative_to(ROOT)) for f in files if f.is_file() and f.stat().st_size}
    text = (ROOT / "docs" / "training.md").read_text().split("## Reading the code a run executes")[1].split("\n## ")[0]
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", text, re.M))
    assert listed == loaded, (sorted(listed - loaded), sorted(loaded - listed))


def test_the_length_table_and_sampling_load_nothing_around_the_core(trained, tmp_path):
    out, _ = trained
    for args in (
        ["eval.py", f"checkpoint={out}", "eval.lengths=[32,64]", "eval.tokens=128", "logger.wandb=false"],
        ["sample.py", f"checkpoint={out}", "max_new_tokens=4", "device=cpu"],
    ):
        modules = loaded(tmp_path, *args)
        assert not around(modules), (args[0], around(modules))


def test_each_entry_point_builds_the_network_once(trained, tmp_path):
    """A model config is checked with its schemes alone on the meta device, and a checkpoint's weights against the
    network its reader builds: no entry point builds the network twice (train.py, eval.py and sample.py each built it
    two to four times, on the meta device to check it), nor checks its config twice (train.py builds from the config
    its preflight checked)."""
    out, _ = trained
    loaded(tmp_path, "eval.py", f"checkpoint={out}", "eval.lengths=[32]", "eval.tokens=64", "logger.wandb=false")
    loaded(tmp_path, "sample.py", f"checkpoint={out}", "max_new_tokens=2", "device=cpu")
    assert BUILT == {"train.py": [1, 1], "eval.py": [1, 1], "sample.py": [1, 1]}, BUILT
