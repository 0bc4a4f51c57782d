"""Train a small GPT whose positional scheme is one word of config.

python train.py                                       tiny model, RoPE, the embedded Shakespeare corpus
python train.py positional=alibi model=small train.max_steps=3000
python train.py -m positional=learned,sinusoidal,alibi,rope,nope,sink      (a sweep; same as sweep=schemes)
torchrun --nproc_per_node=8 train.py model=d12 train.total_batch_size=524288
python train.py init_from=out/rope train.seq_len=1024 positional.scaling=yarn positional.scaling_factor=4
    (a fine-tune from out/rope's weights, fresh optimizer and step: utils/finetune.py)
Leaves out_dir/ckpt.pt (atomic, resumable with train.resume=true) and out_dir/metrics.jsonl.
"""

import math
import signal
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from data import grids, tokenizer
from data.loader import RowSampler, TokenSplit
from data.prepare import load_meta, prepare
from evaluation.sink_mass import nothing_cost, rows_first_token_attention
from model.generate import generate
from model.kv_cache import DenseCache
from utils import checkpoint, finetune, optim, parallel, runtime, schema
from utils.compiling import should_compile
from utils.errors import UserError, cli, hydra_cli
from utils.logger import Logger, start_wandb

MATCH_KEYS = ("model_config", "tokenizer", "seq_len", "bos_aligned", "optimizer_format")  # a resume shares these
# options added after checkpoints were written: an older checkpoint was trained with their defaults
OLDER = {"bos_aligned": False, "model_config": {"qk_norm": "rms", "sink_logit": False, "ssmax": False}}


class StopFlag:
    """SIGTERM or a first Ctrl-C asks the loop to save and stop; a second Ctrl-C interrupts at once."""

    def __init__(self):
        self.requested = False
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\n{signal.Signals(signum).name}: saving a checkpoint and stopping", flush=True)

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)


def grad_accum_steps(tr, world: int) -> int:
    if tr.total_batch_size is None:
        return tr.grad_accum
    per_step = tr.batch_size * tr.seq_len * world
    if tr.total_batch_size % per_step:
        raise UserError(
            f"train.total_batch_size={tr.total_batch_size} is not a multiple of batch_size x seq_len x "
            f"processes = {per_step}; change one of them"
        )
    return tr.total_batch_size // per_step


def check_out_dir(out_dir: Path, tr):
    ckpt = out_dir / checkpoint.NAME
    if tr.resume and not ckpt.exists():
        raise UserError(
            f"train.resume=true but {out_dir} holds no {checkpoint.NAME}; drop train.resume to start afresh"
        )
    if not tr.resume and ckpt.exists() and not tr.overwrite:
        raise UserError(
            f"{out_dir} already holds a checkpoint: add train.resume=true to continue it, "
            f"or train.overwrite=true to start over"
        )


def check_resume(ckpt: dict, run: dict, path):
    def saved(k):
        if isinstance(OLDER.get(k), dict) and isinstance(ckpt.get(k), dict):
            return {**OLDER[k], **ckpt[k]}
        return ckpt.get(k, OLDER.get(k))

    diff = [k for k in MATCH_KEYS if saved(k) != run[k]]
    if diff:
        raise UserError(
            f"checkpoint {path} does not match this run ({', '.join(diff)} differ); resume with the "
            f"same options, or use a new out_dir"
        )


