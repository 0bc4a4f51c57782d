"""Config schemas: the type of every key, checked by omegaconf as Hydra composes; then ranges and choices.

python train.py optim.lr=abc        error: optim.lr=abc must be a number
python train.py train.seq_len=0     error: train.seq_len=0 must be >= 1; pass a positive length
The YAML files in configs/ hold every default value; the dataclasses here hold only types (MISSING: the YAML
gives the value). Each is registered in Hydra's ConfigStore as schema/<name> and named first in the defaults
list of the YAML it types (train.yaml, eval.yaml, sample.yaml, optim/*.yaml, cache/*.yaml), so a value of the
wrong type or an unknown key fails while the config composes. check_train, check_eval and check_sample then
test ranges and choices before any data is read, so a bad value stops the run at once with one line.
Groups whose options differ in their keys and are read by their own code (positional, data, tokenizer) stay
plain dicts; the positional options every scheme shares are checked here.
"""

import operator
import re
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from utils.errors import UserError

RUN_KEYS = ("lr", "muon_lr")  # keys of configs/model/*.yaml that tune the run, not the network (not in its config)


@dataclass
class Model:
    n_layer: int = MISSING
    n_head: int = MISSING
    n_kv_head: int = MISSING
    d_model: int = MISSING
    mlp_ratio: int = MISSING
    softcap: float = MISSING
    attn_backend: str = MISSING
    qk_norm: str = MISSING
    sink_logit: bool = MISSING
    ssmax: bool = MISSING
    window: int | None = MISSING
    window_pattern: str = MISSING
    lr: float = MISSING  # the AdamW learning rate that suits this size; optim.lr follows it unless given
    muon_lr: float = MISSING  # the Muon learning rate (block matrices) that suits this size; optim=muon's optim.lr


@dataclass
class AdamW:
    name: str = MISSING
    lr: float = MISSING
    betas: list[float] = MISSING
    weight_decay: float = MISSING


@dataclass
class Muon:
    name: str = MISSING
    lr: float = MISSING
    momentum: float = MISSING
    adjust_lr_fn: str | None = MISSING
    adam_lr: float = MISSING
    betas: list[float] = MISSING
    weight_decay: float = MISSING


@dataclass
class Train:
    seq_len: int = MISSING
    batch_size: int = MISSING
    grad_accum: int = MISSING
    total_batch_size: int | None = MISSING
    max_steps: int = MISSING
    warmup_steps: int = MISSING
    schedule: str = MISSING
    min_lr_ratio: float = MISSING
    grad_clip: float | None = MISSING
    log_interval: int = MISSING
    eval_interval: int = MISSING
    eval_batches: int = MISSING
    ckpt_interval: int = MISSING
    time_limit_min: float | None = MISSING
    resume: bool = MISSING
    overwrite: bool = MISSING
    parallel: str = MISSING
    sample_tokens: int = MISSING
    sink_metric: bool = MISSING


@dataclass
class TrainLogger:
    wandb: bool = MISSING
    project: str = MISSING
    mode: str = MISSING
    group: str | None = MISSING


@dataclass
class TrainConfig:
    out_dir: str = MISSING
    init_from: str | None = MISSING  # a checkpoint whose weights a fine-tune starts from (utils/finetune.py)
    device: str = MISSING
    dtype: str = MISSING
    compile: Any = MISSING  # auto | true | false
    seed: int = MISSING
    train: Train = field(default_factory=Train)
    logger: TrainLogger = field(default_factory=TrainLogger)
    model: Model = field(default_factory=Model)
    optim: Any = MISSING  # typed by schema/optim/<name>
    positional: Any = MISSING
    data: Any = MISSING
    tokenizer: Any = MISSING


