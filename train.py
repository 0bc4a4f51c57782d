"""Train a small GPT whose positional scheme is one word of config.

python train.py                                       tiny model, RoPE, the embedded Shakespeare corpus
python train.py positional=alibi model=small train.max_steps=3000
python train.py -m positional=learned,sinusoidal,alibi,rope,nope,sink      (a sweep; same as sweep=schemes)
torchrun --nproc_per_node=8 train.py model=d12 train.total_batch_size=524288
python train.py init_from=out/rope train.seq_len=1024 positional.scaling=yarn positional.scaling_factor=4
Read top to bottom: setup (data, model, optimizer, resume), then train(): step, evaluate, log, save, each taking and
returning the TrainState. Leaves out_dir/ckpt.pt (written whole; train.resume=true goes on) and metrics.jsonl; a run
holds out_dir/.lock; SIGTERM or Ctrl-C saves and stops; a diverged run (lost()) exits 2 and keeps its last good
checkpoint.
"""

import errno
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from data import tokenizer
from data.loader import RowSampler, TokenSplit, load_meta
from data.prepare import prepare
from model.gpt import GPT, sample_next
from settings import config_type
from utils import checkpoint, checks, files, optim, runtime, schema
from utils.errors import UserError, cli, hydra_cli
from utils.logger import Logger, Meter, log, metrics, start_wandb, wandb_where

LOST_STEPS = 5  # lost steps in a row (lost()) that stop a run as diverged


@dataclass
class TrainState:
    """Where the run is: what a checkpoint saves beside the weights, and what the last step measured."""

    step: int = 0
    rows: int = 0  # training rows read over every rank: the data position a resume continues from
    train_loss: float = math.nan
    grad_norm: float = math.nan  # before clipping
    lr: float = math.nan  # of the first parameter group
    val_loss: float | None = None  # at the last evaluation
    wandb_id: str | None = None  # a resumed run logs on into the same wandb run
    init_from: dict | None = None  # where a fine-tune's weights came from (None: a run from scratch)
    saved: int | None = None  # the step of the checkpoint this run wrote or resumed from (None: none yet)
    lost_steps: int = 0  # lost steps in a row, up to this one (lost())


@dataclass
class Setup:
    """What a run builds once: its config, data, model and optimizer, and where it writes."""

    cfg: DictConfig
    rt: runtime.Runtime
    out_dir: Path
    resolved: dict  # the config with every value resolved, as the checkpoint keeps it
    match: dict  # what a resumed run must match (checkpoint.MATCH_KEYS)
    data_dir: Path
    model: torch.nn.Module  # the raw model: its weights are saved, probes read it
    runner: torch.nn.Module  # what a step calls: the model wrapped for DDP or FSDP, and compiled
    opts: list
    scaler: torch.amp.GradScaler
    train_rows: RowSampler
    val_rows: RowSampler
    accum: int  # micro-batches per step and process

    @property
    def rows_per_step(self) -> int:
        return self.accum * self.rt.world * self.cfg.train.batch_size

    @property
    def vocab_size(self) -> int:
        return self.match["model_config"]["vocab_size"]


def measure(probes: list, model, rows, rt) -> tuple[dict, str]:
    from evaluation import probes as probing  # loaded where a run has probes (train.sink_metric, a study's)

    return probing.measure(probes, model, rows, rt)


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


def prepare_data(resolved: dict, rt, say) -> tuple[Path, dict, int]:
    """Rank 0 prepares the dataset (once per dataset and tokenizer); the others wait, then find it ready."""
    if rt.master:
        prepare(resolved["data"], resolved["tokenizer"], log=say)
    rt.barrier()
    data_dir = prepare(resolved["data"], resolved["tokenizer"], log=say)
    return data_dir, tokenizer.read_spec(data_dir), load_meta(data_dir)["vocab_size"]


def grad_scaler(rt) -> torch.amp.GradScaler:
    """Under fp16 autocast the loss is scaled up before backward, or small gradients flush to zero in fp16;
    steps whose gradients overflow are skipped and the scale lowered. Disabled (a pass-through) otherwise."""
    return torch.amp.GradScaler(rt.device.type, enabled=rt.dtype == torch.float16)


