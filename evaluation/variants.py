"""Which evaluation variants a checkpoint is scored under, each a value (model/variant.py) for every cell.

python eval.py checkpoint=out/rope eval.rope_scaling=all eval.rerope=true eval.dca=true eval.log_scaling=true
python eval.py checkpoint=out/rope-passkey-256 eval.mode=passkey eval.rope_scaling=rerope
The length table (evaluation/length.py) and passkey mode (evaluation/passkey.py) score the list plan_variants gives,
and at(variant, length) is the Variant a cell passes into the forward.
"""

from dataclasses import replace

import torch

from evaluation import longrope, report
from evaluation.pieces import read_spans
from evaluation.report import FULL
from model.variant import AS_TRAINED, Variant
from positional import hf_rope_scaling, rerope
from positional.rope_scaling import DCA_KINDS, KINDS, SEARCHED, SPLITS, Scaling, refusal
from utils import checkpoint
from utils.errors import UserError
from utils.progress import say

LOG = "log"  # the variant row of eval.log_scaling


def resolve_variants(requested: str, pe, trained: str | None = None) -> list[str]:
    """The eval-time RoPE extensions to score. A model fine-tuned with positional.scaling has its frequencies built in:
    another scaling would replace them, not add to them, so it is refused, and `all` scores the model as it is."""
    if requested == "all":  # the closed-form kinds; with_searched adds the SEARCHED ones
        if trained:
            say(f"note: trained with positional.scaling={trained}: scored as it is, with no eval-time scaling")
            return ["none"]
        return list(KINDS) if pe.rotary else ["none"]
    if why := refusal("eval.rope_scaling", requested, pe, trained):
        raise UserError(why)
    return [requested]


def with_log_scaling(variants: list[str], requested: bool, ckpt: dict) -> list[str]:
    """Add `log` (model/log_scaling.py) when asked for, before any RoPE variant, whose frequencies would otherwise
    linger into it. A model trained with model.ssmax already scales its logits by ln n: no second log factor."""
    if not requested:
        return variants
    if ckpt["model_config"].get("ssmax"):
        say("note: trained with model.ssmax=true (logits x s ln n): eval.log_scaling adds no row")
        return variants
    at = 1 if variants[0] == "none" else 0
    return [*variants[:at], LOG, *variants[at:]]


def with_searched(variants: list[str], requested: str, path, factors: list[float]) -> list[str]:
    """`all` also scores the SEARCHED kinds where searched for every factor past 1; else a note leaves them out."""
    if requested != "all" or "linear" not in variants:  # not rotary, or a fine-tune's scaling is built in
        return variants
    run_dir = checkpoint.checkpoint_path(path).parent
    missing = [f for f in factors if f > 1 and not (run_dir / longrope.file_name(f)).exists()]
    if missing:
        say(f"note: eval.rope_scaling=all leaves out {', '.join(SEARCHED)}: not searched for x{missing[0]:g} here")
        return variants
    return variants + list(SEARCHED)


def with_splits(variants: list[str], requested: bool, kinds: tuple, key: str, pe, trained: str | None) -> list[str]:
    """Add a split's kinds when asked for (eval.rerope=true: rerope and leaky_rerope; eval.dca=true: dca; `all` leaves
    them out for their cost); a model they cannot apply to gets a note and no rows."""
    if not requested:
        return variants
    if trained or not pe.rotary:
        why = f"trained with positional.scaling={trained}" if trained else f"{pe.name} has no rotation"
        say(f"note: {key}=true adds no rows: {why}")
        return variants
    return variants + [k for k in kinds if k not in variants]


def with_full_layers(variants: list[str], requested: bool, cfg) -> list[str]:
    """Add <kind>_full after the rows whose scaling changes frequencies (eval.full_layers=true); a model with no
    windowed layer taking a scaling, or a table with no such row, gets a note and no rows."""
    if not requested:
        return variants
    scaled = [v for v in variants if v not in ("none", LOG, *SPLITS)]
    why = "no eval.rope_scaling row changes frequencies" if not scaled else None
    why = why or (None if cfg.windows() else "no sliding-window or chunked layer of this model takes a scaling")
    if why:
        say(f"note: eval.full_layers=true adds no rows: {why}")
        return variants
    return variants + [v + FULL for v in scaled]


def with_hf(variants: list[str], hf, pe, trained: str | None) -> list[str]:
    """Add the row of a Hugging Face rope_scaling dict (eval.hf_rope_scaling), last; refused as eval.rope_scaling=<kind>
    is for a model it cannot apply to."""
    if not hf_rope_scaling.given(hf):
        return variants
    key, off = "eval.hf_rope_scaling.rope_type", "leave eval.hf_rope_scaling out"
    if hf_rope_scaling.kind(hf) != "none" and (why := refusal(key, hf_rope_scaling.rope_type(hf), pe, trained, off)):
        raise UserError(why)
    return variants + [hf_rope_scaling.row_name(hf)]