@dataclass
class Eval:
    mode: str = MISSING
    lengths: list[int] | None = MISSING
    stride: int | None = MISSING
    tokens: int = MISSING
    batch_tokens: int = MISSING
    rope_scaling: str = MISSING
    rope_factor: Any = MISSING  # auto | a number
    rerope_window: int | None = MISSING  # null: half the training length
    rerope_leak: Any = MISSING  # auto | a number >= 1
    rerope: bool = MISSING  # also the rerope and leaky_rerope rows
    log_scaling: bool = MISSING
    prepare: bool = MISSING
    stream_tokens: int = MISSING
    block: int = MISSING
    dense_limit: int = MISSING
    depths: list[float] = MISSING
    trials: int = MISSING
    key_digits: int | None = MISSING
    seed: int = MISSING
    grid_sizes: list[list[int]] | None = MISSING
    grids: int = MISSING


@dataclass
class EvalCache:
    sinks: int | None = MISSING
    window: int | None = MISSING


@dataclass
class EvalLogger:
    wandb: bool = MISSING
    mode: str = MISSING


@dataclass
class EvalConfig:
    checkpoint: str | None = MISSING
    sweep_dir: str | None = MISSING
    device: str = MISSING
    dtype: str = MISSING
    eval: Eval = field(default_factory=Eval)
    cache: EvalCache = field(default_factory=EvalCache)
    logger: EvalLogger = field(default_factory=EvalLogger)


@dataclass
class DenseCache:
    kind: str = MISSING
    max_len: int | None = MISSING


@dataclass
class SinkCache:
    kind: str = MISSING
    sinks: int | None = MISSING
    window: int | None = MISSING


@dataclass
class SampleConfig:
    checkpoint: str | None = MISSING
    prompt: str = MISSING
    max_new_tokens: int = MISSING
    temperature: float = MISSING
    top_k: int | None = MISSING
    seed: int = MISSING
    num_samples: int = MISSING
    static: bool = MISSING
    rope_scaling: str = MISSING
    rerope_window: int | None = MISSING
    rerope_leak: Any = MISSING  # auto | a number >= 1
    device: str = MISSING
    dtype: str = MISSING
    cache: Any = MISSING  # typed by schema/cache/<kind>


@dataclass
class Viz:
    out: str | None = MISSING
    all: bool = MISSING
    factor: float = MISSING
    samples: int = MISSING
    heads: list[list[int]] | None = MISSING
    prepare: bool = MISSING
    seed: int = MISSING


@dataclass
class VizTrain:
    seq_len: int = MISSING


@dataclass
class VizConfig:
    checkpoint: str | None = MISSING
    sweep_dir: str | None = MISSING
    viz: Viz = field(default_factory=Viz)
    train: VizTrain = field(default_factory=VizTrain)
    model: Model = field(default_factory=Model)
    positional: Any = MISSING


@dataclass
class Search:
    population: int = MISSING
    parents: int = MISSING
    mutations: int = MISSING
    crossovers: int = MISSING
    generations: int = MISSING
    mutation_rate: float = MISSING
    crossover_tries: int = MISSING
    step: float = MISSING
    max_factor: float | None = MISSING
    start_tokens: list[int] = MISSING
    windows: int = MISSING
    seed: int = MISSING


@dataclass
class SearchEval:
    lengths: list[int] | None = MISSING
    tokens: int = MISSING
    batch_tokens: int = MISSING
    prepare: bool = MISSING


@dataclass
class LongRoPEConfig:
    checkpoint: str | None = MISSING
    target_length: int = MISSING
    device: str = MISSING
    dtype: str = MISSING
    search: Search = field(default_factory=Search)
    eval: SearchEval = field(default_factory=SearchEval)


def register():
    cs = ConfigStore.instance()
    configs = {
        "train": TrainConfig,
        "eval": EvalConfig,
        "sample": SampleConfig,
        "viz": VizConfig,
        "longrope": LongRoPEConfig,
    }
    for name, node in configs.items():
        cs.store(group="schema", name=name, node=node)
    cs.store(group="schema/optim", name="adamw", node=AdamW)
    cs.store(group="schema/optim", name="muon", node=Muon)
    cs.store(group="schema/cache", name="dense", node=DenseCache)
    cs.store(group="schema/cache", name="sink", node=SinkCache)