def setup(cfg, out_dir: Path, rt, init: dict | None) -> tuple[Setup, TrainState]:
    """Data, model and optimizer, and the state to start from: step 0 (from init_from's weights in a fine-tune) or
    out_dir's checkpoint under train.resume."""
    tr, say = cfg.train, (print if rt.master else (lambda *a, **k: None))
    checkpoint.check_out_dir(out_dir, tr)
    resolved = schema.plain(cfg, throw_on_missing=True)
    data_dir, tok_spec, vocab_size = prepare_data(resolved, rt, say)
    bos_aligned = bool(resolved["data"].get("bos_aligned", False))  # absent from configs older than the option
    match = {
        "model_config": schema.model_config(resolved, vocab_size),
        "tokenizer": tok_spec,
        "seq_len": tr.seq_len,
        "bos_aligned": bos_aligned,  # another row order: another run
        "optimizer_format": "fsdp" if rt.sharded else "plain",  # how optimizer state is keyed
        "data": checkpoint.corpus(resolved["data"]),  # other documents (data.tasks): another run
    }
    config = checks.checked_model(cfg, vocab_size)  # the config preflight checked, its length included
    if config is None:  # a scheme preflight could not build on the meta device: checked here
        model = checkpoint.build_model(match["model_config"])
        model.pe.check_length(tr.seq_len)
    else:
        model = GPT(config)
    state = TrainState()
    if init is not None and not tr.resume:  # weights only, before any wrapping: every rank loads the same
        from utils import finetune

        state.init_from = finetune.load_weights(model, init, match, cfg.init_from)
        say(
            f"starting from the weights of {state.init_from['path']} (step {init['step']}, seq_len "
            f"{init['seq_len']}); fresh optimizer, step 0"
        )
    model.to(rt.device)
    runner = rt.wrap(model, resolved["optim"]["name"])
    fused = rt.device.type == "cuda" and match["optimizer_format"] == "plain"
    opts = optim.build(model, resolved["optim"], fused=fused)
    scaler = grad_scaler(rt)
    if tr.resume:
        state = resume(out_dir, match, model, opts, scaler, rt, say)
    if runtime.should_compile(cfg.compile, rt.device, say):
        # a fresh cache: the recompile limit is per code object, and an in-process sweep's (-m) earlier models
        # would use it up; past the limit, an error rather than a run left eager with a warning
        torch._dynamo.reset()
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        runner = torch.compile(runner)
    train_rows = row_sampler(cfg, data_dir, "train", cfg.seed, bos_aligned, model.pe.axes)
    val_rows = row_sampler(cfg, data_dir, "val", 0, False, model.pe.axes)
    accum = grad_accum_steps(tr, rt.world)
    s = Setup(cfg, rt, out_dir, resolved, match, data_dir, model, runner, opts, scaler, train_rows, val_rows, accum)
    say(
        f"{model.pe.name}: {model.num_params() / 1e6:.2f}M parameters, {train_rows.n_rows:,} training rows of "
        f"{tr.seq_len}, {accum} x {tr.batch_size} x {rt.world} sequences per step, {rt.device} {rt.dtype}"
    )
    return s, state


def row_sampler(cfg, data_dir: Path, split: str, seed: int, aligned: bool, axes: int):
    """The rows a step reads from a split: a corpus's (data/loader.py: BOS-first under data.bos_aligned, and the
    position axes the scheme reads from a dataset that has them, data=grids), or one task sample per row, answers
    the only targets and positions drawn at random under data.random_positions (data/tasks.py)."""
    if cfg.data.source == "tasks":
        from data import tasks  # the task generators' rows: loaded when data=tasks asks for them

        tr = cfg.train  # batches of one sample length: rows bucketed by batch_size
        rows = TokenSplit(data_dir, split)
        return tasks.TaskRows(rows, tr.seq_len, seed, cfg.data.random_positions, tr.batch_size)
    return RowSampler(TokenSplit(data_dir, split), cfg.train.seq_len, seed, aligned, axes)


def resume(out_dir: Path, match: dict, model, opts, scaler, rt, say) -> TrainState:
    """Weights, optimizer moments, loss scale and data position from out_dir's checkpoint, which must match the run."""
    ckpt = checkpoint.load(out_dir)
    checkpoint.check_resume(ckpt, match, out_dir / checkpoint.NAME)
    checkpoint.check_weights(model, ckpt)
    checkpoint.resume_state(ckpt, model, opts, rt)
    if ckpt.get("scaler"):  # empty where the run had no fp16 loss scaling
        scaler.load_state_dict(ckpt["scaler"])
    say(f"resuming {out_dir} at step {ckpt['step']}")
    kept = {k: ckpt.get(k) for k in ("wandb_id", "init_from", "val_loss")}  # val_loss: a finished run reports it
    kept["saved"] = ckpt["step"]
    return TrainState(ckpt["step"], ckpt["rows"], **kept)


