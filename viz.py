"""Pictures of positional schemes, at init or trained: one PNG per idea, and an index.md that lists them.

python viz.py positional=alibi                        ALiBi at init -> pictures/alibi_bias.png, pictures/index.md
python viz.py positional=rope viz.factor=8            RoPE's decay and its scaling variants out to 8 x L
python viz.py checkpoint=out/rope                     a trained run -> out/rope/pictures/: its trained values, its
                                                      queries and keys by distance, attention maps on held-out text
python viz.py checkpoint=out/rope viz.heads=[[0,1],[3,2]]   attention maps of chosen (layer, head) pairs
python viz.py viz.all=true                            every scheme at init in one gallery: pictures/index.md
python viz.py sweep_dir=multirun/schemes              every run of a training sweep, trained, in one gallery
A picture a scheme does not fit is skipped and the index says why. All on the CPU.
"""

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import utils.eval_schema  # noqa: F401  (registers this entry point's settings)
from utils import checks, files, schema
from utils.errors import UserError, cli, hydra_cli

# matplotlib and gallery are imported where used, so a config that does not compose fails before their imports

ROOT = Path(__file__).resolve().parent
TEXT_TOKENS = 4096  # held-out tokens a trained model is pictured on (16 windows of 256 for the attention maps)


def scheme_spec(name: str, cfg) -> dict:
    """positional=<name>'s default options, resolved against this config's train.seq_len, as a model saves them."""
    import positional

    node = OmegaConf.create({"train": schema.plain(cfg.train)})
    node.positional = OmegaConf.structured(positional.SCHEMES[name].Options(name=name))
    return positional.spec_of(node.positional)


def init_subject(spec: dict, cfg):
    """A scheme at init with the heads and widths of cfg.model (model=tiny by default)."""
    import positional
    from gallery.draw import Subject

    m = cfg.model
    try:  # with positional.layers (irope): the scheme of its P layers; the N layers have no positions to draw
        pe, _ = positional.build_layers(spec, m.n_head, m.d_model // m.n_head, m.d_model)
    except ValueError as e:
        msg = str(e)
        raise UserError(msg if msg.startswith("positional") else f"positional={spec['name']}: {msg}") from None
    label = spec["name"] + (f"-{spec['layers']}" if "layers" in spec else "")  # rope-PPPN: the file names too
    return Subject(label, pe, cfg.train.seq_len, "at init")


def held_out_text(ckpt: dict, n_tokens: int, allow_prepare: bool):
    """The first n_tokens of the checkpoint's held-out works, end to end."""
    import numpy as np
    import torch

    from evaluation.heldout import held_out_works

    text = np.concatenate([doc for _, doc in held_out_works(ckpt, allow_prepare)])[:n_tokens]
    if len(text) < ckpt["seq_len"]:
        raise UserError(
            f"the held-out text of this checkpoint has {len(text)} tokens, fewer than its training length "
            f"{ckpt['seq_len']}; prepare a dataset with a larger validation split"
        )
    return torch.from_numpy(text.astype(np.int64))


def check_heads(heads, model):
    for layer, head in heads or []:
        if not (0 <= layer < model.cfg.n_layer and 0 <= head < model.cfg.n_head):
            raise UserError(
                f"viz.heads has [{layer},{head}], outside this model's {model.cfg.n_layer} layers x "
                f"{model.cfg.n_head} heads; pass pairs [layer, head] counted from 0"
            )


def trained_subject(path, cfg):
    from gallery.draw import Subject
    from utils import checkpoint

    model, ckpt = checkpoint.load_model(path, "cpu")
    check_heads(cfg.viz.heads, model)
    length = ckpt["seq_len"]
    tokens = held_out_text(ckpt, max(TEXT_TOKENS, 4 * length), cfg.viz.prepare)
    run = checkpoint.checkpoint_path(path).parent
    return Subject(run.name, model.pe, length, f"trained: {run.name}, step {ckpt['step']}", model, tokens)


def subjects_and_folder(cfg):
    """(the subjects, made lazily so a sweep holds one model at once; the folder their pictures go to)."""
    import positional
    from utils import checkpoint

    out = cfg.viz.out
    if cfg.sweep_dir:  # it holds runs: checks.preflight
        found = checks.checkpoints(cfg)
        return (trained_subject(p, cfg) for p in found), Path(out or Path(cfg.sweep_dir) / "pictures")
    if cfg.checkpoint:
        run_dir = checkpoint.checkpoint_path(cfg.checkpoint).parent
        return [trained_subject(cfg.checkpoint, cfg)], Path(out or run_dir / "pictures")
    if cfg.viz.all:
        return (init_subject(scheme_spec(name, cfg), cfg) for name in positional.SCHEMES), Path(out or "pictures")
    return [init_subject(positional.spec_of(cfg.positional), cfg)], Path(out or "pictures")


def run(cfg: DictConfig, command: str = "python viz.py") -> Path:
    from gallery.draw import Options, draw, write_index

    checks.preflight(cfg)  # every setting, the paths, the model at init or the checkpoints' training lengths
    heads = None if cfg.viz.heads is None else [list(pair) for pair in cfg.viz.heads]
    options = Options(cfg.viz.factor, cfg.viz.samples, heads, cfg.viz.seed)
    subjects, out = subjects_and_folder(cfg)
    files.check_writable(out, "viz.out")  # made and written to before any picture is drawn
    entries = []
    for s in subjects:
        rows = draw(s, options, out)
        drawn = [file for _, file, _ in rows if file]
        skipped = [name for name, file, _ in rows if not file]
        print(f"{s.label} ({s.state}): {pictures(len(drawn))}; skipped (see the index): {', '.join(skipped) or 'none'}")
        entries.append((s.label, s.state, s.pe.name, rows))
    index = write_index(out, command, entries)
    print(f"written {pictures(sum(1 for *_, rows in entries for _, f, _ in rows if f))} to {out}, listed in {index}")
    return index


def pictures(n: int) -> str:
    return f"{n} picture{'s' * (n != 1)}"


@hydra.main(version_base="1.3", config_path="configs", config_name="viz")
def main(cfg: DictConfig):
    command = " ".join(["python viz.py", *HydraConfig.get().overrides.task])
    cli(lambda: run(cfg, command))


if __name__ == "__main__":
    hydra_cli(main)
