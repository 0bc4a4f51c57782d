"""The settings of the entry points that read a trained run: eval.py, sample.py, viz.py and LongRoPE's search.

python eval.py --cfg job            every key of an evaluation and its value (python sample.py --cfg job, ...)
python eval.py eval.stride=0        error: eval.stride=0 must be >= 1; pass a token count, or null for half ...
As utils/schema.py does for training: a dataclass per node, stored in Hydra's ConfigStore as schema/<entry point>
(and schema/cache/<kind>) when this module is imported, which each of those entry points does first, so a training
run never loads them (nor the RoPE scalings their choices list).
"""

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

import settings
from positional import dca, hf_rope_scaling
from positional.hf_rope_scaling import HFRopeScaling
from positional.rope_scaling import KINDS, SEARCHED, SPLITS
from settings import Rule, choices, fixed, group, number, setting
from utils.checkpoint import run_checkpoint, sweep_folder
from utils.errors import FROM_CHECKPOINT  # an override of one of these names where it is set
from utils.files import prompt_file, writable_folder
from utils.schema import (
    CHECKPOINT_HINT,
    ENTRY_POINTS,
    GROUPS,
    MAX_COUNT,
    MAX_TOKENS,
    ODD_HEAD,
    RUN,
    DType,
    ModelSize,
    WandbMode,
    device,
    seed,
)

CacheKind = choices("CacheKind", "dense", "sink")

# length: ppl by evaluation length | stream: ppl over one long stream, through each cache | passkey: retrieval
# accuracy by length and depth (evaluation/passkey.py) | grids: data=grids models on larger grids (evaluation/grids.py)
Mode = choices("Mode", "length", "stream", "passkey", "grids", "tasks")
# eval.py: the closed-form kinds, the searched ones (longrope: searched first), rerope's and dca, and all (the
# closed-form)
RopeScaling = choices("RopeScaling", *KINDS, *SEARCHED, *SPLITS, "all")
# sample.py: training-free decoding past L through a KV cache, which holds keys rotated once: every kind but
# dynamic_ntk, which a rule refuses by name (its frequencies move with the length)
SampleScaling = choices("SampleScaling", *KINDS, *SEARCHED, *SPLITS)


# ---- a training-free extension: eval.py's eval node and sample.py's top level ----


@dataclass
class Extension:
    """A RoPE extension of a rotary checkpoint (positional/rope_scaling.py, rerope.py, dca.py): each key's one home."""

    # training-free decoding past L (sample.py, at factor capacity / L; eval.py: its own kinds, below)
    rope_scaling: SampleScaling = "none"
    # a Hugging Face rope_scaling dict, e.g. {rope_type: yarn, factor: 4}, computed as transformers computes it
    # (positional/hf_rope_scaling.py); its factor is its own. eval.py: one more row, hf_<rope_type>
    hf_rope_scaling: HFRopeScaling = field(default_factory=HFRopeScaling)
    # rerope, leaky_rerope: the window w of exact distances
    rerope_window: int | None = setting(
        None, "pass the ReRoPE window w in tokens, or null for half the training length", ge=1
    )
    # leaky_rerope: far distances w + (d - w) / k; auto: the smallest k >= 1 keeping every distance within the trained
    # ones (positional/rerope.py)
    rerope_leak: Any = setting(
        "auto",
        "e.g. 16",
        test=lambda k: k == "auto" or number(k) and 1 <= k < math.inf,
        must="be auto or a number >= 1 (1: no compression)",
    )
    # dca: the chunk size S, the largest position a score uses (positional/dca.py)
    dca_chunk: int | None = setting(
        None, "pass DCA's chunk size S in tokens, or null for 3/4 of the training length", ge=2
    )
    # dca: the local window w; chunks are S - w tokens, and a chunk's first w queries see the previous chunk exactly
    dca_local: int | None = setting(
        None, "pass DCA's local window w in tokens, below S, or null for 1/8 of the training length", ge=1
    )
    # true: the scaling on the full-attention layers alone (OLMo 3); eval.py: also <kind>_full rows
    full_layers: bool = False

    RULES: ClassVar = (
        Rule(
            ("dca_chunk", "dca_local"),
            dca.fits,
            "{0} and {1}: chunks of S - w tokens need w < S (null: 3/4 and 1/8 of {run}'s training length, "
            "{train_length}); pass a smaller local window or a larger chunk",
            ("train_length",),
        ),
    )


