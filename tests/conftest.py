"""Shared helpers: tiny random models, composed configs, and running the entry points as a user would."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from contextlib import suppress
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import positional
import utils.eval_schema  # noqa: F401  (registers the config schemas that configs/*.yaml name)
from model.gpt import GPT, GPTConfig

ROOT = Path(__file__).resolve().parent.parent  # the project, installed with pip install -e . (README)

SCHEMES = list(positional.names())  # every file of positional/ but its helpers: a scheme is found, never listed
# absolute positions, added to the embeddings (multi-axis ones here on text: (T,) positions, the same id on every axis;
# tests/test_grids.py gives them real multi-axis ids)
ABSOLUTE = [name for name in SCHEMES if not positional.SCHEMES[name].relative]
RELATIVE = [name for name in SCHEMES if name not in ABSOLUTE]
# FIRE divides distances by the query's position past its threshold: shifting positions changes its scores
SHIFT_INVARIANT = [name for name in RELATIVE if name != "fire"]
# a model small enough that every test trains or decodes it in a second or two
TINY = [
    "model.n_layer=2",
    "model.d_model=32",
    "model.n_head=4",
    "model.n_kv_head=2",
    "train.seq_len=32",
    "train.batch_size=8",
    "train.warmup_steps=1",  # within the few steps a test trains
    "train.eval_batches=2",
    "train.log_interval=1",
    "train.sample_tokens=0",
    "logger.wandb=false",
    "device=cpu",
]


def scheme_spec(name: str, max_positions: int = 256) -> dict:
    spec = {"name": name}
    if name == "learned":
        spec["max_positions"] = max_positions
    if name == "sink":
        spec["inner"] = {"name": "rope"}
    if name == "fire":  # 4 hidden units per head, not 32: the same formula, an eighth of the time on the CPU
        spec["hidden"] = 4
    return spec


def random_model(name: str, seed: int = 0, **kw) -> GPT:
    """A model whose every weight is random: zero-initialised projections would make attention vanish and
    leave positional tests with nothing to detect."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, d_model=32, positional=scheme_spec(name))
    cfg.update(kw)
    model = GPT(GPTConfig(**cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5 if p.dim() > 1 else 1.0)
    return model.eval()


def checkpoint_state(model: GPT, seq_len: int = 32, **more) -> dict:
    """What checkpoint.save needs for checkpoint.load to read model back: its weights, its config, a tokenizer (the
    task battery's characters) and a training length; more: any other entries."""
    from dataclasses import asdict

    from data.tasks import tokenizer_spec

    state = {"model": model.state_dict(), "model_config": asdict(model.cfg), "tokenizer": tokenizer_spec()}
    return {**state, "seq_len": seq_len, **more}


def assert_same_logits_and_grads(model, reference, idx, variant=None):
    """model gives the reference's logits and, for a loss on them, every parameter's gradient (both under variant)."""
    got, want = model(idx, variant=variant), reference(idx, variant=variant)
    assert torch.allclose(got, want, atol=1e-4)
    got.square().sum().backward()
    want.square().sum().backward()
    for (n, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-3, rtol=1e-3), n


def assert_decoding_equals_full_forward(model, idx, static: bool = True, atol: float = 1e-4, variant=None):
    """A dense KV cache fed token by token and in uneven chunks (and, with static, the static step after a one-token
    prefill) gives the logits of one full forward over idx (B, 20 or more tokens), all under one variant."""
    from model.kv_cache import DenseCache
    from model.static_decode import StaticDecoder

    B, T = idx.shape
    with torch.no_grad():
        full = model(idx, variant=variant)
        step = DenseCache(model, B, 64, variant=variant)
        one_by_one = torch.cat([model.decode(idx[:, t : t + 1], step) for t in range(T)], dim=1)
        chunked = DenseCache(model, B, 64, variant=variant)
        pieces = torch.cat([model.decode(idx[:, a:b], chunked) for a, b in ((0, 9), (9, 11), (11, T))], dim=1)
        assert torch.allclose(full, one_by_one, atol=atol) and torch.allclose(full, pieces, atol=atol)
        if static:
            cache = DenseCache(model, B, 64, variant=variant)
            model.decode(idx[:, :1], cache)
            decoder = StaticDecoder(model, cache, compile=False)
            got = torch.stack([decoder(idx[:, t : t + 1]) for t in range(1, T)], dim=1)
            assert torch.allclose(full[:, 1:], got, atol=atol)


def assert_sink_cache_reindexes(model, idx, variant=None):
    """Past its capacity a sink cache (2 sinks + 28) re-indexes what it keeps: in a one-layer model the last token's
    logits are a full forward over the kept tokens at positions 0..capacity-1, under the same variant."""
    from model.kv_cache import SinkCache

    cache = SinkCache(model, 1, sinks=2, window=28, variant=variant)
    with torch.no_grad():
        last = torch.cat([model.decode(idx[:, t : t + 1], cache) for t in range(idx.size(1))], dim=1)[:, -1]
        want = model(idx[:, cache.token_indices().sort().values], variant=variant)[:, -1]
    assert torch.allclose(last, want, atol=1e-4)


def layer_outputs_from_probs(model, idx):
    """Per layer (probs, probs @ V through c_proj, the layer's actual output): the attention probabilities the sink
    diagnostic reads (evaluation/sink_mass.py) and whether they recompose what the model computed."""
    from evaluation.sink_mass import attention_probs

    outputs, values, hooks = [], [], []
    for block in model.blocks:
        hooks.append(block.attn.register_forward_hook(lambda m, args, out: outputs.append(out)))
        hooks.append(block.attn.register_forward_pre_hook(lambda m, args: values.append(m.c_v(args[0]))))
    try:
        probs = attention_probs(model, idx)
    finally:
        for h in hooks:
            h.remove()
    layers = []
    for attn, p, v, out in zip([b.attn for b in model.blocks], probs, values, outputs, strict=True):
        B, T, _ = v.shape
        v = v.view(B, T, attn.n_kv_head, -1).transpose(1, 2).repeat_interleave(attn.n_head // attn.n_kv_head, 1)
        layers.append((p, attn.c_proj((p @ v).transpose(1, 2).reshape(B, T, -1)), out))
    return layers


def pytest_configure(config):
    """Under pytest-xdist (`-n auto`, the README's command) the workers share the cores: each takes its share of
    threads, and so do the entry points it runs (run() passes the environment on). Oversubscribed OpenMP
    threads spin against each other and are slower than one process alone."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


def config(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def run(*args, timeout=300, env=None, check=False) -> subprocess.CompletedProcess:
    """Run `python <args>` from the repo root, as a user would: forked from a process that has torch imported
    (tests/forks.py), or a fresh interpreter where env sets what python reads as it starts (PYTHONPATH)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", **(env or {})}
    if any(k.startswith("PYTHON") and k != "PYTHONUNBUFFERED" for k in env or {}):
        proc = subprocess.run(
            [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=full_env
        )
    else:
        proc = FORKS.run(list(args), full_env, timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


class Forks:
    """This worker's tests/forks.py process, started on first use."""

    proc = None

    def run(self, args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
        if self.proc is None or self.proc.poll() is not None:
            server_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "forks.py")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, env=server_env, text=True,
            )  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp, "out"), Path(tmp, "err")
            request = {"args": args, "env": env, "cwd": str(ROOT), "stdout": str(out), "stderr": str(err)}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            pid = json.loads(self.proc.stdout.readline())["pid"]
            killed = []

            def kill():
                killed.append(pid)
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

            timer = threading.Timer(timeout, kill)
            timer.start()
            status = json.loads(self.proc.stdout.readline())["status"]
            timer.cancel()
            done = subprocess.CompletedProcess([sys.executable, *args], status, out.read_text(), err.read_text())
        if killed:
            raise subprocess.TimeoutExpired(done.args, timeout, done.stdout, done.stderr)
        return done


FORKS = Forks()


@pytest.fixture(scope="package")
def shakespeare_dir():
    """The embedded corpus, prepared once (reused from .cache across runs)."""
    from data.prepare import prepare

    cfg = config()
    from omegaconf import OmegaConf

    return prepare(OmegaConf.to_container(cfg.data, resolve=True), OmegaConf.to_container(cfg.tokenizer), log=None)


@pytest.fixture(autouse=True)
def fresh_compile_cache():
    """Every test compiles from an empty torch.compile cache, and a test that passes the recompile limit fails
    instead of running on eagerly: versions are capped per code object and shared by every model instance."""
    import torch._dynamo

    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


@pytest.fixture(scope="package")
def tiny_checkpoint(tmp_path_factory, shakespeare_dir):
    """A run folder holding a tiny rope model trained for 2 steps (seq_len 32), for eval.py and sample.py."""
    from train import train

    out = tmp_path_factory.mktemp("tiny_checkpoint")
    train(config(*TINY, "train.max_steps=2", "train.warmup_steps=1"), out)
    return out


@pytest.fixture
def figures(monkeypatch):
    """Every figure a plot function saves, drawn and kept open for the test to read."""
    import matplotlib.figure

    saved, real = [], matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return saved