@torch.no_grad()
def evaluate(model, sampler: RowSampler, n_batches: int, batch_size: int, rt) -> float:
    """Mean loss over n_batches fixed validation batches shared out over the ranks. Every rank runs the same
    number of forwards (FSDP all-gathers in each one); a rank short of batches repeats one with no weight."""
    model.eval()
    total = torch.zeros((), device=rt.device)
    for i in range(-(-n_batches // rt.world)):
        j = i * rt.world + rt.rank
        first = (j % n_batches) * batch_size
        x, y = sampler.batch(first, batch_size, rt.device)
        with rt.autocast():
            loss = model(x, y, pos=sampler.positions(first, batch_size, rt.device)).float()
        total += loss if j < n_batches else 0.0
    model.train()
    return (runtime.all_reduce_mean(total) * rt.world / n_batches).item()


@torch.no_grad()
def sink_metrics(model, sampler: RowSampler, rt, n_rows: int = 16) -> dict:
    """train.sink_metric: the attention the queries of n_rows held-out rows put on their first token (the learned
    sink token with positional=sink), per layer's largest head, and the share of sink heads (evaluation/sink_mass.py);
    with model.sink_logit=true also the nothing slot's share, per layer's largest head, and what taking it away costs
    (sink_mass.nothing_cost). The raw model, eager and fp32: hooks read each layer's input. Every rank runs it (FSDP
    gathers in the forward)."""
    x, y = sampler.batch(0, n_rows, rt.device)
    model.eval()
    sink = rows_first_token_attention(model, x)
    cost = nothing_cost(model, x, y) if model.cfg.sink_logit else None
    model.train()
    metrics = {
        "sink_share": sink["sink_share_all"],
        "first_token_max": sink["max_head"],
        "first_token_uniform": sink["uniform"],
    }
    if cost is not None:
        metrics.update(nothing_max=sink["nothing_max_head"], nothing_share=sink["nothing_share_all"])
        metrics["nothing_cost"] = round(cost, 5)  # nats per token the model loses without its nothing slot
    return metrics


def print_sample(model, tok_spec, n_tokens: int, rt):
    enc = tokenizer.load(tok_spec)
    bos = tokenizer.bos_id(tok_spec, enc)
    limit = model.pe.max_positions or n_tokens + 1
    n = min(n_tokens, limit - 1)
    cache = DenseCache(model, 1, n + model.pe.n_prefix, dtype=torch.float32)  # BOS + n - 1 fed back, sinks first
    g = torch.Generator(device=rt.device).manual_seed(0)
    prompt = torch.tensor([[bos]], device=rt.device)
    ids = [t.item() for t in generate(model, prompt, cache, n, temperature=0.8, top_k=50, generator=g)]
    print("--- sample ---\n" + enc.decode(ids) + "\n--------------", flush=True)


def train(cfg: DictConfig, out_dir, group: str | None = None) -> dict:
    """Train as cfg says into out_dir; return a summary (step, losses, wall time)."""
    cfg.out_dir = str(out_dir)
    init = finetune.read_init(cfg)  # init_from's checkpoint, mapped; it gives positional.original_length its value
    schema.check(cfg)  # every range and rule, before any data is read
    schema.check_model(cfg)
    if cfg.data.source == "grids":  # its options, and train.seq_len against its grid size
        grids.check_run(schema.plain(cfg.data), cfg.train.seq_len)
    rt = runtime.setup(cfg.device, cfg.dtype, cfg.seed)
    stop = StopFlag()
    try:
        return _train(cfg, Path(out_dir), rt, group, stop, init)
    finally:
        stop.restore()
        runtime.teardown()


def prepare_data(resolved: dict, rt, say) -> tuple[Path, dict, int]:
    """Rank 0 prepares the dataset (once per dataset and tokenizer); the others wait, then find it ready."""
    if rt.master:
        prepare(resolved["data"], resolved["tokenizer"], log=say)
    runtime.barrier()
    data_dir = prepare(resolved["data"], resolved["tokenizer"], log=say)
    return data_dir, tokenizer.read_spec(data_dir), load_meta(data_dir)["vocab_size"]


def grad_scaler(rt, state: dict | None = None) -> torch.amp.GradScaler:
    """Under fp16 autocast the loss is scaled up before backward, or small gradients flush to zero in fp16;
    steps whose gradients overflow are skipped and the scale lowered. Disabled (a pass-through) otherwise."""
    scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.dtype == torch.float16)
    if state:
        scaler.load_state_dict(state)
    return scaler


def train_step(runner, model, opts, batches: RowSampler, rows: int, accum: int, tr, rt, scaler) -> tuple[float, float]:
    """One optimizer step over accum micro-batches per rank; returns the mean loss over all ranks and the
    gradient norm before clipping."""
    loss_sum = torch.zeros((), device=rt.device)
    for micro in range(accum):
        first = rows + (micro * rt.world + rt.rank) * tr.batch_size
        x, y = batches.batch(first, tr.batch_size, rt.device)
        pos = batches.positions(first, tr.batch_size, rt.device)  # (axes, T) ids for a grid; None for text
        with parallel.sync_grads(runner, tr.parallel, micro == accum - 1), rt.autocast():
            loss = runner(x, y, pos=pos) / accum
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    for opt in opts:
        scaler.unscale_(opt)  # clip the true gradients
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tr.grad_clip or math.inf)  # measured, then clipped
    if hasattr(norm, "full_tensor"):  # FSDP: a sharded (DTensor) norm
        norm = norm.full_tensor()
    for opt in opts:
        scaler.step(opt)
        opt.zero_grad(set_to_none=True)
    scaler.update()
    loss, norm = torch.stack((runtime.all_reduce_mean(loss_sum), norm.float())).tolist()
    return loss, norm


def diverged(what: str, step: int, out_dir) -> UserError:
    return UserError(
        f"{what} at step {step}; the last good checkpoint is kept in {out_dir}. "
        f"Lower optim.lr or raise train.warmup_steps"
    )