def default_out_dir(scheme: str, init_from, data: str, seq_len: int, scaling: str, factor) -> str:
    """hydra.run.dir when out_dir is not given: out/<scheme>, or for a fine-tune a folder of its own beside the
    one it starts from, e.g. out/rope-shakespeare-1024-yarn4 or out/rope-nope-shakespeare-256 (never the init
    checkpoint's own folder)."""
    if not init_from:
        return f"out/{scheme}"
    base = str(init_from).rstrip("/")
    base = base.rsplit("/", 1)[0] if base.endswith(".pt") and "/" in base else base.removesuffix(".pt")
    tail = f"-{scaling}{float(factor):g}" if scaling not in (None, "none") else ""
    # the one switch of scheme a fine-tune may make (DroPE: init_from=out/rope positional=nope) says so
    drop = "-nope" if scheme == "nope" and "nope" not in base.rsplit("/", 1)[-1] else ""
    return f"{base}{drop}-{data}-{seq_len}{tail}"


register()
OmegaConf.register_new_resolver("nanopos_out_dir", default_out_dir, replace=True)

# ---- ranges and choices, checked before any work ----

ABSENT = object()
OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
COMMON_CHOICES = {"dtype": ("auto", "fp32", "bf16", "fp16")}

TRAIN_RULES = [  # (key, op, bound, what to do); a null value (where the type allows it) is not checked
    ("train.seq_len", ">=", 1, "pass a positive length"),
    ("train.batch_size", ">=", 1, "pass at least one sequence per micro-batch"),
    ("train.grad_accum", ">=", 1, "pass at least one micro-batch per step"),
    ("train.total_batch_size", ">=", 1, "pass a token count, or null to use train.grad_accum"),
    ("train.max_steps", ">=", 1, "pass the number of optimizer steps to train"),
    ("train.warmup_steps", ">=", 0, "pass 0 for no warmup"),
    ("train.min_lr_ratio", ">=", 0, "pass a fraction of the peak lr between 0 and 1"),
    ("train.min_lr_ratio", "<=", 1, "pass a fraction of the peak lr between 0 and 1"),
    ("train.grad_clip", ">=", 0, "pass 0 or null for no clipping"),
    ("train.log_interval", ">=", 1, "pass a step count"),
    ("train.eval_interval", ">=", 1, "pass a step count (the last step is always measured)"),
    ("train.eval_batches", ">=", 1, "pass a batch count"),
    ("train.ckpt_interval", ">=", 1, "pass a step count (the last step is always saved)"),
    ("train.time_limit_min", ">=", 0, "pass minutes, or null for no limit"),
    ("train.sample_tokens", ">=", 0, "pass 0 for no sample"),
    ("model.n_layer", ">=", 1, "pass a positive layer count"),
    ("model.n_head", ">=", 1, "pass a positive head count"),
    ("model.n_kv_head", ">=", 1, "pass a positive head count"),
    ("model.d_model", ">", 0, "pass a positive width, a multiple of model.n_head"),
    ("model.mlp_ratio", ">=", 1, "pass a positive ratio"),
    ("model.softcap", ">", 0, "pass a positive logit cap"),
    ("model.lr", ">", 0, "pass a positive learning rate"),
    ("model.muon_lr", ">", 0, "pass a positive learning rate"),
    ("model.window", ">=", 1, "pass a positive window in tokens, or null for full attention"),
    ("optim.lr", ">", 0, "pass a positive learning rate"),
    ("optim.adam_lr", ">", 0, "pass a positive learning rate"),
    ("optim.weight_decay", ">=", 0, "pass 0 for none"),
    ("optim.momentum", ">=", 0, "pass a momentum in [0, 1)"),
    ("optim.momentum", "<", 1, "pass a momentum in [0, 1)"),
]
TRAIN_CHOICES = {
    **COMMON_CHOICES,
    "compile": ("auto", True, False),
    "train.schedule": ("cosine", "linear", "constant"),
    "train.parallel": ("ddp", "fsdp"),
    "logger.mode": ("auto", "online", "offline", "disabled"),
    "optim.name": ("adamw", "muon"),
    "optim.adjust_lr_fn": (None, "original", "match_rms_adamw"),
    "model.qk_norm": ("rms", "learned", "none"),
    "data.bos_aligned": (True, False),  # data options are a plain dict (they differ by source): checked here
}
EVAL_RULES = [
    ("eval.stride", ">=", 1, "pass a token count, or null for half the training length"),
    ("eval.tokens", ">=", 1, "pass how many held-out tokens to score per cell"),
    ("eval.batch_tokens", ">=", 1, "pass tokens per forward pass"),
    ("eval.stream_tokens", ">=", 1, "pass how many tokens to stream"),
    ("eval.block", ">=", 1, "pass tokens per reported block"),
    ("eval.dense_limit", ">=", 1, "pass the dense cache's size in tokens"),
    ("eval.trials", ">=", 1, "pass how many passkey trials to run per (length, depth) cell"),
    ("eval.key_digits", ">=", 1, "pass the pass key's digit count, or null for the checkpoint's"),
    ("eval.rerope_window", ">=", 1, "pass the ReRoPE window w in tokens, or null for half the training length"),
    ("eval.grids", ">=", 1, "pass how many held-out grids to score per size"),
    ("cache.sinks", ">=", 0, "pass 0 for a plain window, or null for the default"),
    ("cache.window", ">=", 1, "pass a positive window, or null for the default"),
]
EVAL_CHOICES = {
    **COMMON_CHOICES,
    "eval.mode": ("length", "stream", "passkey", "grids"),
    "eval.rope_scaling": ("none", "linear", "ntk", "dynamic_ntk", "yarn", "longrope", "rerope", "leaky_rerope", "all"),
    "logger.mode": ("auto", "online", "offline", "disabled"),
}
LONGROPE_RULES = [
    ("target_length", ">=", 2, "pass the length to extend to, longer than the training length"),
    ("search.population", ">=", 2, "pass at least 2 candidates"),
    ("search.parents", ">=", 1, "pass how many of the fittest each generation keeps"),
    ("search.mutations", ">=", 0, "pass how many mutants each generation adds"),
    ("search.crossovers", ">=", 0, "pass how many crossover children each generation adds"),
    ("search.generations", ">=", 0, "pass how many generations to run (0: the initial population only)"),
    ("search.mutation_rate", ">", 0, "pass a probability in (0, 1]"),
    ("search.mutation_rate", "<=", 1, "pass a probability in (0, 1]"),
    ("search.crossover_tries", ">=", 1, "pass how many draws a crossover gets"),
    ("search.step", ">", 0, "pass the factors' grid step, e.g. 0.01"),
    ("search.max_factor", ">", 1, "pass the largest factor (> 1), or null for 1.25 x the extension"),
    ("search.windows", ">=", 1, "pass how many held-out windows score each candidate"),
    ("eval.tokens", ">=", 1, "pass eval.py's eval.tokens (the length table the search keeps clear of)"),
    ("eval.batch_tokens", ">=", 1, "pass tokens per forward pass"),
]
SAMPLE_RULES = [
    ("temperature", ">=", 0, "pass 0 for greedy decoding"),
    ("top_k", ">=", 1, "pass null for the whole vocabulary"),
    ("num_samples", ">=", 1, "pass how many samples to write"),
    ("cache.max_len", ">=", 1, "pass a token count, or null for the default"),
    ("cache.sinks", ">=", 0, "pass 0 for a plain window, or null for the default"),
    ("cache.window", ">=", 1, "pass a positive window, or null for the default"),
    ("rerope_window", ">=", 1, "pass the ReRoPE window w in tokens, or null for half the training length"),
]
SAMPLE_CHOICES = {**COMMON_CHOICES, "cache.kind": ("dense", "sink"), "rope_scaling": ("none", "rerope", "leaky_rerope")}
VIZ_RULES = [
    ("viz.factor", ">", 1, "pass how far past the training length the pictures reach, e.g. viz.factor=4"),
    ("viz.samples", ">=", 1, "pass how many random queries to average"),
    ("train.seq_len", ">=", 2, "pass the training length the pictures mark (a checkpoint gives its own)"),
]
# positional options are plain values (any type): (option, kind, op, bound, what to do), an option's every rule
POSITIONAL_RULES = [
    ("base", float, ">", 0, "pass a positive rotary/sinusoid base"),
    ("max_positions", int, ">=", 1, "pass the table size in positions"),
    ("n_sink", int, ">=", 1, "pass how many learned sink tokens to prepend"),
    ("num_buckets", int, ">=", 2, "pass at least 2 buckets"),
    ("max_distance", int, ">=", 1, "pass a positive distance"),
    ("scale", float, ">", 0, "pass a positive scale for the sinusoids"),
    ("init_std", float, ">", 0, "pass a positive init std for the table"),
    ("r2_max", float, ">", 0, "pass the power variant's largest exponent, in (0, 2]"),
    ("r2_max", float, "<=", 2, "pass the power variant's largest exponent, in (0, 2]"),
    ("hidden", int, ">=", 1, "pass how many hidden units each head's MLP has"),
    ("threshold", float, ">", 0, "pass FIRE's starting threshold L in positions"),
    ("init_c", float, ">", 0, "pass FIRE's starting c, a positive number"),
    ("rotary_fraction", float, ">", 0, "pass a fraction in (0, 1] of each head's dimension pairs to rotate"),
    ("rotary_fraction", float, "<=", 1, "pass a fraction in (0, 1] of each head's dimension pairs to rotate"),
    ("scale_base", float, ">", 0, "pass a positive xPos decay length"),
    ("gamma", float, ">", 0, "pass a positive xPos gamma"),
    ("attn_scale", float, ">=", 0, "pass the NoPE query temperature's slope, 0 for none (Llama 4: 0.1)"),
    ("floor_scale", float, ">", 0, "pass the positions after which the NoPE query temperature grows"),
    ("scaling_factor", float, ">=", 1, "pass s >= 1, the new length over the original (4 for 256 -> 1024)"),
    ("original_length", int, ">=", 1, "pass the length the model was trained at, or null for init_from's"),
]
NULLABLE = {"original_length"}  # null: filled in from init_from (utils/finetune.py)
# KERPLE's variant; a rotary extension fixed for training (dynamic_ntk moves with the length, so a fine-tune at one
# length would not fix the frequencies it is evaluated with: ntk is its fixed form)
POSITIONAL_CHOICES = {
    "variant": ("log", "power"),
    "scaling": ("none", "linear", "ntk", "yarn"),
    "interleaved": (True, False),
}