# ---- eval.py and evaluation/longrope_search.py ----


@dataclass
class Scoring:
    """The length table: eval.py's eval node, and the one LongRoPE's search keeps clear of."""

    # token counts (length and passkey modes); null: 0.5, 1, 2, 4, 8, 16 x the training length
    lengths: list[int] | None = setting(  # length mode scores only what the held-out documents hold, and says so
        None, "pass positive token counts, e.g. eval.lengths=[256,1024]", ge=1, le=2**40, nonempty=True
    )
    # at least this many held-out tokens scored per cell (the same tokens in every cell), in pieces of the longest
    # length, an equal number from each held-out work (fewer where the held-out works hold fewer, with a note)
    tokens: int = setting(65536, "pass how many held-out tokens to score per cell", ge=1, le=2**30)
    batch_tokens: int = setting(16384, "pass tokens per forward pass", ge=1, le=MAX_TOKENS)
    prepare: bool = False  # prepare the checkpoint's held-out data if it is missing


@dataclass
class Eval(Scoring, Extension):
    mode: Mode = "length"
    # false: the non-overlapping windows alone, a third of the forwards (sliding windows at stride L/2 read twice
    # the tokens they score); for a scheme whose weights cost T^2 or more per window at the long lengths
    sliding: bool = True
    stride: int | None = setting(  # sliding-window stride at every length; null: half of each length (L/2)
        None, "pass a token count, or null for half the training length", ge=1, le=MAX_TOKENS
    )
    # a RoPE extension (rotary schemes): linear | ntk | dynamic_ntk | yarn | yarn_released | llama3 | longrope
    # (searched first) | rerope | leaky_rerope | dca | all (the closed-form ones, and longrope where its search files
    # exist for every length)
    rope_scaling: RopeScaling = "none"
    rope_factor: Any = setting(  # auto: eval length / training length
        "auto",
        "e.g. eval.rope_factor=4",
        test=lambda f: f == "auto" or number(f) and 0 < f < math.inf,
        must="be auto or a positive number",
    )
    rerope: bool = False  # true: also rerope and leaky_rerope rows (rotary schemes), beside eval.rope_scaling's
    dca: bool = False  # true: also a dca row (rotary schemes), beside eval.rope_scaling's
    log_scaling: bool = False  # true: also a `log` row, logits x max(1, ln n / ln L) past the training length L
    # stream mode: tokens fed through each cache (default 50 x a 256-token training length)
    stream_tokens: int = setting(12800, "pass how many tokens to stream", ge=1, le=MAX_TOKENS)
    block: int = setting(256, "pass tokens per reported block", ge=1, le=MAX_TOKENS)  # stream: tokens per block
    # stream mode: where the dense cache stops
    dense_limit: int = setting(16384, "pass the dense cache's size in tokens", ge=1, le=MAX_TOKENS)
    # passkey mode: where the needle sits in the filler (0: first, 1: last)
    depths: list[float] = setting(
        [0.0, 0.25, 0.5, 0.75, 1.0], "pass fractions in [0, 1]; e.g. eval.depths=[0,0.5,1]", ge=0, le=1, nonempty=True
    )
    # passkey mode: per (length, depth) cell; tasks mode: per (task, length) cell
    trials: int = setting(50, "pass how many trials to run per cell", ge=1, le=MAX_COUNT)
    # passkey mode: digits of the key; null: the model's data.key_digits (data=passkey), else 5
    key_digits: int | None = setting(
        None, "pass the pass key's digit count, or null for the checkpoint's", ge=1, le=100
    )
    seed: int = seed()  # passkey mode: keys and filler positions; grids, tasks modes: the held-out samples
    # grids mode: [height, width] pairs; null: the training size, 2x taller, 2x wider, both
    grid_sizes: list[list[int]] | None = setting(
        None,
        "e.g. eval.grid_sizes=[[16,14],[32,30]]",
        test=lambda sizes: (
            len(sizes) > 0 and all(len(s) == 2 and 2 <= s[0] <= 4096 and 1 <= s[1] <= 4096 for s in sizes)
        ),
        must="be [height, width] pairs, height in [2, 4096], width in [1, 4096]",
    )
    # grids mode: per size
    grids: int = setting(64, "pass how many held-out grids to score per size", ge=1, le=MAX_COUNT)

    RULES: ClassVar = (
        Rule(  # a passkey sample is made at the length asked for, from filler: bounded, so none is made without end
            ("lengths", "mode"),
            lambda lengths, mode: mode != "passkey" or not lengths or max(lengths) <= MAX_TOKENS,
            f"{{0}} in {{1}}: a sample is made at each length, and these pass {MAX_TOKENS:,} tokens; pass shorter ones",
        ),
        Rule(
            ("lengths", "mode"),
            lambda lengths, mode: lengths is None or mode in ("length", "passkey"),
            "{0} is read in length and passkey modes, and {1} scores at lengths of its own; pass eval.lengths=null",
        ),
        *Extension.RULES,
        Rule(
            ("stride", "sliding"),
            lambda stride, sliding: stride is None or sliding,
            "{0} is the sliding windows' stride, and {1} scores none; pass eval.sliding=true, or eval.stride=null",
        ),
    )


