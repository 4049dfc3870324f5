"""The BERT pretraining loop.

Read top to bottom: build the components (data, model, optimizer, schedule, sampler), optionally resume,
then loop: a step is `accumulation` micro-batches (DDP `no_sync` on all but the last), clipping, one optimizer
step; evaluate every `eval.every_samples`; stop at the target accuracy, at the budget, or on a NaN/inf loss.
The host never waits for the device inside a step: losses stay on the device and are read back every
`log.every_steps` steps (and at evaluations, checkpoints and the end), so a NaN ends the run at the next read.
Only rank 0 prints and reports. The result says how the run ended and how fast it got to the target.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from contextlib import nullcontext, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer.balance import build_batch_sampler, make_node_groups, resume_batch, steps_per_epoch
from trainer.checkpoint import (
    TrainState,
    check_intact,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    saved_config,
    saved_micro_batch,
    saved_position,
    saved_state,
    saved_world_size,
)
from trainer.clipping import GradientClipper, effective_optimizer_config
from trainer.config import TrainerConfig, dump_config, file_in_the_way
from trainer.data.batch import PackedBatch, ShapeBudget, masked_counts, pack_batch, training_budget
from trainer.data.checks import load_checked_samples
from trainer.data.shards import PretrainingSamples, count_samples, find_shards
from trainer.distributed import (
    DistEnv,
    all_gather_scalars,
    any_rank,
    dist_env_from_environ,
    init_process_group,
    pick_device,
)
from trainer.errors import (
    BackendUnavailableError,
    CheckpointError,
    ConfigError,
    DataError,
    DiskFullError,
    FinalSaveError,
    TrainerError,
)
from trainer.evaluate import evaluate
from trainer.memory import choose_micro_batch
from trainer.mlperf_log import MLPerfLog, open_log
from trainer.model import (
    VARLEN_NEEDS,
    BertForPreTraining,
    CudnnVarlenAttention,
    FlashVarlenAttention,
    flash_device,
    graph_per_shape,
    load_hf_state_dict,
    pretraining_loss,
    read_state_dict,
    resolve_attention,
    varlen_runs,
)
from trainer.noise_probe import NormProbe, PendingNorms
from trainer.noise_scale import NOT_MEASURED, NoiseScale, NoiseScaleEstimator
from trainer.optim import apex_optimizers, build_optimizer
from trainer.precision import autocast, resolve_autocast
from trainer.report import NullReporter, Reporter
from trainer.result import TrainResult, TrainStatus
from trainer.schedule import build_scheduler, idle_steps, mlperf_lr


def log(env: DistEnv, message: str) -> None:
    if env.is_main:
        print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- components


def check_attention(cfg: TrainerConfig, device: torch.device, autocast: torch.dtype | None) -> None:
    """`model.attention: varlen` only where the kernel runs, said before any work (the model would say it later)."""
    if cfg.model.attention != "varlen":
        return
    head_dim = cfg.model.head_dim
    if not varlen_runs(flash_device(device), autocast is not None, head_dim):
        gpu = device.type
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            gpu = f"{torch.cuda.get_device_name(device)}, compute capability {major}.{minor}"
        raise ConfigError(
            f"model.attention: varlen needs {VARLEN_NEEDS} (this run: {gpu}, "
            f"{precision_name(autocast)}, heads of {head_dim}); use "
            "auto, jagged, packed or padded"
        )


def check_varlen_kernel(cfg: TrainerConfig, device: torch.device, autocast: torch.dtype | None) -> None:
    """`model.varlen_kernel: cudnn` only where the varlen attention runs and cuDNN's kernel computes it on the packed
    stream, said before any work: a trial of it against the flash kernel, and as training and evaluation call it
    (`try_cudnn_attention`)."""
    if cfg.model.varlen_kernel != "cudnn":
        return
    kernel = resolve_attention(cfg.model.attention, flash_device(device), autocast is not None, cfg.model.head_dim,
                               gpu=device.type == "cuda")  # fmt: skip
    if kernel != "varlen":
        raise ConfigError(f"model.varlen_kernel: cudnn is a kernel of the varlen attention, which needs {VARLEN_NEEDS} "
                          f"(this run: {device.type}, {precision_name(autocast)}: attention {kernel}); set "
                          "model.varlen_kernel: flash")  # fmt: skip
    try:
        try_cudnn_attention(device, cfg.model.num_attention_heads, cfg.model.head_dim, autocast,
                            cfg.model.attention_probs_dropout_prob)  # fmt: skip
    except Exception as e:  # a PyTorch build or cuDNN version whose attention takes no packed stream, or miscomputes
        raise ConfigError(f"model.varlen_kernel: cudnn: cuDNN's attention failed its trial on a packed stream here "
                          f"({type(e).__name__}: {error_line(e)}); set model.varlen_kernel: flash"
                          ) from None  # fmt: skip


def try_cudnn_attention(device: torch.device, heads: int, head_dim: int, dtype: torch.dtype, dropout_p: float) -> None:
    """cuDNN's varlen attention (`CudnnVarlenAttention`) on sequences of 3 and 5 tokens whose query, key and value are
    strided views of one [T, 3, heads, head_dim] tensor, as the model gives them: without dropout, its output and
    gradients against the flash kernel's (within 2 % of their largest: bf16 rounding; a kernel that placed the second
    sequence wrongly would be far off), its output under no_grad (evaluation's call) too, and with the run's attention
    dropout forward and backward; waiting for the device. Raises where a launch fails or the outputs differ. The run's
    random state is left as it was."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        qkv = torch.randn(8, 3, heads, head_dim, device=device, dtype=dtype, requires_grad=True)
        cu_seqlens = torch.tensor([0, 3, 8], device=device, dtype=torch.int32)

        def attend(kernel, p: float, grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
            with torch.set_grad_enabled(grad):
                q, k, v = qkv.unbind(1)
                out = kernel.apply(q, k, v, cu_seqlens, 5, p).float()
                return out, torch.autograd.grad(out.square().sum(), qkv)[0].float() if grad else None

        flash, flash_grad = attend(FlashVarlenAttention, 0.0)
        cudnn, cudnn_grad = attend(CudnnVarlenAttention, 0.0)
        evaluated, _ = attend(CudnnVarlenAttention, 0.0, grad=False)
        for what, ours, reference in (("output", cudnn, flash), ("gradient", cudnn_grad, flash_grad),
                                      ("output under no_grad", evaluated, flash)):  # fmt: skip
            off = ((ours - reference).abs().max() / reference.abs().max()).item()
            if not off <= 2e-2:
                raise ValueError(f"its {what} differs from the flash kernel's by {off:.2g} of the largest value")
        if dropout_p > 0:
            attend(CudnnVarlenAttention, dropout_p)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a kernel's fault surfaces here


def precision_name(autocast: torch.dtype | None) -> str:
    """fp32, bf16 or fp16: the training precision, as the start-up line and the refusals say it."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast, "fp32")


def check_fused_kernels(cfg: TrainerConfig, device: torch.device, autocast: torch.dtype | None) -> None:
    """`model.fused_norm` and `model.fused_gelu` only where their Triton kernels run, said before any work: on a CUDA
    GPU with triton, and where a trial launch of them compiles and runs (`trainer.fused.trial`)."""
    on = [key for key in ("fused_norm", "fused_gelu") if getattr(cfg.model, key)]
    if not on:
        return
    from trainer.fused import KERNELS_NEED, kernels_run  # (imports Triton)
    from trainer.fused.trial import try_kernels

    keys, one = " and ".join(f"model.{key}" for key in on), len(on) == 1
    if not kernels_run(device):
        raise ConfigError(f"{keys} need{'s' if one else ''} {KERNELS_NEED} (this run: {device.type}); "
                          f"set {'it' if one else 'them'} false")  # fmt: skip
    try:
        try_kernels(device, cfg.model, autocast)
    except Exception as e:  # a launcher Triton cannot build, a GPU it cannot compile for
        raise ConfigError(f"{keys}: the Triton kernels do not run here ({type(e).__name__}: {error_line(e)}); set "
                          f"{'it' if one else 'them'} false") from None  # fmt: skip


def error_line(e: Exception) -> str:
    """The line of an exception's text that says what went wrong: Triton's compile errors carry it in
    `error_message` (their text starts with the source position), others in their last non-empty line."""
    text = getattr(e, "error_message", None) or str(e)
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return (lines[-1] if lines else type(e).__name__)[:300]


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


def accumulation_steps(cfg: TrainerConfig, env: DistEnv) -> int:
    if cfg.batch.micro_batch_size == "auto":  # chosen later (resolve_micro_batch) among the divisors of a rank's batch
        if cfg.batch.global_batch_size % env.world_size:
            raise ConfigError(f"batch.global_batch_size ({cfg.batch.global_batch_size}) must be a multiple of the "
                              f"world size ({env.world_size})")  # fmt: skip
        return 0
    per_step = cfg.batch.micro_batch_size * env.world_size
    if cfg.batch.global_batch_size % per_step:
        raise ConfigError(
            f"batch.global_batch_size ({cfg.batch.global_batch_size}) must be a multiple of "
            f"batch.micro_batch_size x world size ({cfg.batch.micro_batch_size} x {env.world_size})"
        )
    return cfg.batch.global_batch_size // per_step


def check_train_set(cfg: TrainerConfig) -> None:
    """A training set smaller than the global batch is refused (`ConfigError`): every step would train all of it, a
    smaller batch than the one configured, which is the number runs are compared by. Every rank loads the whole of
    data.train (the sampler deals it out), so every rank counts the same and refuses alike. Shards that cannot be
    counted are left to the data checks, which name what is wrong with them, as is an empty set."""
    try:
        sequences = count_samples(cfg.data.train)
    except DataError:
        return
    batch = cfg.batch.global_batch_size
    if 0 < sequences < batch:
        raise ConfigError(
            f"data.train: {cfg.data.train} holds {sequences:,} sequence{'s' * (sequences != 1)}, fewer than the "
            f"global batch of {batch:,} (batch.global_batch_size): every step would train them all, a smaller batch "
            f"than configured; set batch.global_batch_size to at most {sequences:,}, or give data.train more data"
        )


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
    if chosen is not None:
        if cfg.batch.global_batch_size % (chosen * env.world_size):
            raise ConfigError(
                f"batch.micro_batch_size auto resumes with checkpoint {path}'s micro-batch, {chosen}, which does not "
                f"divide this run's batch (batch.global_batch_size {cfg.batch.global_batch_size} over "
                f"{env.world_size} rank(s)): resume with a global batch that {chosen} x {env.world_size} divides, "
                "or start without the checkpoint (checkpoint.resume: false)"
            )
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


# The keys a checkpoint's run must share with the run that resumes it: they shape the model's tensors and the
# optimizer's state (another vocabulary, width, depth, table or optimizer would not load, or would load wrongly), and
# the order of the data (another seed, shuffling or balancing would go on in another order from the position it
# resumes at, which counts micro-batches of the epoch's plan: samples would be trained twice and others not at all).
RESUME_KEYS = (
    "seed",
    "data.shuffle",
    "balance.method",
    "model.vocab_size",
    "model.pad_vocab_to_multiple_of",
    "model.hidden_size",
    "model.num_hidden_layers",
    "model.num_attention_heads",
    "model.intermediate_size",
    "model.max_position_embeddings",
    "model.type_vocab_size",
    "optimizer.name",
)
# And those that order the data only where balance.method deals the sequences out by their length (stratified,
# local_presort): the bins, and the lengths themselves (data.max_seq_length cuts them). Under `none` an epoch's
# plan is a permutation of the samples' count alone, which these do not change.
RESUME_KEYS_BINNED = ("balance.bins", "data.max_seq_length")
_ABSENT = object()  # a key a checkpoint's config does not have (written before the key existed)


def refuse_before_work(cfg: TrainerConfig) -> None:
    """What the config names and cannot work, refused before any work (`ConfigError`, exit code 2) and before any file
    of the run is made: optimizer.impl apex where apex does not import, what this machine cannot run as configured (a
    batch that does not split over micro-batches and ranks, a training set smaller than the batch, a precision or
    attention kernel it lacks), a log.jsonl or log.mlperf that is a directory or under a file, a checkpoint.dir that
    is a file or cannot be written (it is made here where missing, last), a model.init_checkpoint that does not
    exist, and a checkpoint to resume from that cannot be read, whose weights the model does not take
    (`check_saved_model`), or that another model, optimizer, data order (seed,
    data.shuffle, balance.method; balance.bins and data.max_seq_length where the method bins the sequences by length)
    or micro-batch wrote, or that another number of ranks saved where this run's plan of the epoch does not reach the
    same samples (`resumed_batch`); and a schedule.total_steps that ends before a run nothing can stop sooner
    (`check_decay_horizon`)."""
    check_decay_horizon(cfg)
    if cfg.optimizer.impl == "apex":  # the optimizer is built after the data and the model
        try:
            apex_optimizers()
        except BackendUnavailableError as e:
            raise ConfigError(str(e)) from None
    init = cfg.model.init_checkpoint
    if init and not Path(init).is_file():
        what = "is a directory" if Path(init).is_dir() else "does not exist"
        raise ConfigError(
            f"model.init_checkpoint: {init} {what}; give an HF state dict (.bin/.pt) or .safetensors file, or none"
        )
    env = dist_env_from_environ()
    device = pick_device(cfg.device, env)
    accumulation_steps(cfg, env)  # a batch that does not split
    check_train_set(cfg)  # a training set smaller than the batch
    autocast = resolve_autocast(cfg, device)
    check_attention(cfg, device, autocast)  # a precision or attention kernel it lacks
    check_varlen_kernel(cfg, device, autocast)  # cuDNN's varlen attention where it does not run
    check_fused_kernels(cfg, device, autocast)  # Triton kernels that do not run here
    for key, path in (("log.jsonl", cfg.log.jsonl), ("log.mlperf", cfg.log.mlperf)):
        if path is not None and env.is_main:
            check_output_file(key, Path(path))
    if cfg.checkpoint.dir is not None:  # after the other refusals: it makes the directory
        check_checkpoint_dir(Path(cfg.checkpoint.dir), env.is_main)
    path = latest_checkpoint(cfg.checkpoint.dir) if cfg.checkpoint.resume else None
    if path is None:
        return
    try:
        check_intact(path)
        saved, mine = saved_config(path), cfg.model_dump(mode="json")
        state, ranks = saved_position(path)
    except CheckpointError as e:
        raise ConfigError(f"checkpoint.dir: cannot read {path}, the checkpoint a resume starts from "
                          f"({e.__cause__ or e}); {_earlier_save(path)}") from None  # fmt: skip
    differ = []
    for key in RESUME_KEYS + (RESUME_KEYS_BINNED if mine["balance"]["method"] != "none" else ()):
        *section, name = key.split(".")
        there = (saved.get(section[0]) or {}).get(name, _ABSENT) if section else saved.get(name, _ABSENT)
        here = mine[section[0]][name] if section else mine[name]
        if there is not _ABSENT and there != here:
            differ.append(f"{key} {_yaml_text(there)} there, {_yaml_text(here)} here")
    if differ:
        raise ConfigError(
            f"checkpoint.dir: {path} was written by another model, optimizer, seed or data order "
            f"({'; '.join(differ)}), so it cannot be resumed: set those keys as the checkpoint has them, or start "
            "afresh in another checkpoint.dir (or with checkpoint.resume: false, which writes over the checkpoints "
            "there)"
        )
    check_saved_model(cfg, path)
    micro, there = mine["batch"]["micro_batch_size"], (saved.get("batch") or {}).get("micro_batch_size")
    if isinstance(micro, int) and isinstance(there, int) and micro != there:  # auto keeps the checkpoint's
        raise ConfigError(
            f"batch.micro_batch_size: {path} was trained with {there}, this run has {micro}: the position it resumes "
            f"from counts micro-batches; set {there} (or auto, which keeps the checkpoint's), or start afresh in "
            "another checkpoint.dir (or with checkpoint.resume: false, which writes over the checkpoints there)"
        )
    micro = micro if isinstance(micro, int) else there  # auto resumes with the checkpoint's
    if not isinstance(micro, int) or finished_status(cfg, state) is not None:  # a finished run trains nothing more
        return
    try:
        sequences = count_samples(cfg.data.train)
    except DataError:  # the data checks say what is wrong with the shards
        return
    resumed_batch(cfg, path, state, ranks, dist_env_from_environ().world_size, sequences, micro)


def check_saved_model(cfg: TrainerConfig, path: Path) -> None:
    """`ConfigError` for a checkpoint whose model weights this config's model cannot take (a damaged file that reads,
    or one other code wrote with the same config): their names and shapes against the model's, built on the meta
    device (shapes, no memory), the checkpoint memory-mapped (no weights read)."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception:  # noqa: BLE001 - read just before (saved_config): the load of the resume says what it is
        return
    weights = payload.get("model") if isinstance(payload, dict) else None
    if not isinstance(weights, dict):
        what = "it has no 'model' entry"
    else:
        with torch.device("meta"):
            own = BertForPreTraining(cfg.model.model_copy(update={"compile": False})).state_dict()
        missing, extra = [k for k in own if k not in weights], [k for k in weights if k not in own]
        shapes = [f"{k!r} is {_shape(weights[k])} there, {_shape(own[k])} in this run's model"
                  for k in own if k in weights and _shape(weights[k]) != _shape(own[k])]  # fmt: skip
        problems = []
        if missing:
            problems.append(f"it lacks {len(missing)} of the model's tensors, e.g. {missing[0]!r}")
        if extra:
            problems.append(f"it has {len(extra)} the model has not, e.g. {extra[0]!r}")
        if shapes:
            problems.append(shapes[0] + (f" (and {len(shapes) - 1} more of another shape)" if len(shapes) > 1 else ""))
        if not problems:
            return
        what = "; ".join(problems)
    raise ConfigError(f"checkpoint.dir: {path} does not fit this run ({what}); {_earlier_save(path)}")


def _shape(value: Any) -> str:
    return str(list(value.shape)) if isinstance(value, torch.Tensor) else f"a {type(value).__name__}, not a tensor"


def resumed_batch(cfg: TrainerConfig, path: Path, state: TrainState, saved_world_size: int | None, world_size: int,
                  sequences: int, micro: int) -> int:  # fmt: skip
    """The micro-batch of its epoch at which a run on `world_size` ranks resumes checkpoint `path`, saved on
    `saved_world_size` (`saved_world_size`; None, a checkpoint that does not say, is taken as saved on this run's
    number): where this run's plan of the epoch has trained the samples the saved run had (`resume_batch`), the
    saved position itself on as many ranks. `ConfigError` where no position of this run's plan has, saying what to
    do."""
    saved = saved_world_size or world_size
    method, done = cfg.balance.method, state.batch_in_epoch
    batch = resume_batch(method, sequences, micro, saved, done, world_size)
    if batch is not None:
        return batch
    ranks = f"{saved} rank{'s' * (saved != 1)}"
    on_saved = f"resume on {ranks} (torchrun --nproc-per-node {saved}{', or one process' * (saved == 1)})"
    afresh = ("start afresh in another checkpoint.dir (or with checkpoint.resume: false, which writes over the "
              "checkpoints there)")  # fmt: skip
    if method != "none":
        steps = steps_per_epoch(sequences, micro, saved)
        raise ConfigError(
            f"checkpoint.dir: {path} was saved on {ranks}, this run has {world_size}: balance.method {method} deals "
            f"an epoch's sequences out by length in rounds that the number of ranks decides, so the rest of epoch "
            f"{state.epoch} from where it was saved (micro-batch {done} of {steps} on each rank) would train some of "
            f"its sequences again and others never; {on_saved}, or {afresh}"
        )
    before = _yaml_text((saved_config(path).get("batch") or {}).get("global_batch_size"))
    raise ConfigError(
        f"checkpoint.dir: {path} was saved on {ranks}, {done * saved * micro:,} samples into epoch {state.epoch}, "
        f"which is not a whole number of this run's rounds of a micro-batch a rank ({micro} x {world_size} ranks = "
        f"{world_size * micro} sequences; batch.global_batch_size {before} there, {cfg.batch.global_batch_size} here): "
        f"{on_saved}, or {afresh}"
    )


def _yaml_text(value: Any) -> str:
    """A config value as a config file writes it: `false`, not Python's `False`, `null`, not `None`."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def check_decay_horizon(cfg: TrainerConfig) -> None:
    """schedule.total_steps shorter than the run, where nothing can stop the run sooner (eval.stop_at_target off, no
    budget.max_time_s), is refused (`ConfigError`) when its last steps would train at a learning rate of 0: they
    would change nothing. A step trains at most the global batch, so budget.max_samples takes at least
    ceil(max_samples / global batch) steps (more where an epoch's last step is short: `warn_idle_steps` says so at
    the start). A run that may stop at its target or its time is not refused: it may never get there."""
    total, budget = cfg.schedule.total_steps, cfg.budget
    if total is None or cfg.eval.stop_at_target or budget.max_time_s is not None:
        return
    batch = cfg.batch.global_batch_size
    least = -(-budget.max_samples // batch)
    if idle := idle_steps(cfg.schedule, total, least):
        raise ConfigError(
            f"schedule.total_steps: {total:,} is shorter than the run: budget.max_samples {budget.max_samples:,} at "
            f"batch.global_batch_size {batch:,} takes at least {least:,} optimizer steps, and nothing stops it "
            f"sooner (eval.stop_at_target false, no budget.max_time_s); steps {least - idle + 1:,} to {least:,} "
            f"would train at learning rate 0 (schedule.end_lr) and change nothing: leave schedule.total_steps out "
            f"(the decay then spans the run's own steps), set it to at least {least:,}, or lower budget.max_samples "
            f"to {(least - idle) * batch:,}"
        )


def check_checkpoint_dir(directory: Path, saves: bool) -> None:
    """checkpoint.dir is a directory, not a file; where this rank `saves` (rank 0) one it can write: made where
    missing, and a file written there and removed (a run that trains and then cannot save would lose what it
    trained). `ConfigError` naming it."""
    if where := file_in_the_way(directory):
        raise ConfigError(f"checkpoint.dir: {directory} {where}, not a directory; give a directory (it is made if "
                          "missing)")  # fmt: skip
    if not saves:
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-check-"):
            pass
    except OSError as e:
        raise ConfigError(f"checkpoint.dir: cannot write checkpoints in {directory} ({e.strerror or e}); give a "
                          "directory this user can write") from None  # fmt: skip


def check_output_file(key: str, path: Path) -> None:
    """A file the run writes as it goes (log.jsonl, log.mlperf) is not a directory, nor under a file (its folders are
    made where missing): `ConfigError` naming the key, before any file of the run is made."""
    if path.is_dir():
        raise ConfigError(f"{key}: {path} is a directory; give the path of a file (its folder is made if missing)")
    if where := file_in_the_way(path.parent):
        raise ConfigError(f"{key}: {path}'s folder {path.parent} {where}, not a directory; give a path in a "
                          "directory (it is made if missing)")  # fmt: skip


def _earlier_save(latest: Path) -> str:
    """What to do about an unreadable latest.pt: resume from the newest earlier save that reads, or start afresh."""
    afresh = "set checkpoint.resume: false to start afresh (it writes over the checkpoints there)"
    for older in sorted(latest.parent.glob("ckpt-*.pt"), reverse=True):
        with suppress(OSError):
            if older.samefile(latest):
                continue
        with suppress(CheckpointError):
            check_intact(older)
            samples = saved_state(older).samples
            return (f"{older.name}, saved at {samples:,} samples, reads: copy it over {latest.name} to resume from "
                    f"there, or {afresh}")  # fmt: skip
    return f"no earlier save there reads: {afresh}"


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
    sampler: Any
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
    sampler = build_batch_sampler(
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
    budget_steps = sampler.optimizer_steps(cfg.budget.max_samples, accumulation)
    horizon = cfg.schedule.horizon_samples or cfg.budget.max_samples  # by default the run's own steps
    total_steps = cfg.schedule.total_steps or sampler.optimizer_steps(horizon, accumulation)
    scheduler = build_scheduler(optimizer, cfg.schedule, cfg.optimizer.lr, total_steps)
    probe = None
    if cfg.log.noise_scale and (env.enabled or accumulation > 1):
        probe = NormProbe(env.world_size, device=device)
        if accumulation > 1:  # micro-batches are the small batches, on any number of ranks (exact under any clip)
            probe.watch_micro_batches([p for p in model.parameters() if p.requires_grad])
    clipper = GradientClipper(cfg.clipping, cfg.optimizer.name, model, ddp, scaler, env, probe)
    clips_before_allreduce = cfg.clipping.strategy in ("before_allreduce", "bucketwise")
    if probe is not None and accumulation == 1 and env.world_size > 2 and clips_before_allreduce:
        log(env, f"noise scale: approximate while {cfg.clipping.strategy} clipping bites on {env.world_size} ranks "
                 "(the unclipped average is never formed); accumulate >= 2 micro-batches for an exact one")  # fmt: skip
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


def shape_budgets(
    sampler: Any, train: PretrainingSamples, eval_: PretrainingSamples, eval_batch_size: int, env: DistEnv
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
        raise ConfigError(f"checkpoint.dir: {path} does not fit this run ({what}); {_earlier_save(path)}") from None
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
    restore_rank_rng(payload, run.env.rank, run.env.world_size, run.cfg.seed, state.step)


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
    log(
        run.env,
        f"warning: the learning rate reaches 0 after step {steps - idle:,} ({horizon}), but budget.max_samples "
        f"{cfg.budget.max_samples:,} takes {steps:,} steps: steps {steps - idle + 1:,} to {steps:,} would train at "
        "learning rate 0 and change nothing, unless the run stops sooner (its target, budget.max_time_s)",
    )


def finished_status(cfg: TrainerConfig, state: TrainState) -> TrainStatus | None:
    """How a run that got to `state` ended, when it has nothing left to train under `cfg` (its target reached, or its
    budget spent); None while it has. A finished run's command run again resumes at its end."""
    if state.samples_to_target is not None and cfg.eval.stop_at_target:
        return TrainStatus.REACHED_TARGET
    spent_time = cfg.budget.max_time_s is not None and state.train_time_s >= cfg.budget.max_time_s
    if state.samples >= cfg.budget.max_samples or spent_time:
        return TrainStatus.BUDGET_EXHAUSTED if state.samples_to_target is None else TrainStatus.REACHED_TARGET
    return None


def finished_checkpoint(cfg: TrainerConfig) -> Path | None:
    """The checkpoint this run would resume from, when it is one of a finished run (`finished_status`)."""
    path = latest_checkpoint(cfg.checkpoint.dir) if cfg.checkpoint.resume else None
    return path if path is not None and finished_status(cfg, saved_state(path)) is not None else None


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
        "config": dump_config(run.cfg),
        **({"rng_ranks": rng_ranks} if rng_ranks is not None else {}),
    }
    save_checkpoint(run.cfg.checkpoint.dir, payload, state)


