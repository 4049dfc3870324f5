"""A run's components, built once (`build_run`): data, model (and its micro-batch when it is `auto`), DDP, optimizer,
schedule, sampler, clipper and noise-scale probe, in the `Run` the loop takes; its state restored from a checkpoint
(`restore`) and saved to one (`checkpoint`); and what it says as it starts (the start-up line's parts, warnings about
its schedule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer.attention import flash_device, resolve_attention
from trainer.balance import RankBatchSampler, build_batch_sampler, make_node_groups, warn_one_bin
from trainer.checkpoint import (
    TrainState,
    finished_status,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    saved_micro_batch,
    saved_world_size,
)
from trainer.clipping import GradientClipper, effective_optimizer_config
from trainer.config import TrainerConfig, dump_config
from trainer.data.batch import ShapeBudget, masked_counts, training_budget
from trainer.data.checks import load_checked_samples, warn_rows_narrower_than
from trainer.data.shards import PretrainingSamples
from trainer.distributed import DistEnv, all_gather_scalars, log
from trainer.errors import CheckpointError, ConfigError
from trainer.hf_weights import load_hf_state_dict, read_state_dict
from trainer.memory import choose_micro_batch, out_of_memory
from trainer.mlperf_log import MLPerfLog
from trainer.model import BertForPreTraining, graph_per_shape
from trainer.noise_probe import NormProbe
from trainer.noise_scale import NoiseScaleEstimator
from trainer.optim import build_optimizer
from trainer.precision import precision_name, resolve_autocast
from trainer.preflight import accumulation_steps, earlier_save, resumed_batch
from trainer.report import NullReporter, Reporter
from trainer.schedule import build_scheduler, idle_steps, mlperf_lr

# --------------------------------------------------------------------------- the components


@dataclass
class Run:
    """Everything the loop needs, built once."""

    cfg: TrainerConfig
    env: DistEnv
    device: torch.device
    model: BertForPreTraining
    ddp: DistributedDataParallel | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    clipper: GradientClipper
    autocast: torch.dtype | None
    train_samples: PretrainingSamples
    eval_samples: PretrainingSamples
    sampler: RankBatchSampler
    accumulation: int
    total_steps: int  # the learning rate's decay horizon
    budget_steps: int  # the optimizer steps `budget.max_samples` allows (epochs' short last steps counted)
    reporter: Reporter
    probe: NormProbe | None  # None: noise scale off or not measurable (one process, no accumulation)
    noise_scale: NoiseScaleEstimator
    mlperf: MLPerfLog  # MLPerf's mllog events (does nothing unless log.mlperf names a file, and on ranks > 0)
    shapes: ShapeBudget | None = None  # model.static_shapes: what every training micro-batch is padded to
    eval_shapes: ShapeBudget | None = None  # and every evaluation batch

    @property
    def module(self) -> torch.nn.Module:
        return self.ddp if self.ddp is not None else self.model


def build_run(cfg: TrainerConfig, env: DistEnv, device: torch.device, reporter: Reporter, mlperf: MLPerfLog) -> Run:
    autocast = resolve_autocast(cfg, device)
    width = cfg.data.max_seq_length
    train_samples = load_checked_samples(cfg.data.train, "data.train", cfg.model, max_seq_length=width)
    eval_samples = load_checked_samples(cfg.data.eval, "data.eval", cfg.model, cfg.eval.max_samples, width)
    warn_rows_narrower_than(width, {"data.train": (cfg.data.train, train_samples),
                                    "data.eval": (cfg.data.eval, eval_samples)})  # fmt: skip
    model = build_model(cfg, device)
    model.cuda_graphs = False  # measuring the memory of micro-batches (auto) on graphs would keep each one's pool
    cfg = resolve_micro_batch(cfg, env, device, autocast, model, train_samples)
    seed_rank_stream(cfg.seed, env.rank)
    accumulation = accumulation_steps(cfg, env)
    model.cuda_graphs = accumulation == 1  # see BertForPreTraining.cuda_graphs
    ddp = None
    if env.enabled:
        ddp = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=cfg.clipping.bucket_cap_mb,
        )
    optimizer = build_optimizer(model, effective_optimizer_config(cfg.optimizer, cfg.clipping))
    scaler = torch.amp.GradScaler(
        device.type, init_scale=cfg.precision.initial_loss_scale, enabled=autocast is torch.float16
    )
    sampler = build_sampler(cfg, env, train_samples)
    budget_steps = sampler.optimizer_steps(cfg.budget.max_samples, accumulation)
    horizon = cfg.schedule.horizon_samples or cfg.budget.max_samples  # by default the run's own steps
    total_steps = cfg.schedule.total_steps or sampler.optimizer_steps(horizon, accumulation)
    scheduler = build_scheduler(optimizer, cfg.schedule, cfg.optimizer.lr, total_steps)
    probe = build_probe(cfg, env, device, model, accumulation)
    clipper = GradientClipper(cfg.clipping, cfg.optimizer.name, model, ddp, scaler, env, probe)
    run = Run(
        cfg,
        env,
        device,
        model,
        ddp,
        optimizer,
        scheduler,
        scaler,
        clipper,
        autocast,
        train_samples,
        eval_samples,
        sampler,
        accumulation,
        total_steps,
        budget_steps,
        reporter if env.is_main else NullReporter(),
        probe,
        NoiseScaleEstimator(cfg.log.noise_scale_decay),
        mlperf,
    )
    if cfg.model.static_shapes:
        run.shapes, run.eval_shapes = shape_budgets(sampler, train_samples, eval_samples, cfg.eval.batch_size, env)
    return run


def build_sampler(cfg: TrainerConfig, env: DistEnv, train_samples: PretrainingSamples) -> RankBatchSampler:
    """This rank's micro-batches of every epoch, balanced as `balance` says over the ranks (and nodes)."""
    warn_one_bin(train_samples.lengths, cfg.balance.method, cfg.balance.bins)
    return build_batch_sampler(
        train_samples.lengths,
        cfg.balance.method,
        cfg.balance.bins,
        cfg.batch.micro_batch_size,
        cfg.seed,
        shuffle=cfg.data.shuffle,
        rank=env.rank,
        world_size=env.world_size,
        local_world_size=env.local_world_size,
        node_group=make_node_groups(env.world_size, env.local_world_size) if env.enabled else None,
    )