def show(value):
    """A value as it is written on the command line (null, true, false)."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else value


def check_rules(cfg, rules):
    for key, op, bound, hint in rules:
        value = OmegaConf.select(cfg, key)  # absent (another group's option) or null: nothing to check
        if value is not None and not OPS[op](value, bound):
            raise UserError(f"{key}={show(value)} must be {op} {bound}; {hint}")


def check_choices(cfg, choices: dict):
    for key, allowed in choices.items():
        value = OmegaConf.select(cfg, key, default=ABSENT)  # absent: another group's option
        if value is not ABSENT and not any(value == a and type(value) is type(a) for a in allowed):
            names = ", ".join(str(show(a)) for a in allowed)
            raise UserError(f"{key}={show(value)} is not one of {names}; pick one")


def check_device(cfg):
    if not isinstance(cfg.device, str) or not DEVICE.fullmatch(cfg.device):
        raise UserError(f"device={cfg.device} is not one of auto, cpu, cuda, cuda:<index>; pick one")


def check_positional(spec, key: str = "positional"):
    """The scheme's name and the options that are cheap to check; its own code checks the rest at build."""
    from positional import SCHEMES, layer_pattern  # the scheme registry (imports torch): only when a run is checked

    if not isinstance(spec, dict) or spec.get("name") not in SCHEMES:
        name = spec.get("name") if isinstance(spec, dict) else spec
        raise UserError(f"{key}.name={show(name)} is not one of {', '.join(SCHEMES)}; pick one")
    for option, allowed in POSITIONAL_CHOICES.items():
        if option in spec and spec[option] not in allowed:
            raise UserError(f"{key}.{option}={show(spec[option])} is not one of {', '.join(allowed)}; pick one")
    for option, kind, op, bound, hint in POSITIONAL_RULES:
        if option not in spec or (option in NULLABLE and spec[option] is None):
            continue
        value = spec[option]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or (kind is int and not isinstance(value, int)) or not OPS[op](value, bound):
            want = "a whole number" if kind is int else "a number"
            raise UserError(f"{key}.{option}={show(value)} must be {want} {op} {bound}; {hint}")
    if "inner" in spec:
        check_positional(spec["inner"], f"{key}.inner")
    try:
        layer_pattern(spec)
    except ValueError as e:
        raise UserError(str(e).replace("positional.", f"{key}.", 1)) from None
    kind = spec.get("scaling", "none")
    if kind != "none" and not rotary(spec):
        raise UserError(
            f"{key}.scaling={kind} rescales rotary frequencies and {key}={spec['name']} has none; drop it "
            f"(init_from alone fine-tunes any scheme at a new train.seq_len)"
        )
    if kind != "none" and spec.get("scaling_factor", 1) == 1:
        raise UserError(f"{key}.scaling={kind} at {key}.scaling_factor=1 changes nothing; pass the factor (e.g. 4)")
    if kind != "none" and spec.get("original_length") is None:  # init_from fills it in (utils/finetune.py)
        raise UserError(
            f"{key}.scaling={kind} scales the frequencies of a model trained at a shorter length: pass "
            f"init_from=<its run folder>, or {key}.original_length=<that length>"
        )


