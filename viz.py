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
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import positional
import utils.eval_schema  # noqa: F401  (registers this entry point's settings)
from evaluation.heldout import held_out_works
from utils import checkpoint, checks, files, schema
from utils.errors import UserError, cli, hydra_cli

# matplotlib and gallery are imported where used, so a config that does not compose fails before their imports

TEXT_TOKENS = 4096  # held-out tokens a trained model is pictured on (16 windows of 256 for the attention maps)


def scheme_spec(name: str, cfg) -> dict:
    """positional=<name>'s default options, resolved against this config's train.seq_len, as a model saves them."""
    node = OmegaConf.create({"train": schema.plain(cfg.train)})
    node.positional = OmegaConf.structured(positional.SCHEMES[name].Options(name=name))
    return positional.spec_of(node.positional)


def init_subject(spec: dict, cfg):
    """A scheme at init with the heads and widths of cfg.model (model=tiny by default)."""
    from gallery.draw import Subject

    m = cfg.model
    try:  # with positional.layers (irope): the scheme of its P layers; the N layers have no positions to draw
        pe, _ = positional.build_layers(spec, m.n_head, m.d_model // m.n_head, m.d_model)
    except ValueError as e:  # its message names the key, or gets the scheme's name in front
        raise UserError(str(e) if str(e).startswith("positional") else f"positional={spec['name']}: {e}") from None
    label = spec["name"] + (f"-{spec['layers']}" if "layers" in spec else "")  # rope-PPPN: the file names too
    return Subject(label, pe, cfg.train.seq_len, "at init")


def held_out_text(ckpt: dict, n_tokens: int, allow_prepare: bool):
    """The first n_tokens of the checkpoint's held-out works, end to end."""
    text = np.concatenate([doc for _, doc in held_out_works(ckpt, allow_prepare)])[:n_tokens]
    if len(text) < ckpt["seq_len"]:
        raise UserError(
            f"the held-out text of this checkpoint has {len(text)} tokens, fewer than its training length "
            f"{ckpt['seq_len']}; prepare a dataset with a larger validation split"
        )
    return torch.from_numpy(text.astype(np.int64))


def trained_subject(path, cfg):
    from gallery.draw import Subject

    model, ckpt = checkpoint.load_model(path, "cpu")
    for layer, head in cfg.viz.heads or []:
        if not (0 <= layer < model.cfg.n_layer and 0 <= head < model.cfg.n_head):
            raise UserError(
                f"viz.heads has [{layer},{head}], outside this model's {model.cfg.n_layer} layers x "
                f"{model.cfg.n_head} heads; pass pairs [layer, head] counted from 0"
            )
    tokens = held_out_text(ckpt, max(TEXT_TOKENS, 4 * ckpt["seq_len"]), cfg.viz.prepare)
    name = checkpoint.checkpoint_path(path).parent.name
    return Subject(name, model.pe, ckpt["seq_len"], f"trained: {name}, step {ckpt['step']}", model, tokens)


def subjects_and_folder(cfg):
    """(the subjects, made lazily so a sweep holds one model at once; the folder their pictures go to by default)."""
    if cfg.sweep_dir:  # it holds runs: checks.preflight
        return (trained_subject(p, cfg) for p in checks.checkpoints(cfg)), Path(cfg.sweep_dir) / "pictures"
    if cfg.checkpoint:
        return [trained_subject(cfg.checkpoint, cfg)], checkpoint.checkpoint_path(cfg.checkpoint).parent / "pictures"
    if cfg.viz.all:
        return (init_subject(scheme_spec(name, cfg), cfg) for name in positional.SCHEMES), Path("pictures")
    return [init_subject(positional.spec_of(cfg.positional), cfg)], Path("pictures")


def run(cfg: DictConfig, command: str = "python viz.py") -> Path:
    from gallery.draw import Options, draw, write_index

    checks.preflight(cfg)  # every setting, the paths, the model at init or the checkpoints' training lengths
    options = Options(cfg.viz.factor, cfg.viz.samples, cfg.viz.heads, cfg.viz.seed)
    subjects, folder = subjects_and_folder(cfg)
    out = Path(cfg.viz.out or folder)
    files.check_writable(out, "viz.out")  # made and written to before any picture is drawn
    entries = []
    for s in subjects:
        rows = draw(s, options, out)
        skipped = ", ".join(name for name, file, _ in rows if not file) or "none"
        print(f"{s.label} ({s.state}): {pictures(rows)}; skipped (see the index): {skipped}")
        entries.append((s.label, s.state, s.pe.name, rows))
    index = write_index(out, command, entries)
    print(f"written {pictures([row for *_, rows in entries for row in rows])} to {out}, listed in {index}")
    return index


def pictures(rows: list) -> str:
    """How many of draw()'s rows are drawn pictures, in words."""
    n = sum(1 for _, file, _ in rows if file)
    return f"{n} picture{'s' * (n != 1)}"


@hydra.main(version_base="1.3", config_path="configs", config_name="viz")
def main(cfg: DictConfig):
    command = " ".join(["python viz.py", *HydraConfig.get().overrides.task])
    cli(lambda: run(cfg, command))


if __name__ == "__main__":
    hydra_cli(main)