def start_logger(s: Setup, state: TrainState, group: str | None) -> tuple[Logger | None, TrainState]:
    """Rank 0's metrics.jsonl and wandb run (a resumed run continues both); None on the other ranks."""
    if not s.rt.master:
        return None, state
    s.out_dir.mkdir(parents=True, exist_ok=True)
    wandb_run, lg = None, s.cfg.logger
    if lg.wandb:
        name = f"{s.model.pe.name}-{s.out_dir.name}"
        wandb_run = start_wandb(lg.project, s.out_dir, s.resolved, lg.mode, group, name, state.wandb_id)
    logger = Logger(s.out_dir, wandb_run, resume_step=state.step if s.cfg.train.resume else None)
    return logger, replace(state, wandb_id=wandb_run.id if wandb_run else state.wandb_id)  # kept for a later resume


def train_step(runner, model, opts, batches: RowSampler, rows: int, accum: int, tr, rt, scaler) -> tuple[float, float]:
    """One optimizer step over accum micro-batches per rank; returns the mean loss over all ranks and the
    gradient norm before clipping."""
    loss_sum = torch.zeros((), device=rt.device)
    for micro in range(accum):
        first = rows + (micro * rt.world + rt.rank) * tr.batch_size
        x, y = batches.batch(first, tr.batch_size, rt.device)
        pos = batches.positions(first, tr.batch_size, rt.device)  # (axes, T) ids for a grid; None for text
        with rt.sync_grads(runner, micro == accum - 1), rt.autocast():
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
    loss, norm = torch.stack((rt.all_reduce_mean(loss_sum), norm.float())).tolist()
    return loss, norm


def lost(loss: float, vocab_size: int, step: int, warmup_steps: int) -> bool:
    """A loss past warmup that is no better than a uniform guess over the vocabulary: not below ln(V) - 1e-3. A run
    that diverges without a NaN ends there, at a learning rate far too high: its output saturates to a uniform
    distribution, the loss pinned at ln(V) with a gradient norm of exactly 0, or it predicts worse than uniform,
    above ln(V). A healthy run is below ln(V) by then (the frequencies of its tokens alone take it there); during
    warmup, which starts at ln(V), only a value that is not finite counts."""
    return step > warmup_steps and loss >= math.log(vocab_size) - 1e-3


def no_better(vocab_size: int) -> str:
    return f"no better than a uniform guess (ln({vocab_size}) = {math.log(vocab_size):.4f})"


def step(s: Setup, state: TrainState) -> TrainState:
    """One step at the schedule's learning rate; a loss that is not finite, or LOST_STEPS lost ones in a row (lost()),
    stop the run (its last good checkpoint kept)."""
    tr = s.cfg.train
    factor = optim.lr_factor(state.step, tr.max_steps, tr.warmup_steps, tr.min_lr_ratio, tr.schedule)
    optim.set_lr(s.opts, factor)
    loss, norm = train_step(s.runner, s.model, s.opts, s.train_rows, state.rows, s.accum, tr, s.rt, s.scaler)
    if not math.isfinite(loss):
        raise diverged(f"loss became {loss}", state.step + 1, s, state)
    n_lost = state.lost_steps + 1 if lost(loss, s.vocab_size, state.step + 1, tr.warmup_steps) else 0
    if n_lost >= LOST_STEPS:
        what = f"{n_lost} steps in a row {no_better(s.vocab_size)}, the last with loss {loss:.4f}"
        what += f" and gradient norm {norm:.3g},"
        raise diverged(what, state.step + 1, s, state)
    lr, rows = factor * s.opts[0].param_groups[0]["base_lr"], state.rows + s.rows_per_step
    return replace(state, step=state.step + 1, rows=rows, train_loss=loss, grad_norm=norm, lr=lr, lost_steps=n_lost)


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
    return (rt.all_reduce_mean(total) * rt.world / n_batches).item()


def kept(out_dir: Path, state: TrainState) -> str:
    """Which checkpoint is left on disk."""
    if state.saved is None:
        return "no checkpoint was written yet"
    return f"the last good checkpoint (step {state.saved}) is kept in {out_dir}"


def diverged(what: str, step: int, s: Setup, state: TrainState) -> UserError:
    return UserError(f"{what} at step {step}; {kept(s.out_dir, state)}. Lower optim.lr or raise train.warmup_steps")


def cannot_write(e: OSError, out_dir: Path, state: TrainState, rt) -> UserError:
    fix = "free some space there" if e.errno in files.FULL else "make it writable"
    then = f"resume: {checkpoint.resume_command(out_dir, rt)}" if state.saved is not None else "run again"
    return UserError(f"cannot write {e.filename or out_dir} ({e.strerror}); {kept(out_dir, state)}; {fix}, then {then}")