def build_probe(
    cfg: TrainerConfig, env: DistEnv, device: torch.device, model: torch.nn.Module, accumulation: int
) -> NormProbe | None:
    """The noise-scale probe, where `log.noise_scale` asks for it and a step has small batches to compare with its
    big one (several ranks, or micro-batches accumulated); None otherwise."""
    if not cfg.log.noise_scale or not (env.enabled or accumulation > 1):
        return None
    probe = NormProbe(env.world_size, device=device)
    if accumulation > 1:  # micro-batches are the small batches, on any number of ranks (exact under any clip)
        probe.watch_micro_batches([p for p in model.parameters() if p.requires_grad])
    elif env.world_size > 2 and cfg.clipping.strategy in ("before_allreduce", "bucketwise"):
        log(env, f"noise scale: approximate while {cfg.clipping.strategy} clipping bites on {env.world_size} ranks "
                 "(the unclipped average is never formed); accumulate >= 2 micro-batches for an exact one")  # fmt: skip
    return probe


def build_model(cfg: TrainerConfig, device: torch.device) -> BertForPreTraining:
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = BertForPreTraining(cfg.model)
    if cfg.model.init_checkpoint:
        state = read_state_dict(cfg.model.init_checkpoint)  # its errors name the file
        try:
            load_hf_state_dict(model, state)
        except CheckpointError as e:
            raise CheckpointError(f"model.init_checkpoint {cfg.model.init_checkpoint}: {e}") from None
    return model.to(device)


def resolve_micro_batch(
    cfg: TrainerConfig, env: DistEnv, device: torch.device, autocast: torch.dtype | None, model, samples
) -> TrainerConfig:
    """`batch.micro_batch_size: auto` made a number by measuring the device's memory (trainer/memory.py), the
    smallest of the ranks' choices on every rank; a run that resumes takes its checkpoint's (the loop's position
    counts micro-batches). A config with a number is returned as it is."""
    if cfg.batch.micro_batch_size != "auto":
        return cfg
    path = latest_checkpoint(cfg.checkpoint.dir) if cfg.checkpoint.resume else None
    chosen = saved_micro_batch(path) if path is not None else None
    if chosen is not None:  # one that does not divide this run's batch was refused before any work (preflight)
        log(env, f"batch.micro_batch_size auto: {chosen}, as checkpoint {path} trained (resumed runs keep it)")
    else:
        per_rank, sharing = (
            cfg.batch.global_batch_size // env.world_size,
            1 if device.type == "cuda" else env.local_world_size,
        )
        try:
            copies = (1 + (cfg.clipping.strategy == "before_allreduce")) if env.enabled else 0  # DDP's buckets
            fit = choose_micro_batch(model, samples, per_rank, device, autocast, sharing=sharing,
                                     gradient_copies=copies)  # fmt: skip
            mine, line = fit.micro_batch_size, fit.describe()
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
            if not out_of_memory(e):
                raise
            # Still join the ranks' choice (no rank waits for one that left); a step at 1 then trains, or fails as
            # out of memory like any other step.
            mine, line = 1, f"batch.micro_batch_size auto: 1 (measuring the longest sequences ran out of memory: {e})"
        chosen = int(min(r[0] for r in all_gather_scalars([mine], device, env)))
        log(env, line + (f"; {chosen} on every rank, another's" if chosen != mine else ""))
    return cfg.model_copy(update={"batch": cfg.batch.model_copy(update={"micro_batch_size": chosen})})


