"""Every bad input is one line on stderr, 'error: ...' naming the key, and exit status 2, before any work.

The subprocess cases run an entry point the way a user types it; those that need no checkpoint must fail before
anything is printed (no data prepared, no model built, no checkpoint read). The in-process cases make the same checks
an entry point makes before any work (composing, the walk of settings.py, the model on the meta device) on more
values, which is quicker than a process each.
"""

import pytest
from conftest import ROOT, SCHEMES, run
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from utils import checkpoint, checks
from utils.errors import UserError, compose_message

TRAIN = ["train.py", "device=cpu", "logger.wandb=false"]
EVAL = ["eval.py", "device=cpu", "logger.wandb=false"]
SAMPLE = ["sample.py", "device=cpu"]
NO_CKPT = "checkpoint=/no/such/run"  # validation comes first, so the missing checkpoint is never reached

CASES = [  # (entry point and overrides, the key the message must name)
    (TRAIN + ["train.seq_len=0"], "train.seq_len"),
    (TRAIN + ["train.batch_size=0"], "train.batch_size"),
    (TRAIN + ["optim.lr=abc"], "optim.lr"),
    (TRAIN + ["model.d_model=-4"], "model.d_model"),
    (TRAIN + ["model.d_model=36"], "model.d_model"),  # an odd rotary head dim
    (TRAIN + ["train.max_steps=-1"], "train.max_steps"),
    (TRAIN + ["train.schedule=cosin"], "train.schedule"),
    (TRAIN + ["dtype=fp8"], "dtype"),
    (TRAIN + ["compile=yes"], "compile"),
    (TRAIN + ["optim=muon", "optim.adam_lr=0"], "optim.adam_lr"),
    (TRAIN + ["positional=sink", "positional.n_sink=0"], "positional.n_sink"),
    (TRAIN + ["positional=xpoz"], "positional"),
    (TRAIN + ["positional=irope", "positional.layers=PPXN"], "positional.layers"),
    (TRAIN + ["model=null"], "model=null is not one of"),
    (["train.py", "--cfg", "jobb"], "invalid choice: 'jobb'"),  # Hydra's own flags: one line too
    (TRAIN + ["compile=null"], "compile=null"),  # a setting of mixed type takes null only where it is the default
    (TRAIN + ["positional=sink", "positional.inner=null"], "positional.inner=null"),
    (EVAL + [NO_CKPT, "eval.rope_factor=null"], "eval.rope_factor=null"),
    (EVAL + [NO_CKPT, "eval.mode=tasks", "eval.lengths=[64]"], "eval.lengths=[64] is read in length and passkey"),
    (EVAL + [NO_CKPT, "eval.sliding=false", "eval.stride=16"], "eval.stride=16 is the sliding windows' stride"),
    (TRAIN + ["positional=irope", "model.n_layer=3"], "positional.layers=PPPN is longer than the network"),
    (TRAIN + ["experiment=gemma3", "model.n_layer=4"], "positional.global_base=1000000"),  # all four windowed
    (TRAIN + ["train.max_stepz=3"], "train.max_stepz"),
    (TRAIN + ["train.seq_len=["], "train.seq_len=[ cannot be parsed"),
    (TRAIN + ["positional.bsae=1"], "positional.bsae is not an option of positional=rope (its options: base,"),
    (TRAIN + ["+positional.bsae=1"], "positional.bsae is not an option of positional=rope"),  # + skips Hydra's check
    (TRAIN + ["+train.max_stepz=3"], "train.max_stepz is not an option of train"),
    (TRAIN + ["model.qk_norm=foo"], "model.qk_norm"),
    (TRAIN + ["model.sink_logit=maybe"], "model.sink_logit"),
    (TRAIN + ["data.bos_aligned=maybe"], "data.bos_aligned"),
    (TRAIN + ["init_from=/no/such/run"], "init_from"),
    (TRAIN + ["data=grids", "train.seq_len=100"], "train.seq_len"),  # a row holds one 16 x 14 grid: 256 tokens
    (TRAIN + ["positional=mrope", "positional.sections=[4,4,4]"], "positional.sections"),  # 16 pairs, not 12
    (TRAIN + ["data=tasks", "positional=learned", "data.random_positions=4096"], "positional.max_positions"),
    (EVAL + [NO_CKPT, "eval.tokens=0"], "eval.tokens"),
    (EVAL + [NO_CKPT, "eval.tokens=-4096"], "eval.tokens"),
    (EVAL + [NO_CKPT, "eval.tokens=lots"], "eval.tokens"),
    (EVAL + [NO_CKPT, "eval.tokens=1.5"], "eval.tokens"),
    (EVAL + [NO_CKPT, "eval.batch_tokens=abc"], "eval.batch_tokens"),
    (EVAL + [NO_CKPT, "eval.lengths=[0,64]"], "eval.lengths"),
    (EVAL + [NO_CKPT, "eval.mode=strem"], "eval.mode"),
    (EVAL + [NO_CKPT, "eval.rope_scaling=yarm"], "eval.rope_scaling"),
    (EVAL + [NO_CKPT, "eval.rope_factor=-2"], "eval.rope_factor"),
    (EVAL + [NO_CKPT, "eval.rope_scaling=rerope", "eval.rerope_window=0"], "eval.rerope_window"),
    (SAMPLE + [NO_CKPT, "rope_scaling=leaky_rerope", "rerope_leak=0.5"], "rerope_leak"),
    (
        EVAL + [NO_CKPT, "eval.hf_rope_scaling={rope_type: yarn, factor: 4, bata_fast: 3}"],
        "eval.hf_rope_scaling.bata_fast",
    ),
    (EVAL + [NO_CKPT, "eval.hf_rope_scaling={rope_type: linear, factor: 0.5}"], "eval.hf_rope_scaling.factor=0.5"),
    (SAMPLE + [NO_CKPT, "hf_rope_scaling={rope_type: dynamic, factor: 2}"], "hf_rope_scaling.rope_type=dynamic"),
    (SAMPLE + [NO_CKPT, "rope_scaling=dynamic_ntk"], "rope_scaling=dynamic_ntk"),
    (SAMPLE + [NO_CKPT, "temperature=-1"], "temperature"),
    (SAMPLE + [NO_CKPT, "top_k=0"], "top_k"),
    (SAMPLE + [NO_CKPT, "max_new_tokens=0"], "max_new_tokens"),
    (SAMPLE + [NO_CKPT, "max_new_tokens=-1"], "use cache=sink"),  # a rule between two settings
    (SAMPLE + [NO_CKPT, "static=auto"], "static"),
    (SAMPLE + [NO_CKPT, "cache.kind=ring"], "cache.kind"),
    (SAMPLE + [NO_CKPT, "cache=dense", "cache.window=5"], "cache.window"),
]
WITH_CHECKPOINT = [  # found only once the checkpoint is read; still one line
    (EVAL + ["eval.lengths=[100000000]"], "eval.lengths"),
    (EVAL + ["eval.stride=64", "eval.lengths=[32]"], "eval.stride"),
    (SAMPLE + ["prompt=@/no/such/prompt.txt"], "prompt"),
    (EVAL + ["eval.mode=grids"], "eval.mode"),  # a text model
    (EVAL + ["eval.rope_scaling=dca", "eval.dca_local=30"], "eval.dca_local=30"),  # past S = 3/4 of 32
    (SAMPLE + ["rope_scaling=dca", "dca_chunk=4"], "dca_chunk=4"),  # at w = 1/8 of 32
]