# --------------------------------------------------------------------------- one optimizer step


@dataclass
class StepStats:
    loss_sum: torch.Tensor  # on the device: the step's loss, its micro-batches' shares summed (read back in batches)
    mlm_correct: torch.Tensor  # on the device: masked tokens predicted right
    mlm_count: int
    lr: float  # the learning rate the step ran with
    sequences: int  # this rank
    tokens: int  # this rank
    grad_sq_norms: PendingNorms | None  # (|G_small|², |G_big|²) before any clip, on the device, if measured
    sequences_per_rank: list[float] = field(default_factory=list)  # every rank's sequences this step (the loop's)
    micro_batch_sizes: list[int] = field(default_factory=list)  # this rank's micro-batches' sequences


@dataclass
class Reading:
    """A step's numbers once read back to the host (`read_back`)."""

    step: int
    loss: float  # the step's: MLM per masked token plus NSP per sequence (this rank's)
    mlm_accuracy: float  # on the step's masked tokens
    grad_sq_norms: tuple[float, float] | None  # (|G_small|², |G_big|²) of a measured step
    lr: float  # the learning rate the step ran with


def read_back(pending: list[tuple[int, StepStats]]) -> list[Reading]:
    """The loss, MLM accuracy and noise-scale norms of the steps since the last read, in one device-to-host copy:
    the loop does not wait for the device between steps, only every `log.every_steps` steps, at evaluations and
    at the end."""
    parts = []
    for _, s in pending:
        parts.append(torch.stack([s.loss_sum.double(), s.mlm_correct.double()]))
        if s.grad_sq_norms is not None:
            parts.append(s.grad_sq_norms.values.to(s.loss_sum.device))
    values = torch.cat(parts).tolist()
    readings, at = [], 0
    for step, s in pending:
        (loss, correct), at = values[at : at + 2], at + 2
        norms = None
        if s.grad_sq_norms is not None:
            width = s.grad_sq_norms.values.numel()
            norms, at = s.grad_sq_norms.finish(values[at : at + width]), at + width
        readings.append(Reading(step, loss, correct / max(s.mlm_count, 1), norms, s.lr))
    return readings