def _train(cfg, out_dir: Path, rt, group, stop, init=None) -> dict:
    tr = cfg.train
    say = print if rt.master else (lambda *a, **k: None)
    check_out_dir(out_dir, tr)
    resolved = schema.plain(cfg, throw_on_missing=True)
    data_dir, tok_spec, vocab_size = prepare_data(resolved, rt, say)
    model_config = schema.model_config(resolved, vocab_size)
    run = {
        "model_config": model_config,
        "tokenizer": tok_spec,
        "seq_len": tr.seq_len,
        "bos_aligned": bool(resolved["data"].get("bos_aligned", False)),  # another row order: another run
        "optimizer_format": parallel.optimizer_format(rt, tr.parallel),
    }  # what a resumed run must match

    model = checkpoint.build_model(model_config)
    model.pe.check_length(tr.seq_len)
    init_info = None
    if init is not None and not tr.resume:  # weights only, before any wrapping: every rank loads the same
        init_info = finetune.load_weights(model, init, run, cfg.init_from, OLDER)
        say(
            f"starting from the weights of {init_info['path']} (step {init['step']}, seq_len {init['seq_len']}); "
            f"fresh optimizer, step 0"
        )
    model.to(rt.device)
    runner = parallel.wrap(model, rt, tr.parallel, resolved["optim"]["name"])
    opts = optim.build(model, resolved["optim"], fused=rt.device.type == "cuda" and run["optimizer_format"] == "plain")
    step, rows, wandb_id = 0, 0, None
    if tr.resume:
        ckpt = checkpoint.load(out_dir)
        check_resume(ckpt, run, out_dir / checkpoint.NAME)
        parallel.load_state(model, opts, ckpt["model"], ckpt["optimizer"], tr.parallel)
        step, rows, wandb_id = ckpt["step"], ckpt["rows"], ckpt.get("wandb_id")
        init_info = ckpt.get("init_from")
        say(f"resuming {out_dir} at step {step}")
    if should_compile(cfg.compile, rt.device, say):
        runner = torch.compile(runner)

    accum = grad_accum_steps(tr, rt.world)
    bos_aligned = resolved["data"].get("bos_aligned", False)  # absent from configs older than the option
    axes = model.pe.axes  # the position axes the scheme reads from a dataset that has them (data=grids)
    train_rows = RowSampler(TokenSplit(data_dir, "train"), tr.seq_len, cfg.seed, bos_aligned, axes)
    val_rows = RowSampler(TokenSplit(data_dir, "val"), tr.seq_len, 0, axes=axes)
    # the sink metric reads held-out rows that start as the training rows do (BOS first under data.bos_aligned),
    # since a sink forms on the token that opens every row the model trained on
    sink_rows = RowSampler(val_rows.split, tr.seq_len, 0, bos_aligned, axes) if tr.sink_metric else None
    scaler = grad_scaler(rt, ckpt.get("scaler") if tr.resume else None)
    say(
        f"{model.pe.name}: {model.num_params() / 1e6:.2f}M parameters, {train_rows.n_rows:,} training rows of "
        f"{tr.seq_len}, {accum} x {tr.batch_size} x {rt.world} sequences per step, {rt.device} {rt.dtype}"
    )
    logger = wandb_run = None
    if rt.master:
        out_dir.mkdir(parents=True, exist_ok=True)
        if cfg.logger.wandb:
            name = f"{model.pe.name}-{out_dir.name}"
            wandb_run = start_wandb(cfg.logger.project, out_dir, resolved, cfg.logger.mode, group, name, wandb_id)
        logger = Logger(out_dir, wandb_run, resume_step=step if tr.resume else None)

    last_saved = {}

    def save():
        """Every rank takes part (FSDP gathers the shards); rank 0 writes, and only finite weights."""
        model_state, opt_states = parallel.full_state(model, opts, tr.parallel)
        if runtime.any_rank(rt.master and not all(t.isfinite().all() for t in model_state.values()), rt.device):
            raise diverged("weights became non-finite", step, out_dir)
        if rt.master:
            checkpoint.save(
                out_dir / checkpoint.NAME,
                {
                    **run,
                    "model": model_state,
                    "optimizer": opt_states,
                    "scaler": scaler.state_dict(),
                    "config": resolved,
                    "data_dir": str(data_dir),
                    "step": step,
                    "rows": rows,
                    "val_loss": val_loss,
                    "wandb_id": wandb_run.id if wandb_run else None,
                    "init_from": init_info,  # where a fine-tune's weights came from (None: a run from scratch)
                },
            )
            last_saved["model"] = model_state
        runtime.barrier()

    tokens_per_step = accum * tr.batch_size * tr.seq_len * rt.world
    flops_per_token, peak = model.flops_per_token(tr.seq_len), runtime.datasheet_peak(rt.device)
    val_loss, train_loss, t_start = None, float("nan"), time.time()
    t_log, tokens_since = time.time(), 0
    while step < tr.max_steps:
        lr = optim.lr_factor(step, tr.max_steps, tr.warmup_steps, tr.min_lr_ratio, tr.schedule)
        optim.set_lr(opts, lr)
        train_loss, grad_norm = train_step(runner, model, opts, train_rows, rows, accum, tr, rt, scaler)
        step, rows, tokens_since = step + 1, rows + accum * rt.world * tr.batch_size, tokens_since + tokens_per_step
        if not math.isfinite(train_loss):
            raise diverged(f"loss became {train_loss}", step, out_dir)
        last_step = step == tr.max_steps
        measure = step % tr.eval_interval == 0 or last_step
        if measure:
            t_eval = time.time()
            val_loss = evaluate(runner, val_rows, tr.eval_batches, tr.batch_size, rt)
            sink = sink_metrics(model, sink_rows, rt) if tr.sink_metric else {}
            t_log += time.time() - t_eval  # tokens/s counts training time only
        if step % tr.log_interval == 0 or measure:
            metrics = {
                "step": step,
                "train_loss": round(train_loss, 5),
                "lr": lr * opts[0].param_groups[0]["base_lr"],
                "grad_norm": round(grad_norm, 4),
                "tokens_per_sec": round(tokens_since / (time.time() - t_log), 1),
                "tflops_per_sec": None,  # model FLOPs done per second, over all processes
                "mfu": None,  # against the datasheet bf16 peak of every GPU (null where none is known)
                "tokens": step * tokens_per_step,
                "elapsed_s": round(time.time() - t_start, 2),
            }
            flops = metrics["tokens_per_sec"] * flops_per_token
            metrics["tflops_per_sec"] = float(f"{flops / 1e12:.4g}")
            if peak:
                metrics["mfu"] = round(flops / (peak * rt.world), 4)
            if measure:
                metrics["val_loss"] = round(val_loss, 5)
                metrics.update(sink)
            if logger:
                logger.log(metrics)
            say(
                f"step {step}/{tr.max_steps} loss {train_loss:.4f}"
                + (f" val {val_loss:.4f}" if measure else "")
                + (
                    f" sink heads {sink['sink_share']:.2f} first-token max {max(sink['first_token_max']):.3f}"
                    + (
                        f" nothing max {max(sink['nothing_max']):.3f} cost {sink['nothing_cost']:.4f}"
                        if "nothing_max" in sink
                        else ""
                    )
                    if measure and sink
                    else ""
                )
                + f" lr {metrics['lr']:.2e} gnorm {grad_norm:.3f} {metrics['tokens_per_sec']:.0f} tok/s"
            )
            t_log, tokens_since = time.time(), 0
        out_of_time = tr.time_limit_min is not None and time.time() - t_start > 60 * tr.time_limit_min
        stopping = runtime.any_rank(stop.requested or out_of_time, rt.device)
        if step % tr.ckpt_interval == 0 or last_step or stopping:
            save()
        if stopping:
            break

    wall = time.time() - t_start
    parallel.check_ranks_agree(model, rt, tr.parallel)
    if rt.master:
        if val_loss is not None:
            say(
                f"val loss {val_loss:.4f} (ppl {math.exp(val_loss):.1f}) at step {step}, {wall:.0f} s, "
                f"checkpoint {out_dir / checkpoint.NAME}"
            )
        if tr.sample_tokens > 0 and step == tr.max_steps and not train_rows.split.position_axes:  # text only
            sampler = model
            if run["optimizer_format"] == "fsdp":  # shards cannot decode alone: a whole copy from the checkpoint
                sampler = checkpoint.build_model(model_config).to(rt.device)
                sampler.load_state_dict(last_saved["model"])
            print_sample(sampler, tok_spec, tr.sample_tokens, rt)
        logger.close()
    return {
        "step": step,
        "train_loss": train_loss,
        "val_loss": val_loss,
        "wall_s": round(wall, 1),
        "out_dir": str(out_dir),
    }


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig):
    hc = HydraConfig.get()
    out_dir = hc.runtime.output_dir if OmegaConf.is_missing(cfg, "out_dir") else cfg.out_dir
    group = cfg.logger.group or (Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None)
    return cli(lambda: train(cfg, out_dir, group))


if __name__ == "__main__":
    hydra_cli(main)