def hf_scalings(hf, pe, lengths: list[int], train_length: int) -> dict:
    """{length: the Scaling transformers computes for eval.hf_rope_scaling}, all made before any scoring, so a dict that
    does not fit this model stops the run at once."""
    try:
        return {n: hf_rope_scaling.scaling(hf, train_length, n, pe, "eval.hf_rope_scaling") for n in lengths}
    except ValueError as e:
        raise UserError(str(e)) from None


def searched_scalings(path, pe, variants, lengths, factor_of, train_length: int) -> dict:
    """{(variant, length): its search record} for the SEARCHED variants past the training length, all read before any
    scoring: a missing or mismatched file stops the run at once."""
    run_dir, out = checkpoint.checkpoint_path(path).parent, {}
    for variant in (v for v in variants if v in SEARCHED):
        for length in (n for n in lengths if factor_of(n) > 1):
            record = longrope.load(run_dir, factor_of(length), train_length)
            try:
                pe.rotation(torch.zeros(1, dtype=torch.long), longrope.scaling(record))  # do its factors fit this model
            except ValueError as e:
                raise UserError(f"{run_dir / longrope.file_name(factor_of(length))}: {e}") from None
            out[variant, length] = record
    return out


def note_search_overlap(searched: dict, pieces, max_len: int):
    """Say so when this table reads text a search scored its candidates on: those cells are not independent of it."""
    spans = read_spans(pieces, max_len)
    for (variant, length), record in searched.items():
        if n := longrope.overlap(record.get("windows", []), spans):
            say(
                f"note: {variant} at {length}: {n:,} tokens of its search windows are read here too; search again "
                f"with this eval.lengths and eval.tokens for a table the search never saw"
            )


def plan_variants(path, ev, model, ckpt: dict, lengths: list[int]):
    """The variants to score, the SEARCHED ones' records, and at(variant, length) -> (the Variant a cell passes into the
    forward, what its row records of it). A fine-tuned model's built-in scaling is what `none` scores."""
    pe, train_length = model.pe, ckpt["seq_len"]
    trained = report.trained_scaling(ckpt["model_config"])
    variants = with_log_scaling(resolve_variants(ev.rope_scaling, pe, trained), ev.log_scaling, ckpt)

    def factor_of(length: int) -> float:
        return length / train_length if ev.rope_factor == "auto" else float(ev.rope_factor)

    variants = with_searched(variants, ev.rope_scaling, path, [factor_of(n) for n in lengths])
    variants = with_splits(variants, ev.rerope, rerope.KINDS, "eval.rerope", pe, trained)
    variants = with_splits(variants, ev.dca, DCA_KINDS, "eval.dca", pe, trained)
    variants = with_hf(variants, ev.hf_rope_scaling, pe, trained)
    variants = with_full_layers(variants, ev.full_layers, model.cfg)
    searched = searched_scalings(path, pe, variants, lengths, factor_of, train_length)
    hf_row = hf_rope_scaling.row_name(ev.hf_rope_scaling) if hf_rope_scaling.given(ev.hf_rope_scaling) else None
    hf = hf_scalings(ev.hf_rope_scaling, pe, lengths, train_length) if hf_row else {}
    leak = None if ev.rerope_leak == "auto" else ev.rerope_leak

    def at(variant: str, length: int) -> tuple[Variant, dict]:
        if variant.endswith(FULL):
            value, row = at(variant.removesuffix(FULL), length)
            return replace(value, full_layers=True), row
        if variant == "none":
            return AS_TRAINED, {}
        if variant == LOG:
            return Variant(log_length=train_length), {}
        if variant == hf_row:
            return Variant(hf[length]), {}
        if (variant, length) in searched:
            return Variant(longrope.scaling(searched[variant, length])), {}
        factor = factor_of(length)
        if variant in rerope.KINDS:  # this cell's w and k (positional/rerope.py); rerope's k = inf is recorded as null
            scaling = Scaling(variant, factor, train_length, window=ev.rerope_window, leak=leak)
            row = {"window": scaling.window, "leak": None if variant == "rerope" else round(scaling.leak, 4)}
            return Variant(scaling), row
        if variant in DCA_KINDS:  # its S and w (positional/dca.py)
            scaling = Scaling(variant, factor, train_length, chunk=ev.dca_chunk, window=ev.dca_local)
            return Variant(scaling), {"chunk": scaling.chunk, "window": scaling.window}
        return Variant(Scaling(variant, factor, train_length)), {}

    return variants, searched, at
