"""Every config group composes into a model and a run; the SLURM launcher preset too. Every setting has one home:
a rule names only keys that exist, and configs/ restates no default."""

import enum
import io
import os
import subprocess
import sys
from dataclasses import dataclass, fields, is_dataclass
from typing import ClassVar

import pytest
import torch
from conftest import ROOT, SCHEMES, config
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import positional
import settings
from utils import checkpoint, schema


# the learned-bias schemes at the tiny size only: they add no constraint between sizes and positions (no
# rotary pairs, no table), and building small and d12 costs CI 5 s a scheme
@pytest.mark.parametrize(
    "name, size",
    [
        (n, s)
        for n in SCHEMES
        for s in ("tiny", "small", "d12")
        if s == "tiny" or n not in ("kerple", "fire", "shaw", "fox")
    ],
)
def test_every_scheme_and_size_composes_into_a_model(name, size):
    cfg = config(f"positional={name}", f"model={size}")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    with torch.device("meta"):  # the network's shapes and checks, not d12's 124M weights
        model = checkpoint.build_model(schema.model_config(resolved, vocab_size=4096))
    assert model.pe.name == name and len(model.blocks) == cfg.model.n_layer
    if name == "learned":
        assert model.pe.max_positions == cfg.train.seq_len  # the table covers the training length
    model.pe.check_length(cfg.train.seq_len)


@pytest.mark.parametrize(
    "group, option",
    [("optim", "muon"), ("data", "fineweb_edu"), ("data", "tinystories"), ("data", "passkey"), ("tokenizer", "gpt2")],
)
def test_other_options_compose(group, option):
    cfg = config(f"{group}={option}")
    assert cfg[group].name == option and cfg.positional.name == "rope"  # the option taken, the rest default


def test_sweep_preset_lists_the_six_schemes():
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["sweep=schemes"], return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN"
    assert cfg.hydra.sweeper.params.positional == "learned,sinusoidal,alibi,rope,nope,sink"


def test_slurm_launcher_preset_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "model=d12"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.partition == "gpu"
    assert launcher.tasks_per_node == launcher.gpus_per_node == 8  # one process per GPU


