"""Every config group composes into a model and a run; the SLURM launcher preset too."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT, SCHEMES, config
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

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