def one_line_error(proc, key: str):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert key in lines[0], lines[0]


def case_id(args) -> str:
    return " ".join([args[0]] + [a for a in args[1:] if a not in TRAIN + EVAL + SAMPLE + [NO_CKPT]])


@pytest.mark.parametrize("args, key", CASES, ids=[case_id(a) for a, _ in CASES])
def test_bad_input_fails_at_once_with_one_line(args, key, tmp_path):
    extra = [f"out_dir={tmp_path}"] if args[0] == "train.py" else []
    proc = run(*args, *extra, timeout=120)
    one_line_error(proc, key)
    assert proc.stdout == "", proc.stdout[-2000:]  # nothing started: no data, no model, no checkpoint read
    assert not {"ckpt.pt", "metrics.jsonl"} & {p.name for p in tmp_path.iterdir()}


@pytest.mark.parametrize("args, key", WITH_CHECKPOINT, ids=[case_id(a) for a, _ in WITH_CHECKPOINT])
def test_bad_input_against_a_checkpoint(args, key, tiny_checkpoint):
    one_line_error(run(*args, f"checkpoint={tiny_checkpoint}", timeout=120), key)


def composed(name: str, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(name, overrides=[*overrides, "out_dir=x"] if name == "train" else list(overrides))


def check(name: str, *overrides):
    """What an entry point checks before any work, in process: the config composes (its error worded as hydra_cli
    words it), then checks.preflight: every setting passes the walk, the paths exist, the model builds on the meta
    device, and the rules that read a checkpoint hold."""
    try:
        cfg = composed(name, *overrides)
    except ConfigCompositionException as e:
        raise UserError(compose_message(e, name)) from None
    checks.preflight(cfg)


@pytest.mark.parametrize(
    "name, overrides, key",
    [
        ("train", ["optim.lr=0"], "optim.lr"),
        ("train", ["data.random_positions=64"], "data=tasks has data.random_positions"),  # a text corpus has none
        ("train", ["data=tasks", "data.random_positions=1"], "data.random_positions=1 must be >= 2"),
        ("train", ["model.n_head=0"], "model.n_head"),
        ("train", ["model.n_head=5"], "model.n_head"),
        ("train", ["model.lr=-1"], "model.lr"),
        ("train", ["train.warmup_steps=-5"], "train.warmup_steps"),
        ("train", ["train.grad_clip=-1"], "train.grad_clip"),
        ("train", ["train.min_lr_ratio=2"], "train.min_lr_ratio"),
        ("train", ["train.parallel=zero"], "train.parallel"),
        ("train", ["dtype=fp16", "train.parallel=fsdp"], "dtype=fp16"),
        ("train", ["device=tpu"], "device"),
        ("train", ["logger.mode=online2"], "logger.mode"),
        ("train", ["optim.name=sgd"], "optim.name"),
        ("train", ["optim.betas=[0.9]"], "optim.betas"),
        ("train", ["model.qk_norm=learnt"], "model.qk_norm"),
        ("train", ["optim=muon", "optim.momentum=1.5"], "optim.momentum"),
        ("train", ["positional.base=abc"], "positional.base"),
        ("train", ["positional=t5", "positional.num_buckets=1"], "positional.num_buckets"),
        ("train", ["positional=sinusoidal", "positional.scale=-1"], "positional.scale"),
        ("train", ["positional.scaling=dynamic_ntk"], "positional.scaling"),
        ("train", ["positional=alibi", "positional.scaling=yarn", "positional.scaling_factor=4"], "=alibi has none"),
        ("train", ["positional=sink", "+positional.inner.bsae=1"], "positional.inner.bsae is not an option of"),
        ("train", ["data=passkey", "data.min_tokens=100", "data.max_tokens=80"], "data.max_tokens=80 is below"),
        ("train", ["tokenizer.vocab_size=100"], "tokenizer.vocab_size=100 must be >= 257"),
        ("train", ["seed=-1"], "seed=-1 must be >= 0"),
        ("longrope", ["target_length=512", "search.parents=20"], "search.parents=20 must be <= search.population"),
        ("train", ["positional.scaling=yarn", "positional.scaling_factor=4"], "positional.scaling"),
        ("eval", ["eval.mode=passkey", "eval.depths=[0.5,2]"], "eval.depths"),
        ("eval", ["eval.mode=passkey", "eval.trials=0"], "eval.trials"),
        ("train", ["positional=learned", "positional.max_positions=16"], "positional.max_positions"),
        ("train", ["positional=sink", "positional.inner={name:learned}"], "positional.inner=learned"),
        ("train", ["positional=kerple", "positional.variant=foo"], "positional.variant"),
        ("train", ["positional=kerple", "positional.r2_max=3"], "positional.r2_max"),
        ("train", ["positional=kerple", "positional.r2_max=0"], "positional.r2_max"),
        ("train", ["positional=fire", "positional.hidden=0"], "positional.hidden"),
        ("train", ["positional=fire", "positional.threshold=-1"], "positional.threshold"),
        ("train", ["positional=fire", "positional.init_c=0"], "positional.init_c"),
        ("train", ["positional=shaw", "positional.max_distance=0"], "positional.max_distance"),
        ("train", ["positional.rotary_fraction=1.5"], "positional.rotary_fraction"),
        ("train", ["positional=prope", "positional.rotary_fraction=0"], "positional.rotary_fraction"),
        ("train", ["model.d_model=32", "positional.rotary_fraction=0.1"], "positional.rotary_fraction"),
        ("train", ["positional=xpos", "positional.scale_base=0"], "positional.scale_base"),
        ("train", ["model.window=0"], "model.window"),
        ("train", ["model.window=64", "model.window_pattern=SSXL"], "model.window_pattern"),
        ("eval", ["eval.stride=0"], "eval.stride"),
        ("eval", ["eval.lengths=[]"], "eval.lengths"),
        ("eval", ["eval.grids=0"], "eval.grids"),
        ("eval", ["eval.grid_sizes=[[1,5]]"], "eval.grid_sizes"),
        ("eval", ["eval.grid_sizes=[[16]]"], "eval.grid_sizes"),
        ("eval", ["cache.window=0"], "cache.window"),
        ("eval", ["eval.rerope_window=-4"], "eval.rerope_window"),
        ("eval", ["eval.rerope_leak=0.5"], "eval.rerope_leak"),
        ("eval", ["eval.rerope_leak=abc"], "eval.rerope_leak"),
        ("eval", ["eval.dca_chunk=1"], "eval.dca_chunk"),
        ("sample", ["dca_local=0"], "dca_local"),
        ("sample", [NO_CKPT, "full_layers=true"], "full_layers=true scales the full-attention"),  # with no scaling
        ("sample", [NO_CKPT, "full_layers=true", "rope_scaling=dca"], "rope_scaling=dca changes no frequency"),
        ("sample", ["rope_scaling=yarm"], "rope_scaling"),
        ("sample", ["rerope_window=0"], "rerope_window"),
        ("sample", ["num_samples=0"], "num_samples"),
        ("sample", ["max_new_tokens=-3"], "max_new_tokens"),
        ("sample", ["cache=sink", "cache.window=0"], "cache.window"),
        ("sample", ["cache=sink", "cache.sinks=-1"], "cache.sinks"),
    ],
)
def test_ranges_and_choices(name, overrides, key):
    from model.kv_cache import CacheError
    from positional import PositionLimitError

    with pytest.raises((UserError, PositionLimitError, CacheError)) as e:
        check(name, *overrides)
    assert key in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["train", "eval", "sample", "viz", "longrope"])
