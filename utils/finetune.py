"""Fine-tuning from a checkpoint's weights: a fresh optimizer and step count, its own out_dir, any train.seq_len.

python train.py init_from=out/rope train.seq_len=1024 positional.scaling=yarn positional.scaling_factor=4 \
    train.max_steps=200                                  (-> out/rope-shakespeare-1024-yarn4)
python train.py init_from=out/learned train.seq_len=1024 (the 256-row table becomes 1024 rows by interpolation)
python train.py init_from=out/rope data=passkey train.max_steps=1200 model.qk_norm=learned  (the passkey task)
python train.py init_from=out/rope positional=nope train.max_steps=60      (DroPE: drop RoPE, recalibrate)
The model must have the init checkpoint's shape and tokenizer; each scheme fits its own length-dependent weights
(fit_state). A scaling's original_length is init_from's train.seq_len, or its own original_length when it was itself
a scaled fine-tune, so a chain of fine-tunes keeps scaling the same frequencies.
DroPE (Gelberg et al. 2025) is the one change of scheme allowed: to positional=nope, from any scheme. The scheme's own
weights are dropped and the checkpoint records init_from.dropped, which reports show: nope[dropped rope].
"""

import torch

from positional import SCALING_KEYS, Positional
from utils import checkpoint
from utils.errors import UserError

LENGTH_KEYS = ("max_positions",)  # positional options that follow train.seq_len (a learned table's rows)
# (init's value, the run's, the weights it adds): new weights start as the identity, so step 0 is the init model
WIDENING = {"model.qk_norm": ("rms", "learned", ("q_gain", "k_gain"))}


def read_init(cfg) -> dict:
    """init_from's checkpoint (memory-mapped); fills in a scaling's null positional.original_length."""
    ckpt, pos = checkpoint.load(cfg.init_from, mmap=True), cfg.positional
    if pos.get("scaling", "none") != "none" and pos.get("original_length") is None:
        pos.original_length = int(ckpt["model_config"]["positional"].get("original_length") or ckpt["seq_len"])
    return ckpt


def dropping(init: dict, run: dict) -> str | None:
    """The scheme a DroPE fine-tune drops, else None."""
    have, want = init["model_config"]["positional"]["name"], run["model_config"]["positional"]["name"]
    return have if want == "nope" and have != "nope" else None


def scheme_keys(model_config: dict) -> set[str]:
    """The state-dict keys a model has beyond a NoPE model of the same shape: its scheme's own weights."""
    with torch.device("meta"):  # shapes only: nothing is allocated
        model = checkpoint.build_model(model_config)
        nope = checkpoint.build_model({**model_config, "positional": {"name": "nope"}})
    return set(model.state_dict()) - set(nope.state_dict())


def flat(model_config: dict, positional: bool = True) -> dict:
    """model_config as command-line keys (model.n_layer, positional.base, ...), less what a fine-tune may change:
    the scaling and a table's length (and the scheme's options, positional=False)."""
    out = {f"model.{k}": v for k, v in model_config.items() if k != "positional"}
    if not positional:
        return out

    def walk(spec, prefix):
        for k, v in spec.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}.{k}")
            elif k not in SCALING_KEYS + LENGTH_KEYS:
                out[f"{prefix}.{k}"] = v

    walk(model_config["positional"], "positional")
    return out


def saved_config(init: dict) -> dict:
    """init's model config, with checkpoint.OLDER's defaults for the options it predates."""
    return {**checkpoint.OLDER["model_config"], **init["model_config"]}


def check_compatible(init: dict, run: dict, path) -> tuple[str, ...]:
    """Refuse an init checkpoint whose weights this run's model cannot take; the name endings of the weights a
    WIDENING adds."""
    if init["tokenizer"] != run["tokenizer"]:
        raise UserError(
            f"init_from={path} was trained with another tokenizer than this run's data and tokenizer; fine-tune "
            f"with the data= and tokenizer= it was trained with (data=passkey uses its corpus's tokenizer)"
        )
    keep = dropping(init, run) is None  # DroPE: the scheme may change (to nope); the model's shape may not
    have, want = flat(saved_config(init), keep), flat(run["model_config"], keep)
    added = ()
    for key, (was, now, weights) in WIDENING.items():
        if (have.get(key), want.get(key)) == (was, now):
            have[key], added = now, added + weights
    keys = sorted(set(have) | set(want), key=lambda k: (k != "positional.name", k))  # the scheme's name first
    diff = [f"{k}={want.get(k, 'unset')} (it has {have.get(k, 'unset')})" for k in keys if have.get(k) != want.get(k)]
    if diff:
        raise UserError(
            f"init_from={path} has another model shape than this run: {', '.join(diff)}; pass the options it was "
            f"trained with"
        )
    return added


def load_weights(model, init: dict, run: dict, path) -> dict:
    """Copy init's weights into model; returns what the new checkpoint records of where they came from."""
    added = check_compatible(init, run, path)
    state = dict(init["model"])
    if dropped := dropping(init, run):
        for key in scheme_keys(saved_config(init)):
            state.pop(key, None)
    for name, module in model.named_modules():
        if isinstance(module, Positional):
            module.fit_state(state, f"{name}.")
    state.update({k: v for k, v in model.state_dict().items() if k.endswith(added)})  # WIDENING's, as built
    checkpoint.check_weights(model, init, state)  # check_compatible passed: a difference left is init's own
    model.load_state_dict(state)
    info = {"path": str(checkpoint.checkpoint_path(path)), "step": init["step"], "seq_len": init["seq_len"]}
    stays_nope = run["model_config"]["positional"]["name"] == "nope"
    dropped = dropped or (stays_nope and (init.get("init_from") or {}).get("dropped"))  # a DroPE model's fine-tunes
    return {**info, "dropped": dropped} if dropped else info