def forward_backward(
    run: Run, batch: PackedBatch, mlm_weight: float, nsp_weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch's forward and backward; its share of the step's loss (detached) and its MLM hits."""
    with autocast(run.device, run.autocast):
        loss = pretraining_loss(run.module(batch), batch, mlm_weight, nsp_weight)
    run.scaler.scale(loss.total).backward()
    return loss.total.detach(), loss.mlm_correct


def train_step(run: Run, micro_batches: list, step: int) -> StepStats:
    """Optimizer step number `step` (from 1) over `micro_batches`."""
    run.model.train()
    if run.cfg.model.compile_model and run.device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the last step's CUDA graph outputs may be reused
    measured = run.probe is not None and step % run.cfg.log.noise_scale_every == 0
    if run.probe is not None:
        run.probe.measure(measured)
    batches = [pack_batch(run.train_samples, idx, run.shapes).to(run.device) for idx in micro_batches]
    masked = sum(b.num_masked for b in batches)
    loss_sum = torch.zeros((), device=run.device)
    correct = torch.zeros((), device=run.device)
    sequences = sum(b.num_sequences for b in batches)
    for i, batch in enumerate(batches):
        # Each micro-batch's MLM loss weighed by its share of the step's masked tokens and its NSP loss by its share
        # of the sequences: their sum is the step's loss (MLM over all its masked tokens, NSP over all its
        # sequences), and its gradient the same however the step is split (up to rounding and dropout masks).
        mlm_weight, nsp_weight = batch.num_masked / max(masked, 1), batch.num_sequences / sequences
        probe = micro_batch_probe(run, mlm_weight) if measured else nullcontext()  # MLM's gradient dominates
        with run.clipper.backward_context(last_micro_batch=i == len(batches) - 1), probe:
            loss, ok = forward_backward(run, batch, mlm_weight, nsp_weight)
        loss_sum += loss
        correct += ok
    run.clipper.before_step(run.optimizer)
    grad_sq_norms = run.probe.take() if measured else None
    lr = run.optimizer.param_groups[0]["lr"]  # the scheduler's step below sets the next step's
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return StepStats(
        loss_sum=loss_sum,
        mlm_correct=correct,
        mlm_count=masked,
        lr=lr,
        sequences=sequences,
        tokens=sum(b.num_tokens for b in batches),
        grad_sq_norms=grad_sq_norms,
        micro_batch_sizes=[b.num_sequences for b in batches],
    )


def micro_batch_probe(run: Run, weight: float):
    """With accumulation, the probe measures each micro-batch's gradient (the small batch)."""
    if run.probe is None or run.accumulation == 1:
        return nullcontext()
    return run.probe.micro_batch(weight, run.clipper.loss_scale())


def measure_noise_scale(run: Run, norms: tuple[float, float] | None, stats: StepStats) -> NoiseScale:
    """Feed a step's norms, once read back, to the estimator: small = a micro-batch and big = a rank's batch when
    accumulating, else small = a rank's batch and big = the global batch (DDP). A step whose small batches differ
    in size (an epoch's uneven last step) is not measured: B_small is undefined there."""
    sequences, micro = stats.sequences_per_rank, stats.micro_batch_sizes
    accumulating = run.accumulation > 1
    if norms is None or min(sequences) != max(sequences) or (accumulating and min(micro) != max(micro)):
        return NoiseScale(run.noise_scale.value(), None, None, None, None) if run.probe else NOT_MEASURED
    if accumulating:  # the micro-batches' own size: an epoch's last step may have fewer of them
        return run.noise_scale.update(*norms, micro[0], sequences[0])
    return run.noise_scale.update(*norms, sequences[0], sum(sequences))


# --------------------------------------------------------------------------- the loop


def epoch_steps(run: Run, state: TrainState):
    """Yield, one per optimizer step from the current position on, this rank's micro-batches (index lists) and
    every rank's [tokens, sequences] in the step, known from the epoch's plan: no rank waits for another's count."""
    while True:
        micro = list(run.sampler.batches(state.epoch))[state.batch_in_epoch :]
        loads = run.sampler.loads(state.epoch)[state.batch_in_epoch :]
        for start in range(0, len(micro), run.accumulation):
            yield micro[start : start + run.accumulation], loads[start : start + run.accumulation].sum(axis=0).tolist()
        state.epoch += 1
        state.batch_in_epoch = 0


def run_eval(run: Run, state: TrainState, elapsed: float) -> bool:
    """Evaluate, record, and say whether the target is reached."""
    run.mlperf.eval_start(state.samples)
    result = evaluate(run.model, run.eval_samples, run.cfg.eval.batch_size, run.device, run.env, run.autocast,
                      run.eval_shapes)  # fmt: skip
    run.mlperf.eval_stop(state.samples, result.mlm_accuracy)
    record = {"samples": state.samples, "step": state.step, "time_s": round(elapsed, 3), **asdict(result)}
    state.evals.append(record)
    state.best_mlm_accuracy = max(state.best_mlm_accuracy, result.mlm_accuracy)
    reached = result.mlm_accuracy >= run.cfg.eval.target_mlm_accuracy
    if reached and state.samples_to_target is None:
        state.samples_to_target, state.time_to_target_s = state.samples, elapsed
    run.reporter.intermediate({"event": "eval", **record})
    log(
        run.env,
        f"eval @ {state.samples:,} samples: mlm_accuracy {result.mlm_accuracy:.4f} "
        f"(target {run.cfg.eval.target_mlm_accuracy}), nsp_accuracy {result.nsp_accuracy:.3f}",
    )
    return reached


def progress(
    run: Run, state: TrainState, window: dict[str, float], reading: Reading, imbalance: float, noise: NoiseScale
) -> None:
    seconds = max(time.perf_counter() - window["t0"] - window["paused"], 1e-9)  # training only: no eval, no save
    record = {
        "event": "progress",
        "step": state.step,
        "samples": state.samples,
        "loss": reading.loss,
        "train_mlm_accuracy": reading.mlm_accuracy,
        "lr": reading.lr,  # the rate of the step whose loss this is (the optimizer already holds the next one's)
        "sequences_per_s": window["sequences"] / seconds,
        "tokens_per_s": window["tokens"] / seconds,
        "token_imbalance": imbalance,
        **noise.record(),
    }
    run.reporter.intermediate(record)
    log(
        run.env,
        f"step {state.step:>6} | samples {state.samples:>9,} | loss {reading.loss:7.4f} | "
        f"mlm_acc {record['train_mlm_accuracy']:.3f} | lr {record['lr']:.2e} | "
        f"{record['sequences_per_s']:8.1f} seq/s | {record['tokens_per_s']:10,.0f} tok/s | "
        f"imbalance {imbalance:.3f}" + (f" | noise scale {noise.noise_scale:,.0f}" if noise.noise_scale else ""),
    )


def read_pending(run: Run, pending: list[tuple[int, StepStats]]) -> tuple[list[Reading], NoiseScale]:
    """Read back the steps since the last read and feed their noise-scale norms to the estimator, in step order (it
    smooths); the estimate after the last of them is returned with the readings."""
    readings = read_back(pending)
    noise = NOT_MEASURED
    for reading, (_, stats) in zip(readings, pending, strict=True):
        noise = measure_noise_scale(run, reading.grad_sq_norms, stats)
    pending.clear()
    return readings, noise


def loop(run: Run, state: TrainState) -> TrainStatus:
    """Train until a stop condition; returns the final status. A run that fails (out of memory, say) still feeds
    the estimator the norms its last steps measured, so that the checkpoint written after the failure holds them."""
    pending: list[tuple[int, StepStats]] = []  # steps whose loss is still on the device
    try:
        return steps_until_stop(run, state, pending)
    except BaseException:
        if pending:
            with suppress(Exception):  # the device itself may be what failed
                read_pending(run, pending)
        raise


def new_window() -> dict[str, float]:
    """What a progress line's throughput is over: the sequences and tokens trained since the last line, and the
    seconds since then less those spent evaluating and saving checkpoints (`paused`)."""
    return {"t0": time.perf_counter(), "paused": 0.0, "sequences": 0.0, "tokens": 0.0}


def steps_until_stop(run: Run, state: TrainState, pending: list[tuple[int, StepStats]]) -> TrainStatus:
    cfg = run.cfg
    start = time.perf_counter() - state.train_time_s
    window = new_window()
    if (finished := finished_status(cfg, state)) is not None:  # resumed at the end of a finished run
        return finished
    for micro_batches, per_rank in epoch_steps(run, state):
        run.mlperf.training(state.samples, state.next_eval_samples)
        stats = train_step(run, micro_batches, state.step + 1)
        tokens, sequences = [r[0] for r in per_rank], [r[1] for r in per_rank]
        assert (tokens[run.env.rank], sequences[run.env.rank]) == (stats.tokens, stats.sequences), "plan != batches"
        state.step += 1
        state.batch_in_epoch += len(micro_batches)
        state.samples += int(sum(sequences))
        state.tokens += int(sum(tokens))
        state.train_time_s = time.perf_counter() - start
        window["sequences"] += sum(sequences)
        window["tokens"] += sum(tokens)
        stats.sequences_per_rank = sequences
        pending.append((state.step, stats))
        out_of_samples = state.samples >= cfg.budget.max_samples
        out_of_time = cfg.budget.max_time_s is not None and state.train_time_s >= cfg.budget.max_time_s  # my clock
        every = cfg.checkpoint.every_samples
        checkpoint_due = every and state.samples // every != (state.samples - int(sum(sequences))) // every
        logged = state.step % cfg.log.every_steps == 0
        read_due = logged or out_of_samples or checkpoint_due or state.samples >= state.next_eval_samples
        if read_due or (out_of_time and not run.env.enabled):  # the same steps on every rank (one process: also time)
            readings, noise = read_pending(run, pending)
            bad = next((r for r in readings if not math.isfinite(r.loss)), None)
            # Decisions that must not split the ranks: their clocks differ, and a NaN may show on one rank first
            out_of_time, diverged = any_rank([out_of_time, bad is not None], run.device, run.env)
            if logged or diverged or out_of_samples or out_of_time:  # the last step is reported too
                imbalance = max(tokens) / max(sum(tokens) / len(tokens), 1e-9)
                progress(run, state, window, readings[-1], imbalance, noise)
                window = new_window()
            if diverged:
                what = f"loss is {bad.loss} at step {bad.step}" if bad else "another rank's loss is not finite"
                log(run.env, f"{what} (read at step {state.step}): diverged")
                return TrainStatus.DIVERGED
        else:
            out_of_time = False  # several ranks: the time budget is decided together, where they read back
        out_of_budget = out_of_samples or out_of_time
        if state.samples >= state.next_eval_samples or out_of_budget:
            while state.next_eval_samples <= state.samples:
                state.next_eval_samples += cfg.eval.every_samples
            paused = time.perf_counter()
            reached = run_eval(run, state, paused - start)
            window["paused"] += time.perf_counter() - paused
            if reached and cfg.eval.stop_at_target:
                return TrainStatus.REACHED_TARGET
            state.train_time_s = time.perf_counter() - start
        if checkpoint_due:
            paused = time.perf_counter()
            checkpoint(run, state)
            window["paused"] += time.perf_counter() - paused
        if out_of_budget:  # with eval.stop_at_target off, a run that reached the target on the way says so
            return TrainStatus.BUDGET_EXHAUSTED if state.samples_to_target is None else TrainStatus.REACHED_TARGET
    raise AssertionError("unreachable: epoch_steps never ends")


def final_result(
    run: Run, state: TrainState, status: TrainStatus, reason: str | None, error: str | None = None
) -> TrainResult:
    seconds = max(state.train_time_s, 1e-9)
    return TrainResult(
        status=status,
        reason=reason,
        samples=state.samples,
        steps=state.step,
        samples_to_target=state.samples_to_target,
        time_to_target_s=state.time_to_target_s,
        best_mlm_accuracy=state.best_mlm_accuracy if state.evals else None,
        final_mlm_accuracy=state.evals[-1]["mlm_accuracy"] if state.evals else None,
        train_time_s=state.train_time_s,
        sequences_per_s=state.samples / seconds,
        tokens_per_s=state.tokens / seconds,
        world_size=run.env.world_size,
        global_batch_size=run.cfg.batch.global_batch_size,
        micro_batch_size=run.cfg.batch.micro_batch_size,
        target_mlm_accuracy=run.cfg.eval.target_mlm_accuracy,
        error=error,
    )


def out_of_memory(error: BaseException) -> bool:
    """CUDA's out-of-memory error, Python's, or the CPU allocator's (a RuntimeError that says so)."""
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(error)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or container stopping the job), raised where the run is, as Ctrl-C is: the run ends as
    interrupted, with its final record, and the same command resumes it (`python -m trainer` installs the handler)."""


def crash_reason(error: BaseException) -> str:
    """The final record's reason for an error the trainer did not expect: its type and message, one line."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message[:500]}" if message else type(error).__name__