def rotary(spec: dict) -> bool:
    from positional import SCHEMES

    return rotary(spec["inner"]) if "inner" in spec else SCHEMES[spec["name"]].rotary


def model_config(resolved: dict, vocab_size: int) -> dict:
    """The network's own config from a resolved run config: configs/model/*.yaml less RUN_KEYS, and the scheme.
    The scheme's scaling keys (train.yaml) stay only where a scaling is on, so an unscaled model's config is what it
    was before they existed (its checkpoints still resume) and a scaled one carries its frequencies' recipe."""
    from positional import SCALING_KEYS

    model = {k: v for k, v in resolved["model"].items() if k not in RUN_KEYS}
    pos = dict(resolved["positional"])
    if pos.get("scaling", "none") == "none":
        pos = {k: v for k, v in pos.items() if k not in SCALING_KEYS}
    return {**model, "vocab_size": vocab_size, "positional": pos}


def check_model(cfg):
    """Build the model on the meta device (no memory, no time) so that every constraint between its keys (heads
    dividing the width, an even rotary head dim, a table covering train.seq_len) fails before data is read."""
    import torch

    from utils.checkpoint import build_model

    resolved = OmegaConf.to_container(cfg, resolve=True)
    m = resolved["model"]
    if m["d_model"] % m["n_head"] == 0 and m["d_model"] // m["n_head"] % 2 and rotary(resolved["positional"]):
        raise UserError(
            f"model.d_model={m['d_model']} / model.n_head={m['n_head']} gives an odd head dim "
            f"({m['d_model'] // m['n_head']}), and rotary positions rotate pairs of dims; pick a model.d_model "
            f"that is a multiple of 2 x model.n_head"
        )
    try:
        with torch.device("meta"):
            model = build_model(model_config(resolved, vocab_size=512))
    except NotImplementedError:  # a module that cannot be built without data: checked at its real build
        return
    model.pe.check_length(cfg.train.seq_len)