def seed_rank_stream(seed: int, rank: int, *entropy: int) -> None:
    """Give each rank its own random stream from here on (dropout masks): ranks > 0 are reseeded from (seed, rank,
    *entropy) through a seed sequence, so that no rank shares a stream with another rank or with a run of a nearby
    seed (a confirmation run's); rank 0 goes on with the stream it has (of `seed`, as one process does)."""
    if rank > 0:
        torch.manual_seed(int(np.random.SeedSequence([seed, rank, *entropy]).generate_state(1, dtype=np.uint64)[0]))


def restore_rank_rng(payload: dict[str, Any], rank: int, world_size: int, seed: int, step: int) -> None:
    """Put back this rank's random state from a checkpoint. Saved for this many ranks, each rank takes its own; else
    (another number of ranks, or a failed run's save, rank 0's alone) every rank takes rank 0's and ranks > 0 then
    draw from a stream of their own, from (seed, rank, step), as a fresh start does from (seed, rank)."""
    ranks = payload.get("rng_ranks") or []
    if len(ranks) == world_size:
        restore_rng_state(ranks[rank])
        return
    restore_rng_state(payload["rng"])
    seed_rank_stream(seed, rank, step)


def shape_budgets(
    sampler: RankBatchSampler, train: PretrainingSamples, eval_: PretrainingSamples, eval_batch_size: int, env: DistEnv
) -> tuple[ShapeBudget, ShapeBudget]:
    """`model.static_shapes`: the budget of the training micro-batches, from the first epoch's (every rank's: each
    rank pads to the same): TOKEN_LEVELS lengths from above the largest down towards the smallest full micro-batch;
    and the evaluation batches' (one length, the evaluation set's, split as `evaluate` splits it)."""
    loads = sampler.loads(0)  # [micro-batch, rank, (tokens, sequences)]
    shapes = training_budget(loads[:, :, 0], loads[:, :, 1], sampler.largest(0, masked_counts(train)))
    eval_masked, most = masked_counts(eval_), (0, 0)
    for rank in range(env.world_size):
        mine = np.arange(rank, len(eval_), env.world_size)
        for start in range(0, len(mine), eval_batch_size):
            index = mine[start : start + eval_batch_size]
            most = (max(most[0], int(eval_.lengths[index].sum())), max(most[1], int(eval_masked[index].sum())))
    return shapes, ShapeBudget.fitting(*most)


# --------------------------------------------------------------------------- resume and save


def restore(run: Run) -> TrainState:
    """Continue from the latest checkpoint of `checkpoint.dir` when there is one, else start fresh."""
    path = latest_checkpoint(run.cfg.checkpoint.dir) if run.cfg.checkpoint.resume else None
    if path is None:
        return TrainState(next_eval_samples=run.cfg.eval.every_samples, world_size=run.env.world_size)
    payload, state = load_checkpoint(path)  # at the micro-batch it was saved with (refuse_before_work, auto)
    saved, moved = saved_world_size(payload, state), ""
    if finished_status(run.cfg, state) is None:  # else it trains nothing, and saves the position as it was
        state.batch_in_epoch = resumed_batch(run.cfg, path, state, saved, run.env.world_size,
                                             len(run.sampler.lengths), run.cfg.batch.micro_batch_size)  # fmt: skip
        if saved is not None and saved != run.env.world_size:
            moved = (
                f" (saved on {saved} rank{'s' * (saved != 1)}: epoch {state.epoch} goes on at micro-batch "
                f"{state.batch_in_epoch} of {run.sampler.steps_per_epoch} a rank, after the same samples)"
            )
        state.world_size = run.env.world_size
    try:
        _restore_from(run, payload, state)
    except (KeyError, RuntimeError, ValueError, TypeError) as e:  # a damaged or foreign file that loaded
        what = f"it has no {e.args[0]!r} entry" if isinstance(e, KeyError) else str(e).strip().splitlines()[0][:300]
        raise ConfigError(f"checkpoint.dir: {path} does not fit this run ({what}); {earlier_save(path)}") from None
    log(run.env, f"resumed from {path} at step {state.step}, {state.samples:,} samples{moved}")
    return state


