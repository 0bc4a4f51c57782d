"""Generate text from a checkpoint through a KV cache, printed token by token.

python sample.py checkpoint=out/rope prompt="ROMEO." max_new_tokens=300 temperature=0.8 top_k=50 seed=0
python sample.py checkpoint=out/sink cache=sink max_new_tokens=-1      (streams until Ctrl-C, constant memory)
python sample.py checkpoint=out/alibi prompt=@scene.txt num_samples=3
python sample.py checkpoint=out/rope static=true      (a compiled fixed-shape decode step: CUDA graphs on a GPU)
python sample.py checkpoint=out/rope rope_scaling=rerope max_new_tokens=2000    (ReRoPE past the training length)
python sample.py checkpoint=out/rope 'hf_rope_scaling={rope_type: llama3, factor: 8}'   (a Hugging Face dict)
cache=dense keeps every token and stops at the scheme's limit; cache=sink keeps cache.sinks first tokens plus the
cache.window latest and never stops. rope_scaling runs at factor cache capacity / training length, and only kinds
with fixed frequencies (keys rotated once must match a full forward): dynamic_ntk is refused (docs/extension.md).
"""

import codecs
import sys
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

import utils.eval_schema  # noqa: F401  (registers this entry point's settings)
from data import tokenizer
from evaluation import longrope
from model.kv_cache import CacheError, build_cache, cache_sizes, generate, hold_matrices
from model.variant import Variant
from positional import hf_rope_scaling, rerope
from positional.rope_scaling import DCA_KINDS, SEARCHED, Scaling, refusal
from utils import checkpoint, checks, runtime
from utils.errors import UserError, cli, hydra_cli


def read_prompt(prompt: str) -> str:
    """prompt=text, or prompt=@file: the file's text."""
    if not prompt.startswith("@"):
        return prompt
    path = Path(prompt[1:]).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"prompt={prompt} is not UTF-8 text ({e.reason} at byte {e.start}); convert it") from None
    except OSError as e:
        raise UserError(f"prompt={prompt} cannot be read ({e.strerror}); give a readable text file") from None


def stream_one(model, enc, prompt, cache, cfg, generator, static=False, out=sys.stdout) -> tuple[int, str | None]:
    """Print one sample as it is generated; return (tokens generated, why it stopped early or None)."""
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    n, stopped = 0, None
    top_k = cfg.top_k if cfg.top_k else None
    decoder = None
    if static:  # the compiled fixed-shape step, loaded when asked for
        from model.static_decode import StaticDecoder

        decoder = StaticDecoder
    try:
        for tok in generate(model, prompt, cache, cfg.max_new_tokens, cfg.temperature, top_k, generator, decoder):
            out.write(text.decode(enc.decode_single_token_bytes(tok.item())))
            out.flush()
            n += 1
    except CacheError as e:
        stopped = str(e)
    except KeyboardInterrupt:
        stopped = "interrupted"
    out.write(text.decode(b"", final=True) + "\n")
    return n, stopped


def rope_variant(model, ckpt, cfg, capacity: int) -> Variant | None:
    """The Variant a `capacity`-token cache decodes under (at factor capacity / L), or None: the model as trained;
    under full_layers, on the full-attention layers alone."""
    pe, train_length, hf = model.pe, ckpt["seq_len"], cfg.get("hf_rope_scaling")
    given = hf_rope_scaling.given(hf)
    kind = hf_rope_scaling.kind(hf) if given else cfg.rope_scaling
    if kind == "none":
        return None
    trained = ckpt["model_config"]["positional"].get("scaling", "none")
    trained = None if trained == "none" else trained
    if given:
        key, named, off = "hf_rope_scaling.rope_type", hf_rope_scaling.rope_type(hf), "leave hf_rope_scaling out"
    else:
        key, named, off = "rope_scaling", kind, None
    if why := refusal(key, named, pe, trained, off):
        raise UserError(why)
    length = capacity - pe.n_prefix  # text positions the cache holds
    if given:
        try:
            scaling = hf_rope_scaling.scaling(hf, train_length, length, pe, "hf_rope_scaling")
        except ValueError as e:
            raise UserError(str(e)) from None
    elif kind in SEARCHED:
        run_dir = checkpoint.checkpoint_path(cfg.checkpoint).parent
        scaling = longrope.scaling(longrope.load(run_dir, length / train_length, train_length, "rope_scaling"))
    else:
        split = {}
        if kind in rerope.KINDS:
            leak = None if cfg.rerope_leak == "auto" else float(cfg.rerope_leak)
            split = {"window": cfg.rerope_window, "leak": leak}
        if kind in DCA_KINDS:
            split = {"chunk": cfg.dca_chunk, "window": cfg.dca_local}
        scaling = Scaling(kind, length / train_length, train_length, **split)
    return Variant(scaling, full_layers=cfg.full_layers)