@dataclass
class EvalCache:  # stream mode's sink caches; sample.py's cache=sink
    sinks: int | None = setting(  # null: the scheme's learned sink tokens if it has them, else 4
        None, "pass 0 for a plain window, or null for the default", ge=0, le=MAX_TOKENS
    )
    window: int | None = setting(  # null: training length - sinks (the cache as large as the training context)
        None, "pass a positive window, or null for the default", ge=1, le=MAX_TOKENS
    )


@dataclass
class EvalLogger:
    wandb: bool = True  # the length tables, to the run's wandb project
    mode: WandbMode = "auto"


NAMED = lambda path, running: bool(path)  # noqa: E731  (a rule: a run to read is given)


def checkpoint_setting():  # a run folder (holding ckpt.pt) or a .pt file
    return setting(None, CHECKPOINT_HINT, nonempty=True, files=run_checkpoint)


@dataclass
class Runs:  # what eval.py and viz.py read: one run, or every run of a training sweep
    checkpoint: str | None = checkpoint_setting()
    sweep_dir: str | None = setting(
        None, "pass a training sweep folder (multirun/<time>)", nonempty=True, files=sweep_folder
    )

    RULES: ClassVar = (
        Rule(
            ("checkpoint", "sweep_dir"),
            lambda checkpoint, sweep_dir: not (checkpoint and sweep_dir),
            "{0} and {1} are both given; pass one: checkpoint= (one run) or sweep_dir= (every run of a sweep)",
        ),
    )


CACHE_ROOM = (  # sinks < capacity, where the window is left to fill the training length
    "{0} leaves no room for recent tokens: with {1} the cache holds the training length, {train_length} tokens "
    "(+ {n_prefix} learned sinks), sinks included; pass fewer sinks, or a window"
)


def room(sinks, window, train_length: int, n_prefix: int) -> bool:
    """Whether a sink cache whose window fills the training length (window null) keeps a token besides its sinks."""
    return window is not None or ((n_prefix or 4) if sinks is None else sinks) < train_length + n_prefix