def failed_before_training(cfg: TrainerConfig, env: DistEnv, reporter: Reporter, error: TrainerError | str,
                kind: str = "data") -> TrainResult:  # fmt: skip
    """The result of a run whose data (the shards, or model.init_checkpoint's weights) was refused before any step:
    failed, with the error as its reason and "data" as its kind (not the hyperparameters' fault); or, of `kind`
    "oom", one whose model and data did not fit the device's memory."""
    result = TrainResult(
        status=TrainStatus.FAILED,
        reason=str(error),
        world_size=env.world_size,
        global_batch_size=cfg.batch.global_batch_size,
        micro_batch_size=cfg.batch.micro_batch_size if cfg.batch.micro_batch_size != "auto" else None,
        target_mlm_accuracy=cfg.eval.target_mlm_accuracy,
        error=kind,
    )
    if env.is_main:
        reporter.final(result)
    return result


def train(cfg: TrainerConfig, reporter: Reporter) -> TrainResult:
    """Run one training job as configured; returns (and reports) the final result."""
    refuse_before_work(cfg)
    env = dist_env_from_environ()
    device = pick_device(cfg.device, env)
    init_process_group(env, device)
    try:  # shards that are not there: the MLPerf log (which opening replaces) is left as it was
        for spec, key in ((cfg.data.train, "data.train"), (cfg.data.eval, "data.eval")):
            find_shards(spec, key)
    except DataError as e:
        return failed_before_training(cfg, env, reporter, e)
    if (done := finished_checkpoint(cfg)) is not None:  # nothing to train: the run's own MLPerf log stays as it is
        log(env, f"{done} is the checkpoint of a finished run: nothing is left to train (its MLPerf log is kept)")
        mlperf = MLPerfLog(cfg, None)
    else:
        mlperf = open_log(cfg, env, device)  # MLPerf's init_start and submission keys, when log.mlperf names a file
    try:
        run = build_run(cfg, env, device, reporter, mlperf)
    except (DataError, CheckpointError) as e:  # bad data (or initial weights) is refused before the first step, as a
        mlperf.close()  # result of its own
        return failed_before_training(cfg, env, reporter, e)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:  # a model too large for the device, likewise
        mlperf.close()
        if not out_of_memory(e):
            raise
        return failed_before_training(
            cfg, env, reporter, f"out of memory before the first step: {crash_reason(e)}", "oom"
        )
    state = restore(run)
    mlperf.run_start(run.accumulation, run.total_steps, run.train_samples, run.eval_samples)
    log(
        env,
        f"training BERT ({sum(p.numel() for p in run.model.parameters()):,} parameters) on {device} x "
        f"{env.world_size}, global batch {cfg.batch.global_batch_size} = {run.cfg.batch.micro_batch_size} x "
        f"{run.accumulation} accumulation x {env.world_size} ranks, {cfg.optimizer.name}, "
        f"{clipping_summary(cfg, run.clipper)}, balance {cfg.balance.method}; "
        f"{execution(cfg, device, run.autocast, run.accumulation)}",
    )
    if run.shapes is not None:
        log(env, fixed_shapes_line(run))
    warn_long_warmup(run)
    warn_idle_steps(run)
    status, reason, error = TrainStatus.FAILED, None, None
    try:
        status = loop(run, state)
        reason = "loss became NaN or inf" if status is TrainStatus.DIVERGED else None
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            reason, error = crash_reason(e), "crash"
            raise
        reason, error = f"out of memory: {e}", "oom"
    except TrainerError as e:
        kinds = {DataError: "data", DiskFullError: "disk_full"}
        reason, error = str(e), next((k for t, k in kinds.items() if isinstance(e, t)), "crash")
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: reported, and raised on with where the run was (the CLI
        what = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"  # says what to do)
        reason, error = f"interrupted ({what}) at step {state.step}, {state.samples:,} samples", "interrupted"
        raise type(e)(reason) from None
    except Exception as e:  # a bug, or a peer rank gone (gloo/NCCL): the final record says what, the traceback where
        reason, error = crash_reason(e), "crash"
        raise
    finally:
        result = final_result(run, state, status, reason, error)
        run.reporter.final(result)
        mlperf.run_stop(result)
    if status is not TrainStatus.DIVERGED:  # its weights are not finite: the last checkpoint before stays the latest
        try:
            checkpoint(run, state, every_rank=status is not TrainStatus.FAILED)  # a failed rank may not get here
        except KeyboardInterrupt as e:  # after the final record: the message says so, the CLI how to go on
            raise type(e)(final_save_interrupted(cfg, e, result)) from None
        except CheckpointError as e:  # a full disk: the result stands, the CLI says what was not saved
            raise FinalSaveError(f"the run ended ({result.status.value}) and its final record is written, but its "
                                 f"final checkpoint was not saved: {e}; {kept_checkpoint(cfg)} stays the latest",
                                 result) from None  # fmt: skip
    return result


def final_save_interrupted(cfg: TrainerConfig, e: KeyboardInterrupt, result: TrainResult) -> str:
    what = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"
    return (f"interrupted ({what}) while the final checkpoint was saved, after the run ended ({result.status.value});"
            f" {kept_checkpoint(cfg)} stays the latest")  # fmt: skip


def kept_checkpoint(cfg: TrainerConfig) -> str:
    """The latest checkpoint of checkpoint.dir, in words, for a message about a final save that did not happen."""
    latest = latest_checkpoint(cfg.checkpoint.dir)
    try:
        return f"the checkpoint at {saved_state(latest).samples:,} samples" if latest else "no checkpoint"
    except CheckpointError:  # what the message says must not replace the stop
        return f"{latest}, which does not read,"