def _restore_from(run: Run, payload: dict[str, Any], state: TrainState) -> None:
    """Put the model, optimizer, schedule, loss scale, noise-scale estimate and random state back from `payload`."""
    run.model.load_state_dict(payload["model"])
    # The optimizer's moments are the checkpoint's, its hyperparameters (betas, eps, weight decay) this run's config's,
    # as its MLPerf log says: loading a state dict would put back the saved run's.
    hyperparameters = [{k: v for k, v in group.items() if k != "params"} for group in run.optimizer.param_groups]
    run.optimizer.load_state_dict(payload["optimizer"])
    for group, own in zip(run.optimizer.param_groups, hyperparameters, strict=True):
        group.update(own)
    run.scheduler.load_state_dict(payload["scheduler"])
    # The schedule is this run's config's (its lambda was built from it), its base rate too: the checkpoint's
    # `base_lrs` would keep the saved run's optimizer.lr, whatever this run says (and its MLPerf log).
    run.scheduler.base_lrs = [run.cfg.optimizer.lr] * len(run.optimizer.param_groups)
    for group, factor in zip(run.optimizer.param_groups, run.scheduler.lr_lambdas, strict=True):
        group["lr"] = run.cfg.optimizer.lr * factor(run.scheduler.last_epoch)
    run.scaler.load_state_dict(payload["scaler"])
    if "noise_scale" in payload:
        run.noise_scale.load_state_dict(payload["noise_scale"])
    if payload.get("ddp_buckets") is not None:
        run.clipper.resume_layout(payload["ddp_buckets"])
    restore_rank_rng(payload, run.env.rank, run.env.world_size, run.cfg.seed, state.step)


def checkpoint(run: Run, state: TrainState, every_rank: bool = True) -> None:
    """Save the run where it is (rank 0 writes). `every_rank`: all ranks are here together (a checkpoint of the loop,
    or the end of a run that ended as planned), so each rank's RNG states are gathered too and a resumed run draws
    on every rank the dropout masks an uninterrupted one would; after a failure rank 0 saves alone, with its own."""
    if run.cfg.checkpoint.dir is None:
        return
    rng_ranks = None
    if every_rank and run.env.enabled:
        rng_ranks = [None] * run.env.world_size
        dist.all_gather_object(rng_ranks, rng_state())
    if not run.env.is_main:
        return
    payload = {
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict(),
        "noise_scale": run.noise_scale.state_dict(),
        "ddp_buckets": run.clipper.bucket_layout(),  # bucket-wise clipping's buckets, which a resume clips by
        "config": dump_config(run.cfg),
        **({"rng_ranks": rng_ranks} if rng_ranks is not None else {}),
    }
    save_checkpoint(run.cfg.checkpoint.dir, payload, state, keep=run.cfg.checkpoint.keep)


# --------------------------------------------------------------------------- what a run says as it starts


def say_start(run: Run) -> None:
    """The start-up line (the model, the batch, the optimizer, clipping, balance, how it executes), the fixed shapes
    where there are any, and the warnings about the schedule: from rank 0."""
    cfg, env = run.cfg, run.env
    log(
        env,
        f"training BERT ({sum(p.numel() for p in run.model.parameters()):,} parameters) on {run.device} x "
        f"{env.world_size}, global batch {cfg.batch.global_batch_size} = {cfg.batch.micro_batch_size} x "
        f"{run.accumulation} accumulation x {env.world_size} ranks, {cfg.optimizer.name}, "
        f"{clipping_summary(cfg, run.clipper)}, balance {cfg.balance.method}; "
        f"{execution(cfg, run.device, run.autocast, run.accumulation)}",
    )
    if run.shapes is not None:
        log(env, fixed_shapes_line(run))
    warn_long_warmup(run)
    warn_idle_steps(run)


def clipping_summary(cfg: TrainerConfig, clipper: GradientClipper) -> str:
    """The clipping strategy, for the start-up line; under DDP with bucketwise or before_allreduce also DDP's number
    of gradient buckets (`GradientClipper.ddp_buckets`), which decides what bucketwise clips: one bucket clips the
    whole local gradient, as before_allreduce does."""
    text, buckets = f"clipping {cfg.clipping.strategy}", clipper.ddp_buckets
    if buckets is None:
        return text
    alike = ": clips like before_allreduce" if buckets == 1 and cfg.clipping.strategy == "bucketwise" else ""
    plural = "s" if buckets != 1 else ""
    return f"{text} ({buckets} DDP bucket{plural} at clipping.bucket_cap_mb {cfg.clipping.bucket_cap_mb:g}{alike})"