@dataclass
class EvalConfig(Runs):
    device: str = device()
    dtype: DType = "auto"
    eval: Eval = field(default_factory=Eval)
    cache: EvalCache = field(default_factory=EvalCache)
    logger: EvalLogger = field(default_factory=EvalLogger)

    FROM_CHECKPOINT: ClassVar = FROM_CHECKPOINT
    RULES: ClassVar = (
        Rule(
            ("checkpoint", "sweep_dir"),
            lambda checkpoint, sweep_dir, running: bool(checkpoint or sweep_dir),
            "{0} and {1}: nothing to evaluate; pass checkpoint=<run folder or ckpt.pt>, or sweep_dir=<training sweep "
            "folder>",
            needs=RUN,
        ),
        *Runs.RULES,
        Rule(  # a learned table: a length past it is n/a, and a table of nothing but n/a is refused
            ("eval.lengths", "eval.mode"),
            lambda lengths, mode, table: table is None or not lengths or mode == "stream" or min(lengths) <= table,
            "{0} are all past the learned table of {run}, {max_positions} positions: every cell would be n/a; pass a "
            "length <= {max_positions} (longer ones are marked n/a)",
            needs=("max_positions",),
        ),
        Rule(
            ("cache.sinks", "cache.window", "eval.mode"),
            lambda sinks, window, mode, length, prefix: mode != "stream" or room(sinks, window, length, prefix),
            CACHE_ROOM,
            needs=("train_length", "n_prefix"),
        ),
    )


SEARCH_MAX = 10**4  # candidates, generations, windows: each one a scoring pass


@dataclass
class Search:  # LongRoPE's evolutionary search (evaluation/longrope_search.py); the paper: 64, 32, 16, 16, 40
    # the initial population: PI, NTK and YaRN as factors, and mutants of them
    population: int = setting(16, "pass at least 2 candidates", ge=2, le=SEARCH_MAX)
    parents: int = setting(8, "pass how many of the fittest each generation keeps", ge=1, le=SEARCH_MAX)
    mutations: int = setting(8, "pass how many mutants each generation adds", ge=0, le=SEARCH_MAX)
    # crossover children added each generation (a mutant where no valid child is found)
    crossovers: int = setting(8, "pass how many crossover children each generation adds", ge=0, le=SEARCH_MAX)
    generations: int = setting(
        6, "pass how many generations to run (0: the initial population only)", ge=0, le=SEARCH_MAX
    )
    # the chance each factor (and start_tokens) is redrawn in a mutation (the released code's)
    mutation_rate: float = setting(0.3, "pass a probability in (0, 1]", gt=0, le=1)
    # for a non-decreasing child
    crossover_tries: int = setting(20, "pass how many draws a crossover gets", ge=1, le=SEARCH_MAX)
    step: float = setting(0.01, "pass the factors' grid step, e.g. 0.01", ge=1e-4, le=1)  # the factors' grid
    # the largest factor; null: 1.25 x s (the paper's range)
    max_factor: float | None = setting(
        None, "pass the largest factor (> 1), or null for 1.25 x the extension", gt=1, le=MAX_TOKENS
    )
    start_tokens: list[int] = setting(  # n-hat: first positions kept unscaled
        [0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256],
        "pass counts, e.g. [0,4,16]",
        ge=0,
        le=MAX_TOKENS,
        nonempty=True,
    )
    # fixed held-out windows of target_length scored per candidate (the fitness)
    windows: int = setting(8, "pass how many held-out windows score each candidate", ge=1, le=SEARCH_MAX)
    seed: int = seed()

    RULES: ClassVar = (
        Rule(
            ("parents", "population"),
            lambda parents, population: parents <= population,
            "{0} must be <= {1}; keep fewer",
        ),
    )