def save(s: Setup, state: TrainState) -> TrainState:
    """Every rank takes part (FSDP gathers the shards); rank 0 writes, and only finite weights, and past warmup only
    weights that beat a uniform guess on the validation rows (lost(), on the val loss train() measured at this step):
    a run that diverged keeps its last good checkpoint. A failed write (a full disk) is one line."""
    tr = s.cfg.train
    if lost(state.val_loss, s.vocab_size, state.step, tr.warmup_steps):
        raise diverged(f"validation loss {state.val_loss:.4f}: {no_better(s.vocab_size)}", state.step, s, state)
    model_state, opt_states = s.rt.full_state(s.model, s.opts)
    if s.rt.any_rank(s.rt.master and not all(t.isfinite().all() for t in model_state.values())):
        raise diverged("weights became non-finite", state.step, s, state)
    failed = None
    if s.rt.master:
        try:
            write(s, state, model_state, opt_states)
        except OSError as e:  # utils/checkpoint.py removed its temp file: the checkpoint before it stays
            failed = e
    if s.rt.any_rank(failed is not None):
        raise cannot_write(failed or OSError(errno.EIO, "failed on rank 0", None), s.out_dir, state, s.rt)
    s.rt.barrier()
    return replace(state, saved=state.step)


def write(s: Setup, state: TrainState, model_state: dict, opt_states: list):
    checkpoint.save(
        s.out_dir / checkpoint.NAME,
        {
            **s.match,
            "model": model_state,
            "optimizer": opt_states,
            "scaler": s.scaler.state_dict(),
            "config": s.resolved,
            "data_dir": str(s.data_dir),
            "step": state.step,
            "rows": state.rows,
            "val_loss": state.val_loss,
            "wandb_id": state.wandb_id,
            "init_from": state.init_from,
        },
    )


@torch.no_grad()
def print_sample(model, tok_spec, n_tokens: int, rt):
    """The model's full forward over what it has written so far, a token at a time: n_tokens short forwards cost
    little next to training, and keep the decoding caches out of a training run (sample.py streams through them)."""
    enc = tokenizer.load(tok_spec)
    ids = torch.tensor([[tokenizer.bos_id(tok_spec, enc)]], device=rt.device)
    g = torch.Generator(device=rt.device).manual_seed(0)
    for _ in range(min(n_tokens, (model.pe.max_positions or n_tokens + 1) - 1)):
        logits = model(ids, keep_from=ids.size(1) - 1)[:, -1]
        ids = torch.cat((ids, sample_next(logits, 0.8, 50, g)[:, None]), dim=1)
    print("--- sample ---\n" + enc.decode(ids[0, 1:].tolist()) + "\n--------------", flush=True)


def finish(s: Setup, state: TrainState, wall: float, logger: Logger | None, stopped: str | None):
    """Once the ranks agree on the weights (DDP), rank 0's closing lines: the validation loss, for text the sample
    of the saved model, where the run's files are, and the next command (stopped: what stopped the run early)."""
    s.rt.check_ranks_agree(s.model)
    if not s.rt.master:
        return
    tr = s.cfg.train
    if state.val_loss is not None:
        print(f"val loss {state.val_loss:.4f} (ppl {math.exp(state.val_loss):.1f}) at step {state.step}, {wall:.0f} s")
    sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN  # a sample per job: clutter
    if tr.sample_tokens > 0 and state.step == tr.max_steps and not s.train_rows.split.position_axes and not sweep:
        # the weights the last step saved: the model in memory, or under FSDP (whose shards cannot decode alone)
        # the whole model from the checkpoint
        model = s.model
        if s.rt.sharded:
            model, _ = checkpoint.load_model(s.out_dir, s.rt.device)
        print_sample(model.eval(), s.match["tokenizer"], tr.sample_tokens, s.rt)
    wandb_files = wandb_where(logger.wandb)
    logger.close()
    print(f"metrics {logger.path}; checkpoint {s.out_dir / checkpoint.NAME} (step {state.saved}){wandb_files}")
    if stopped:
        print(
            f"stopped by {stopped} at step {state.step}/{tr.max_steps}, as asked (exit status 0); resume: "
            f"{checkpoint.resume_command(s.out_dir, s.rt)}"
        )
    else:
        print(" ".join(["next: python eval.py", f"checkpoint={s.out_dir}", *eval_mode(s.cfg.data)]))


def eval_mode(data) -> list[str]:
    """How eval.py scores a run trained on this data: its source's eval.mode (data=grids: eval.mode=grids), if any."""
    mode = config_type(data).eval_mode
    return [f"eval.mode={mode}"] if mode else []