def test_slurm_tasks_become_torchrun_ranks():
    """What a task of a 2-node x 8-GPU SLURM job sees once utils.runtime has translated SLURM's variables."""
    pytest.importorskip("submitit")
    env = {
        **os.environ,
        "_TEST_CLUSTER_": "slurm",
        "SLURM_JOB_ID": "42",
        "SLURM_NTASKS": "16",
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gpu[03-04]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": "1",
    }
    code = (
        "import os; from utils.runtime import from_slurm; from_slurm(); "
        "print(*(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["9", "16", "1", "gpu03"]


@pytest.mark.parametrize("inner", ["alibi", "nope", "t5", "rope"])
def test_sink_wraps_the_scheme_it_is_given(inner):
    """positional.inner={name:alibi} (as the README says) replaces RoPE; no RoPE option is left behind."""
    cfg = config("positional=sink", f"positional.inner={{name:{inner}}}")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["positional"]["inner"] == {"name": inner}
    model = checkpoint.build_model(schema.model_config(resolved, vocab_size=4096))
    assert model.pe.name == "sink" and model.pe.rotary == (inner == "rope")


@pytest.mark.parametrize("size, lr, muon_lr", [("tiny", 2e-2, 0.04), ("small", 6e-3, 0.02), ("d12", 3e-3, 0.02)])
def test_each_model_size_carries_its_own_lr(size, lr, muon_lr):
    cfg = config(f"model={size}")  # the default optimizer is Muon, with AdamW for embeddings, head and the rest
    assert cfg.optim.name == "muon" and cfg.optim.lr == muon_lr and cfg.optim.adam_lr == lr and cfg.model.lr == lr
    assert config(f"model={size}", "optim=adamw").optim.lr == lr
    assert config(f"model={size}", "optim.lr=1e-4").optim.lr == 1e-4  # an explicit optim.lr wins
    assert config(f"model={size}", "optim=adamw", "model.lr=5e-4").optim.lr == 5e-4
    assert config(f"model={size}", "model.muon_lr=0.01").optim.lr == 0.01
    resolved = OmegaConf.to_container(cfg, resolve=True)
    model = schema.model_config(resolved, vocab_size=4096)
    assert "lr" not in model and "muon_lr" not in model  # run settings, not part of the network


def options_of(group: str) -> list[str]:
    """A group's options: its YAML presets, and for positional every scheme (a file of positional/, no YAML)."""
    presets = {p.stem for p in (ROOT / "configs" / group).glob("*.yaml")}
    return sorted(presets | set(positional.names() if group == "positional" else ()))


COMPOSED = {  # every option of every group, in the entry points that have the group
    "train": [[]]
    + [
        [f"{group}={option}"]
        for group in ("positional", "model", "data", "tokenizer", "optim")
        for option in options_of(group)
    ]
    + [[f"experiment={option}"] for option in options_of("experiment")],
    "eval": [[]],
    "sample": [[f"cache={option}"] for option in options_of("cache")],
    "viz": [[]] + [[f"positional={option}"] for option in options_of("positional")],
    "longrope": [["target_length=512"]],
    "prepare": [[]] + [[f"data={option}"] for option in options_of("data")],
}


def composed_configs():
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        for name, variants in COMPOSED.items():
            for overrides in variants:
                yield name, overrides, compose(name, overrides=overrides)


def classes_under(cls, found=None) -> set:
    """cls and every dataclass its fields are typed by."""
    found = set() if found is None else found
    found.add(cls)
    for f in fields(cls):
        kind = settings.value_type(cls, f.name)
        if is_dataclass(kind) and kind not in found:
            classes_under(kind, found)
    return found


def test_every_rule_names_keys_of_the_config_it_checks():
    """A rule names its keys as strings (the fields it relates): each must exist in every composed config that holds
    its class, or renaming a field would switch the rule off. Every class that declares rules is reached here."""
    absent, seen = object(), set()
    for name, overrides, cfg in composed_configs():
        for prefix, node, cls in settings.walk(cfg):
            seen.add(cls)
            for rule in getattr(cls, "RULES", ()):
                for key in rule.keys:
                    where = f"{cls.__name__}'s rule names {prefix}{key}, which {name} {overrides} lacks"
                    assert OmegaConf.select(node, key, default=absent) is not absent, where
            assert settings.problem(node) is None, (name, overrides)  # the defaults pass every rule
    declared = set().union(*map(classes_under, schema.ENTRY_POINTS.values()))
    declared |= {cls for options in schema.GROUPS.values() for cls in options.values()}
    assert {cls for cls in declared if getattr(cls, "RULES", ())} <= seen


def test_a_rule_naming_a_missing_key_fails_rather_than_skipping():
    @dataclass
    class Stale:
        seq_len: int = 256
        RULES: ClassVar = (settings.Rule(("seq_lenn",), lambda n: n > 0, "{0} must be positive"),)

    with pytest.raises(KeyError, match="seq_lenn"):
        settings.problem(OmegaConf.structured(Stale))


def schema_of(path) -> type:
    """The class a configs/<group>/<option>.yaml is typed by: the schema its defaults list names (a model size is
    typed by the model node itself)."""
    group = path.parent.name
    if group == "model":
        return schema.ModelSize
    named = [d for d in OmegaConf.load(path).get("defaults", []) if str(d).startswith(("/schema/", "/positional/"))]
    assert len(named) == 1, f"{path} names no schema/{group}/<class> (or positional/<scheme>) in its defaults list"
    kind, name = str(named[0]).removeprefix("/schema/").removeprefix("/").removesuffix("@_here_").split("/")
    return schema.GROUPS[kind][name]


@pytest.mark.parametrize("group", ["positional", "model", "data", "tokenizer", "optim", "cache"])
def test_configs_hold_presets_not_defaults(group):
    """A default lives in its dataclass: a YAML group option sets only values that differ from it (a preset)."""
    for path in sorted((ROOT / "configs" / group).glob("*.yaml")):
        defaults = OmegaConf.to_container(OmegaConf.structured(schema_of(path)))
        for key, value in OmegaConf.to_container(OmegaConf.load(path)).items():
            assert key == "defaults" or value != defaults[key], f"{path.name} restates {group}.{key}={value}"


def test_a_scheme_is_its_file():
    """positional=<name> picks positional/<name>.py with no YAML and no list to add it to: the class is named by its
    file, its options are declared beside it (or are the scheme's it extends), and composing imports it alone."""
    code = (
        "import sys; from hydra import compose, initialize_config_dir; import utils.schema\n"
        f"with initialize_config_dir(config_dir={str(ROOT / 'configs')!r}, version_base='1.3'):\n"
        "    assert compose('train', overrides=['positional=t5']).positional.num_buckets == 32\n"
        "print(sorted(m for m in sys.modules if m.startswith('positional.')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "positional.t5" in loaded and "positional.alibi" not in loaded and "positional.fire" not in loaded, loaded
    for name in positional.names():
        cls = positional.SCHEMES[name]
        assert cls.name == name and cls.__module__ == f"positional.{name}", name
        assert issubclass(cls.Options, positional.PositionalOptions), name
        assert cls.Options.__module__.startswith("positional."), name  # its own, or a scheme's it shares
        assert config(f"positional={name}").positional.name == name


def test_build_takes_an_options_object_or_a_dict():
    node = config("positional=rope", "positional.base=500").positional
    for spec in (node, positional.rope.RoPEOptions(name="rope", base=500.0), {"name": "rope", "base": 500}):
        assert positional.build(spec, 4, 8, 32).base == 500.0


def test_a_saved_config_holds_plain_strings():
    """Choices are enums while composing, strings once saved: torch.load(weights_only=True) reads them back."""

    def walk(value):
        assert not isinstance(value, enum.Enum), value
        for v in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
            walk(v)

    resolved = schema.plain(config("optim=muon", "positional=kerple", "data=passkey", "out_dir=x"))
    walk(resolved)
    saved = {"model_config": schema.model_config(resolved, 4096), "config": resolved}
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == saved


@pytest.mark.parametrize("key, value", [("qk_norm", "bogus"), ("attn_backend", "x"), ("qk_norm", 3)])
def test_a_choice_a_config_built_in_code_does_not_offer_is_one_line(key, value):
    """A model config built in code (a checkpoint's: OmegaConf never composed it) holding a choice its enum does not
    offer is refused in one line naming the key, as a composed one is while Hydra composes."""
    from model.gpt import GPTConfig

    with pytest.raises(ValueError, match=rf"^model\.{key}={value} is not one of [a-z, ]+; pick one$"):
        GPTConfig(vocab_size=10, **{key: value})