@dataclass
class LongRoPEConfig:
    checkpoint: str | None = checkpoint_setting()
    # the length to extend to (s = target_length / the training length)
    target_length: int = setting(
        MISSING, "pass the length to extend to, longer than the training length", ge=2, le=MAX_TOKENS
    )
    device: str = device()
    dtype: DType = "auto"
    search: Search = field(default_factory=Search)
    eval: Scoring = field(default_factory=Scoring)  # eval.py's keys and defaults: its table, kept clear of

    FROM_CHECKPOINT: ClassVar = FROM_CHECKPOINT
    RULES: ClassVar = (
        Rule(("checkpoint",), NAMED, "{0}: nothing to search; pass checkpoint=<run folder or ckpt.pt>", RUN),
        Rule(
            ("target_length",),
            lambda target, length: target > length,
            "{0} must be longer than the training length of {run}, {train_length}; pass a longer target_length",
            needs=("train_length",),
        ),
    )


# ---- sample.py ----


DYNAMIC_IN_CACHE = (  # sample.py decodes through a KV cache
    "{0} rescales the frequencies with the current length, and a KV cache keeps every key rotated at the scale of "
    "the step that stored it, so old and new keys would disagree; use ntk, its fixed form (eval.py scores dynamic NTK "
    "in full forwards)"
)


@dataclass
class DenseCache:  # every token kept (KV cache); stops at the scheme's limit or max_len
    kind: CacheKind = fixed("dense", "cache")
    # null: the learned table's size, or 16 x the training length for other schemes
    max_len: int | None = setting(None, "pass a token count, or null for the default", ge=1, le=MAX_TOKENS)


@dataclass
class SinkCache(EvalCache):  # StreamingLLM: the first `sinks` tokens and a ring of the `window` most recent
    kind: CacheKind = fixed("sink", "cache")

    RULES: ClassVar = (Rule(("sinks", "window"), room, CACHE_ROOM, needs=("train_length", "n_prefix")),)


@dataclass
class SampleConfig(Extension):
    checkpoint: str | None = checkpoint_setting()
    # text, or @path/to/file.txt; empty: start from the BOS token
    prompt: str = setting("", "pass the text, or @path/to/file.txt to read it from a file", files=prompt_file)
    max_new_tokens: int = setting(  # -1: without end (cache=sink), until Ctrl-C
        500,
        "pass how many tokens to generate",
        test=lambda n: n >= 1 or n == -1,
        must="be >= 1, or -1 to stream without end (cache=sink)",
    )
    # below 0.001 the scores past the top one underflow in float32: pass 0, greedy decoding, which is what it nears
    temperature: float = setting(
        0.8,
        "pass 0 for greedy decoding",
        ge=0,
        test=lambda t: t == 0 or t >= 1e-3,
        must="be 0 (greedy) or at least 0.001",
    )
    top_k: int | None = setting(50, "pass null for the whole vocabulary", ge=1, le=MAX_TOKENS)
    seed: int = seed()
    num_samples: int = setting(1, "pass how many samples to write", ge=1, le=MAX_COUNT)
    static: bool = False  # true: a compiled fixed-shape decode step (CUDA graphs on a GPU); compiles once, first
    device: str = device()
    dtype: DType = "auto"
    cache: Any = group("cache")  # typed by its group: DenseCache, SinkCache

    FROM_CHECKPOINT: ClassVar = FROM_CHECKPOINT
    RULES: ClassVar = (
        Rule(("checkpoint",), NAMED, "{0}: nothing to sample from; pass checkpoint=<run folder or ckpt.pt>", RUN),
        Rule(
            ("max_new_tokens", "cache.kind"),
            lambda n, kind: n >= 0 or kind == "sink",
            "{0} streams without end, which only a constant-size cache can, and {1} cannot; use cache=sink",
        ),
        Rule(("rope_scaling",), lambda kind: kind != "dynamic_ntk", DYNAMIC_IN_CACHE),
        Rule(("hf_rope_scaling.rope_type",), lambda kind: kind != "dynamic", DYNAMIC_IN_CACHE),
        Rule(("hf_rope_scaling.type",), lambda kind: kind != "dynamic", DYNAMIC_IN_CACHE),
        *Extension.RULES,
        Rule(
            ("full_layers", "rope_scaling", "hf_rope_scaling"),
            lambda full, kind, hf: not full or kind not in ("none", *SPLITS) or hf_rope_scaling.given(hf),
            "{0} scales the full-attention layers alone, and {1} changes no frequency; pass e.g. rope_scaling=yarn",
        ),
        Rule(
            ("rope_scaling", "hf_rope_scaling"),
            lambda kind, hf: kind == "none" or not hf_rope_scaling.given(hf),
            "{0} and a hf_rope_scaling dict are two scalings; pass one of them",
        ),
    )