def check_train(cfg):
    check_device(cfg)
    check_choices(cfg, TRAIN_CHOICES)
    check_rules(cfg, TRAIN_RULES)
    if cfg.dtype == "fp16" and cfg.train.parallel == "fsdp":
        raise UserError("dtype=fp16 needs one gradient scaler over all shards, which FSDP lacks here; use dtype=bf16")
    betas = OmegaConf.select(cfg, "optim.betas")
    if betas is not None and (len(betas) != 2 or not all(0 <= b < 1 for b in betas)):
        raise UserError(f"optim.betas={list(betas)} must be two numbers in [0, 1); e.g. optim.betas=[0.9,0.95]")
    pattern = cfg.model.window_pattern
    if not re.fullmatch(r"[SL]+", pattern):
        raise UserError(f"model.window_pattern={pattern} may hold only S (window) and L (full); e.g. SSSL")
    check_positional(OmegaConf.to_container(cfg.positional, resolve=True))
    check_model(cfg)


def check_eval(cfg):
    check_device(cfg)
    check_choices(cfg, EVAL_CHOICES)
    check_rules(cfg, EVAL_RULES)
    lengths = cfg.eval.lengths
    if lengths is not None and (len(lengths) == 0 or min(lengths) < 1):
        raise UserError(f"eval.lengths={list(lengths)} must be positive token counts; e.g. eval.lengths=[256,1024]")
    depths = cfg.eval.depths
    if len(depths) == 0 or not all(0 <= d <= 1 for d in depths):
        raise UserError(f"eval.depths={list(depths)} must be fractions in [0, 1]; e.g. eval.depths=[0,0.5,1]")
    sizes = cfg.eval.grid_sizes
    if sizes is not None and (not sizes or any(len(s) != 2 or s[0] < 2 or s[1] < 1 for s in sizes)):
        shown = [list(s) for s in sizes]
        raise UserError(f"eval.grid_sizes={shown} must be [height >= 2, width >= 1] pairs; e.g. [[16,14],[32,30]]")
    factor = cfg.eval.rope_factor
    if factor != "auto" and (isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 0):
        raise UserError(f"eval.rope_factor={show(factor)} must be auto or a positive number")
    check_leak(cfg.eval.rerope_leak, "eval.rerope_leak")