def execution(cfg: TrainerConfig, device: torch.device, autocast: torch.dtype | None, accumulation: int = 1) -> str:
    """How the model runs, for the start-up line: precision (with the residual stream in it, `model.half_residual`),
    the training attention kernel, compiled layers or model (on CUDA graphs: `BertForPreTraining.cuda_graphs`)."""
    precision = precision_name(autocast)
    if autocast is not None and cfg.model.half_residual:
        precision += f" with a {precision} residual stream"
    kernel = resolve_attention(cfg.model.attention, flash_device(device), autocast is not None, cfg.model.head_dim,
                               gpu=device.type == "cuda")  # fmt: skip
    if kernel == "varlen" and cfg.model.varlen_kernel == "cudnn":
        kernel += " on cuDNN"
    compiled = ", compiled layers" if cfg.model.compile else ""
    if cfg.model.compile_model:
        compiled = ", compiled model"
        if device.type == "cuda" and graph_per_shape(cfg.model, kernel):  # where CUDA graphs may run
            accumulates = " (no CUDA graphs: gradients accumulate over micro-batches)"
            compiled += accumulates if accumulation > 1 else " on CUDA graphs"
    kernels = [what for key, what in (("fused_norm", "bias-dropout-residual-LayerNorm"), ("fused_gelu", "bias-GELU"))
               if getattr(cfg.model, key)]  # fmt: skip
    fused = f", fused {' and '.join(kernels)} kernels" if kernels else ""
    return f"{precision}, attention {kernel}{compiled}{fused}"


def fixed_shapes_line(run: Run) -> str:
    """The start-up line of `model.static_shapes`: the budgets, and the share of the first epoch's padded tokens
    that are padding (computed and thrown away)."""
    shapes, evaluation = run.shapes, run.eval_shapes
    tokens = run.sampler.loads(0)[:, :, 0].ravel()
    padded = sum(shapes.pad_to(int(t)) for t in tokens)
    lengths = ", ".join(f"{level:,}" for level in shapes.levels)
    return (f"fixed shapes: micro-batches padded to {lengths} tokens and {shapes.masked:,} masked positions "
            f"({1 - tokens.sum() / padded:.1%} of the tokens padding in the first epoch), evaluation batches to "
            f"{evaluation.tokens:,} and {evaluation.masked:,}")  # fmt: skip


def warn_long_warmup(run: Run) -> None:
    """Say so when the warmup does not end within the steps the sample budget allows: the learning rate never
    reaches optimizer.lr."""
    cfg = run.cfg
    steps = run.budget_steps
    if cfg.schedule.warmup_steps == 0 or steps - 1 - cfg.schedule.start_warmup_step >= cfg.schedule.warmup_steps:
        return
    schedule = cfg.schedule  # the whole run warms up: its last step has the highest rate
    highest = mlperf_lr(steps - 1, cfg.optimizer.lr, schedule.warmup_steps, schedule.start_warmup_step,
                        run.total_steps, schedule.power, schedule.end_lr)  # fmt: skip
    log(
        run.env,
        f"warning: schedule.warmup_steps {schedule.warmup_steps} is longer than the run ({steps} "
        f"step{'s' * (steps != 1)}): the learning rate rises to {highest:.2g} at most, never to optimizer.lr "
        f"{cfg.optimizer.lr}",
    )


def warn_idle_steps(run: Run) -> None:
    """Say so when the schedule reaches a learning rate of 0 before the steps the sample budget allows are done:
    those steps would change nothing, unless the run stops sooner (at its target or its time budget; a run that
    cannot is refused before any work, `check_decay_horizon`)."""
    cfg, steps = run.cfg, run.budget_steps
    if not (idle := idle_steps(cfg.schedule, run.total_steps, steps)):
        return
    horizon = (f"schedule.total_steps {cfg.schedule.total_steps:,}" if cfg.schedule.total_steps is not None else
               f"schedule.horizon_samples {cfg.schedule.horizon_samples:,}, {run.total_steps:,} steps")  # fmt: skip
    stops = [name for name, on in (("its target", cfg.eval.stop_at_target),
                                   ("budget.max_time_s", cfg.budget.max_time_s is not None)) if on]  # fmt: skip
    log(
        run.env,
        f"warning: the learning rate reaches 0 after step {steps - idle:,} ({horizon}), but budget.max_samples "
        f"{cfg.budget.max_samples:,} takes {steps:,} steps: steps {steps - idle + 1:,} to {steps:,} would train at "
        "learning rate 0 and change nothing" + (f", unless the run stops sooner ({', '.join(stops)})" if stops else ""),
    )