def train(cfg: DictConfig, out_dir, group: str | None = None, probes: list | None = None) -> dict:
    """Train as cfg says into out_dir; return a summary (step, losses, wall time). probes: measured at each
    evaluation and logged beside the validation loss (evaluation/probes.py); train.sink_metric adds SinkProbe."""
    cfg.out_dir, out_dir, tr = str(out_dir), Path(out_dir), cfg.train
    checks.preflight(cfg)  # every range, rule and path, and the model on the meta device, before any data is read
    init = None
    if cfg.init_from:  # init_from's checkpoint, mapped (preflight gave positional.original_length its value)
        from utils import finetune

        init = finetune.read_init(cfg)
    if tr.sink_metric:  # the attention on the first token of held-out rows, at every evaluation
        from evaluation.probes import SinkProbe

        probes = [*(probes or []), SinkProbe()]
    rt = runtime.setup(cfg.device, cfg.dtype, cfg.seed, tr.parallel)
    if rt.world > 1:  # a torchrun job: DDP or FSDP share the model and the work over the ranks
        from utils import parallel

        rt = parallel.ranks(rt)
    stop, lock, state = runtime.StopFlag(), None, TrainState()
    try:
        lock = checkpoint.lock_out_dir(out_dir, rt)
        s, state = setup(cfg, out_dir, rt, init)
        logger, state = start_logger(s, state, group)
        # held-out rows that open as the training rows do (BOS first under data.bos_aligned): what probes read
        held_out = row_sampler(cfg, s.data_dir, "val", 0, s.match["bos_aligned"], s.model.pe.axes)
        peak = (runtime.datasheet_peak(rt.device) or 0) * rt.world  # bf16 FLOP/s of every GPU (none on a CPU)
        meter = Meter(s.rows_per_step * tr.seq_len, s.model.flops_per_token(tr.seq_len), peak, state.step)
        t_start, first = time.time(), state.step
        stopped, stop.saving = None, True
        while state.step < tr.max_steps:
            state = step(s, state)
            last = state.step == tr.max_steps
            out_of_time = tr.time_limit_min is not None and time.time() - t_start > 60 * tr.time_limit_min
            halt = rt.any_rank(stop.requested or out_of_time)
            saving = state.step % tr.ckpt_interval == 0 or last or halt
            measured, probed = None, ""
            if state.step % tr.eval_interval == 0 or saving:  # a checkpoint holds, and the log shows, its own val loss
                with meter.paused():  # tokens/s counts training time only
                    state = replace(state, val_loss=evaluate(s.runner, s.val_rows, tr.eval_batches, tr.batch_size, rt))
                    measured, probed = measure(probes, s.model, held_out, rt) if probes else ({}, "")
            elapsed = time.time() - t_start
            if logger and (state.step % tr.log_interval == 0 or measured is not None):
                eta = elapsed / (state.step - first) * (tr.max_steps - state.step)  # at this run's pace so far
                log(logger, metrics(state, meter, elapsed, measured, tr.seq_len), tr.max_steps, probed, eta)
            if saving:
                with meter.paused():
                    state = save(s, state)
            if halt:
                stopped = stop.name or f"train.time_limit_min={tr.time_limit_min}"
                break
        wall = time.time() - t_start
        finish(s, state, wall, logger, stopped)
    except OSError as e:
        if e.errno not in files.FULL:
            raise
        raise cannot_write(e, out_dir, state, rt) from None
    finally:
        stop.restore()
        if lock is not None:
            runtime.unlock_folder(lock)
        s = None  # the DDP wrapper goes while its process group lives (runtime.teardown says why)
        runtime.teardown()
    return {
        "step": state.step,
        "train_loss": state.train_loss,
        "val_loss": state.val_loss,
        "wall_s": round(wall, 1),
        "out_dir": str(out_dir),
    }


class SweepSummary(Callback):
    """After `python train.py -m ...` (configs/train.yaml registers it): where the sweep's runs are, and the
    command that compares them."""

    def on_multirun_end(self, config, **kwargs):
        sweep = Path(config.hydra.sweep.dir)
        runs = sorted(sweep.glob(f"*/{checkpoint.NAME}"))
        compare = " ".join(["python eval.py", f"sweep_dir={sweep}", *eval_mode(config.data)])
        print(f"sweep: {len(runs)} runs in {sweep}; compare them: {compare}")


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig):
    hc = HydraConfig.get()
    out_dir = hc.runtime.output_dir if OmegaConf.is_missing(cfg, "out_dir") else cfg.out_dir
    group = cfg.logger.group or (Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None)
    return cli(lambda: train(cfg, out_dir, group))


if __name__ == "__main__":
    hydra_cli(main)