def sample(cfg: DictConfig):
    checks.preflight(cfg)  # every setting, the checkpoint, and the cache's sizes
    text = read_prompt(cfg.prompt)
    rt = runtime.setup(cfg.device, cfg.dtype, cfg.seed)
    model, ckpt = checkpoint.load_model(cfg.checkpoint, rt.device)
    hold_matrices(model, rt.dtype)  # decoding reads each weight once a token: keep it in autocast's dtype
    if model.pe.axes > 1 and ckpt["config"]["data"].get("source") == "grids":  # text positions would be wrong
        raise UserError(
            f"sample.py gives every token one position, and this positional={model.pe.name} model was trained on "
            f"data=grids' (row, column) ids; score it with python eval.py checkpoint={cfg.checkpoint} eval.mode=grids"
        )
    enc = tokenizer.load(ckpt["tokenizer"])
    ids = [tokenizer.bos_id(ckpt["tokenizer"], enc)] + tokenizer.encode(ckpt["tokenizer"], enc, text, "prompt")
    prompt = torch.tensor([ids], device=rt.device)
    generator = torch.Generator(device=rt.device).manual_seed(cfg.seed)
    sizes = cache_sizes(model, cfg.cache.kind, ckpt["seq_len"], **{k: v for k, v in cfg.cache.items() if k != "kind"})
    variant = rope_variant(model, ckpt, cfg, sizes["capacity"])
    total, t0, cache = 0, time.time(), None
    for k in range(cfg.num_samples):
        if cfg.num_samples > 1:
            print(f"--- sample {k + 1}/{cfg.num_samples} ---")
        cache = build_cache(model, cfg.cache.kind, 1, sizes, variant=variant)
        if cfg.cache.kind == "dense" and len(ids) + model.pe.n_prefix > cache.capacity:
            raise UserError(
                f"the prompt has {len(ids)} tokens, more than the dense cache holds ({cache.capacity}); "
                f"use cache=sink or a shorter prompt"
            )
        print(text, end="", flush=True)
        with rt.autocast():
            n, stopped = stream_one(model, enc, prompt, cache, cfg, generator, cfg.static)
        total += n
        if stopped:
            print(f"[stopped after {n} tokens: {stopped}]", file=sys.stderr, flush=True)
            if stopped == "interrupted":
                break
    dt, peak = time.time() - t0, runtime.peak_memory_mb(rt.device)
    print(
        f"{total} tokens in {dt:.1f} s: {total / dt:.1f} tokens/s (prefill{' and compiling the step' * cfg.static} "
        f"included), cache={cfg.cache.kind} "
        f"holding {cache.capacity} tokens ({cache.nbytes() / 2**20:.1f} MiB), peak memory {peak:.0f} MiB "
        f"{'GPU' if rt.device.type == 'cuda' else 'RSS'}"
    )


@hydra.main(version_base="1.3", config_path="configs", config_name="sample")
def main(cfg: DictConfig):
    cli(lambda: sample(cfg))


if __name__ == "__main__":
    hydra_cli(main)