# ---- viz.py ----


MAX_DISTANCES = 2**18  # a picture's distance axis: the rotary decay of viz.samples queries at each distance


@dataclass
class Viz:
    out: str | None = setting(  # null: <run>/pictures, <sweep_dir>/pictures, or pictures/ (a scheme at init, viz.all)
        None, "pass a folder to write the pictures into (made if missing)", nonempty=True, files=writable_folder
    )
    all: bool = False  # true: every scheme at init into one folder + index.md
    # distance axes reach factor x L; the rope scaling variants extend by this factor
    factor: float = setting(4.0, "pass how far past the training length the pictures reach, e.g. viz.factor=4", gt=1)
    # q = k draws for the decay curve
    samples: int = setting(128, "pass how many random queries to average", ge=1, le=2**16)
    # attention maps of these [layer, head] pairs; null: picked by first-token share (the first and last layer's
    # sinkiest head, then the sinkiest overall)
    heads: list[list[int]] | None = setting(
        None,
        "e.g. viz.heads=[[0,1],[3,2]]",
        test=lambda heads: len(heads) > 0 and all(len(p) == 2 and min(p) >= 0 for p in heads),
        must="be [layer, head] pairs counted from 0",
    )
    prepare: bool = False  # prepare the checkpoint's held-out data if it is missing
    seed: int = seed()


@dataclass
class VizTrain:  # the training length L without a checkpoint (learned table size, FIRE's threshold)
    seq_len: int = setting(
        256, "pass the training length the pictures mark (a checkpoint gives its own)", ge=2, le=MAX_TOKENS
    )


@dataclass
class VizConfig(Runs):
    viz: Viz = field(default_factory=Viz)
    train: VizTrain = field(default_factory=VizTrain)
    model: ModelSize = field(default_factory=ModelSize)  # its heads and widths (a checkpoint brings its own)
    positional: Any = group("positional")  # the scheme drawn at init when no checkpoint is given

    RULES: ClassVar = (
        Rule(
            ("viz.all", "checkpoint"),
            lambda every, checkpoint: not (every and checkpoint),
            "{0} draws every scheme at init, and {1} is one run; drop checkpoint=, or pass sweep_dir= for every run",
        ),
        *Runs.RULES,
        ODD_HEAD,
        Rule(  # each picture's distance axis holds factor x L distances: bounded, so no picture runs without end
            ("viz.factor", "train.seq_len"),
            lambda factor, length: factor * length <= MAX_DISTANCES,
            f"{{0}} x {{1}} is more distances than the pictures draw ({MAX_DISTANCES:,}); pass a smaller factor",
        ),
        Rule(
            ("viz.factor",),
            lambda factor, length: factor * length <= MAX_DISTANCES,
            "{0} x the training length of {run}, {train_length}, is more distances than the pictures draw "
            f"({MAX_DISTANCES:,}); pass a smaller factor",
            needs=("train_length",),
        ),
    )


READERS = {"eval": EvalConfig, "sample": SampleConfig, "viz": VizConfig, "longrope": LongRoPEConfig}
CACHES = {"dense": DenseCache, "sink": SinkCache}


def register():
    cs = ConfigStore.instance()
    for name, node in READERS.items():
        cs.store(group="schema", name=name, node=node)
    for name, node in CACHES.items():
        cs.store(group="schema/cache", name=name, node=node)
    ENTRY_POINTS.update(READERS)
    GROUPS["cache"] = settings.OPTIONS["cache"] = CACHES


register()