def test_the_defaults_pass(name, tiny_checkpoint):
    given = {"eval": ["checkpoint"], "sample": ["checkpoint"], "longrope": ["checkpoint", "target_length=64"]}
    check(name, *(o if "=" in o else f"{o}={tiny_checkpoint}" for o in given.get(name, [])))


@pytest.mark.parametrize("size", ["tiny", "small", "d12"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_and_size_passes(size, scheme):
    check("train", f"model={size}", f"positional={scheme}")


@pytest.mark.parametrize(
    "name, overrides, want",
    [
        ("eval", ["positional=alibi"], "positional=alibi: eval.py reads positional from the checkpoint"),
        ("sample", ["model=small"], "model=small: sample.py reads model from the checkpoint"),
        ("eval", ["+positional=alibi"], "positional is a setting of the training run"),
        ("eval", ["positional.base=500"], "positional is a setting of the training run"),
        ("train", ["positionl=alibi"], "(positional?)"),
        ("train", ["modle=small"], "(model?)"),
        ("train", ["data.path=notes.txt"], "data=text has data.path"),
        ("prepare", ["foo=1"], "foo is not an option of this config"),
        ("prepare", ["+foo=1"], "foo is not an option of this config"),  # added with +: refused, not ignored
    ],
)
def test_an_unknown_key_or_group_names_the_nearest_one_never_a_plus(name, overrides, want):
    """Hydra's hint for a key it does not know is `+key`, which adds a setting nothing reads (the run goes on without
    it): the message names the nearest key, the option that has it, or where a checkpoint's setting comes from."""
    with pytest.raises(UserError) as e:
        check(name, *overrides)
    assert want in str(e.value) and "+" not in str(e.value).replace("+foo", ""), str(e.value)


def test_resuming_another_scheme_names_the_key_and_the_setting_that_resumes():
    """What train.py's resume must match, worded: the first setting that differs, both values, the fix."""
    saved = {"model_config": {"n_layer": 2, "positional": {"name": "rope", "base": 10000.0}}, "seq_len": 32}
    run = {"model_config": {"n_layer": 2, "positional": {"name": "alibi"}}, "seq_len": 32}
    message = checkpoint.resume_mismatch(saved, run, "out/rope/ckpt.pt")
    assert message.startswith("positional.name=alibi does not match this run's checkpoint out/rope/ckpt.pt")
    assert message.endswith("trained with rope; resume with positional=rope, or start afresh in another out_dir")
    longer = checkpoint.resume_mismatch(saved, {**saved, "seq_len": 64}, "x")
    assert longer.startswith("train.seq_len=64 ") and "resume with train.seq_len=32" in longer
    assert checkpoint.resume_mismatch(saved, saved, "x") is None
    table = {"model_config": {"positional": {"name": "learned", "max_positions": 32}}, "seq_len": 32}
    wider = {"model_config": {"positional": {"name": "learned", "max_positions": 64}}, "seq_len": 64}
    assert checkpoint.resume_mismatch(table, wider, "x").startswith("train.seq_len=64 ")  # what the user set, first
    sharded = checkpoint.resume_mismatch(
        {**saved, "optimizer_format": "fsdp"}, {**saved, "optimizer_format": "plain"}, "x"
    )
    assert (
        sharded.startswith("train.parallel=ddp ") and "resume with train.parallel=fsdp," in sharded
    )  # values it takes


def test_a_missing_launcher_plugin_names_the_package():
    """hydra/launcher=slurm without the submitit plugin: Hydra cannot load its config; the line says what to install."""
    from hydra.errors import MissingConfigException

    e = MissingConfigException("Could not load 'hydra/launcher/submitit_slurm'.", "hydra/launcher/submitit_slurm")
    assert compose_message(e, "train").endswith("pip install hydra-submitit-launcher")