def check_leak(k, key: str):
    """Leaky ReRoPE's compression k (positional/rerope.py): auto, or a number >= 1."""
    if k != "auto" and (isinstance(k, bool) or not isinstance(k, int | float) or k < 1):
        raise UserError(f"{key}={show(k)} must be auto or a number >= 1 (1: no compression); e.g. {key}=16")


def check_longrope(cfg):
    check_device(cfg)
    check_choices(cfg, COMMON_CHOICES)
    check_rules(cfg, LONGROPE_RULES)
    s = cfg.search
    if s.parents > s.population:
        raise UserError(f"search.parents={s.parents} must be <= search.population={s.population}; keep fewer")
    if not s.start_tokens or min(s.start_tokens) < 0:
        raise UserError(f"search.start_tokens={list(s.start_tokens)} must be counts >= 0; e.g. [0,4,16]")
    lengths = cfg.eval.lengths
    if lengths is not None and (len(lengths) == 0 or min(lengths) < 1):
        raise UserError(f"eval.lengths={list(lengths)} must be positive token counts; e.g. eval.lengths=[256,1024]")


def check_viz(cfg):
    check_rules(cfg, VIZ_RULES)
    heads = cfg.viz.heads
    if heads is not None and (not heads or any(len(pair) != 2 for pair in heads)):
        shown = [list(pair) for pair in heads]
        raise UserError(f"viz.heads={shown} must be [layer, head] pairs; e.g. viz.heads=[[0,1],[3,2]]")
    if cfg.viz.all and cfg.checkpoint:
        raise UserError("viz.all=true draws every scheme at init; drop checkpoint=, or pass sweep_dir= for every run")
    if cfg.checkpoint and cfg.sweep_dir:
        raise UserError("pass checkpoint= (one run) or sweep_dir= (every run of a sweep), not both")
    if not (cfg.checkpoint or cfg.sweep_dir):
        check_positional(OmegaConf.to_container(cfg.positional, resolve=True))
        check_model(cfg)


def check_sample(cfg):
    check_device(cfg)
    check_choices(cfg, SAMPLE_CHOICES)
    check_rules(cfg, SAMPLE_RULES)
    if cfg.max_new_tokens < 1 and cfg.max_new_tokens != -1:
        raise UserError(f"max_new_tokens={cfg.max_new_tokens} must be >= 1, or -1 to stream without end (cache=sink)")
    check_leak(cfg.rerope_leak, "rerope_leak")
