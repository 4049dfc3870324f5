"""What a run refuses before any work: the config checked against this machine, its data and its checkpoint.

`refuse_before_work` raises `ConfigError` (exit code 2) before any file of the run is made, for what the config
names and cannot work: a batch that does not split over micro-batches and ranks, a training set smaller than the
batch, a precision or kernel this machine lacks (each kernel tried once where it could fail), a log or checkpoint
path that cannot be written, and a checkpoint to resume that another model, optimizer, data order or number of ranks
wrote. Each check says what to set instead.
"""

from __future__ import annotations

import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any

import torch

from trainer.attention import (
    VARLEN_NEEDS,
    CudnnVarlenAttention,
    FlashVarlenAttention,
    flash_device,
    resolve_attention,
    varlen_runs,
)
from trainer.balance import resume_batch, steps_per_epoch
from trainer.checkpoint import (
    LATEST,
    TrainState,
    check_intact,
    finished_status,
    latest_checkpoint,
    saved_config,
    saved_position,
    saved_state,
)
from trainer.config import TrainerConfig, file_in_the_way, refuse_unread
from trainer.data.shards import count_samples
from trainer.distributed import DistEnv, dist_env_from_environ, pick_device
from trainer.errors import BackendUnavailableError, CheckpointError, ConfigError, DataError, error_line
from trainer.model import BertForPreTraining
from trainer.optim import apex_optimizers
from trainer.precision import precision_name, resolve_autocast
from trainer.schedule import idle_steps

# --------------------------------------------------------------------------- kernels this machine runs


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


# --------------------------------------------------------------------------- the batch and the data


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


# --------------------------------------------------------------------------- the whole check; resuming


# The keys a checkpoint's run must share with the run that resumes it: they shape the model's tensors and the
# optimizer's state (another vocabulary, width, depth, table or optimizer would not load, or would load wrongly), and
# the order of the data (another seed, shuffling or balancing would go on in another order from the position it
# resumes at, which counts micro-batches of the epoch's plan: samples would be trained twice and others not at all),
# the global batch (the schedule and the position count its steps: a larger batch reached the end of its
# shorter schedule at once, and trained the rest of its budget at learning rate 0), and the target (samples to
# target are counted at the evaluation that first reaches it: a lower one that earlier evaluations passed would
# never be seen reached, and a finished run's record would name it beside the old outcome).
RESUME_KEYS = (
    "seed",
    "batch.global_batch_size",
    "eval.target_mlm_accuracy",
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
    (`check_decay_horizon`); and settings the run would not read (`unread_settings`)."""
    refuse_unread(cfg)
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
    check_resume(cfg)


def check_resume(cfg: TrainerConfig) -> None:
    """The checkpoint a resume starts from, where there is one, refused when it cannot be read, another model,
    optimizer or data order wrote it, its weights do not fit the model, or this run's ranks and micro-batch do not
    reach the samples it saved (`resumed_batch`)."""
    path = latest_checkpoint(cfg.checkpoint.dir) if cfg.checkpoint.resume else None
    if path is None:
        if (
            cfg.checkpoint.resume
            and cfg.checkpoint.dir
            and (saves := sorted(Path(cfg.checkpoint.dir).glob("ckpt-*.pt")))
        ):
            # saves without latest.pt (removed, or a copy that left it out): a fresh start would write over them
            raise ConfigError(
                f"checkpoint.dir: {cfg.checkpoint.dir} holds {len(saves)} checkpoint(s), the newest {saves[-1].name}, "
                f"but no {LATEST}, which a resume starts from: to resume from the newest, `ln -f {saves[-1]} "
                f"{Path(cfg.checkpoint.dir) / LATEST}`; to start afresh, give another checkpoint.dir (or "
                "checkpoint.resume: false, which writes over the checkpoints there)"
            )
        return
    try:
        check_intact(path)
        saved, mine = saved_config(path), cfg.model_dump(mode="json")
        state, ranks = saved_position(path)
    except CheckpointError as e:
        raise ConfigError(f"checkpoint.dir: cannot read {path}, the checkpoint a resume starts from "
                          f"({e.__cause__ or e}); {earlier_save(path)}") from None  # fmt: skip
    if differ := resume_keys_that_differ(saved, mine):
        raise ConfigError(
            f"checkpoint.dir: {path} was written by another model, optimizer, seed, global batch, target or data order "
            f"({'; '.join(differ)}), so it cannot be resumed: set those keys as the checkpoint has them, or start "
            "afresh in another checkpoint.dir (or with checkpoint.resume: false, which writes over the checkpoints "
            "there)"
        )
    check_saved_model(cfg, path)
    micro, there = mine["batch"]["micro_batch_size"], (saved.get("batch") or {}).get("micro_batch_size")
    world = dist_env_from_environ().world_size
    if isinstance(micro, int) and isinstance(there, int) and micro != there:  # auto keeps the checkpoint's
        ranks = ("" if cfg.batch.global_batch_size % (there * world) == 0 else
                 f" on a number of ranks that {there}-sequence micro-batches divide the batch over (not {world}: "
                 f"batch.global_batch_size {cfg.batch.global_batch_size})")  # fmt: skip
        raise ConfigError(
            f"batch.micro_batch_size: {path} was trained with {there}, this run has {micro}: the position it resumes "
            f"from counts micro-batches; set {there} (or auto, which keeps the checkpoint's){ranks}, or start afresh "
            "in another checkpoint.dir (or with checkpoint.resume: false, which writes over the checkpoints there)"
        )
    if micro == "auto" and isinstance(there, int) and cfg.batch.global_batch_size % (there * world):
        raise ConfigError(
            f"batch.micro_batch_size auto resumes with checkpoint {path}'s micro-batch, {there}, which does not "
            f"divide this run's batch (batch.global_batch_size {cfg.batch.global_batch_size} over {world} rank(s)): "
            f"resume on a number of ranks that {there}-sequence micro-batches divide the batch over (the checkpoint's "
            "run had that), or start afresh in another checkpoint.dir (or with checkpoint.resume: false, which writes "
            "over the checkpoints there)"
        )
    micro = micro if isinstance(micro, int) else there  # auto resumes with the checkpoint's
    if not isinstance(micro, int) or finished_status(cfg, state) is not None:  # a finished run trains nothing more
        return
    try:
        sequences = count_samples(cfg.data.train)
    except DataError:  # the data checks say what is wrong with the shards
        return
    resumed_batch(cfg, path, state, ranks, world, sequences, micro)


def resume_keys_that_differ(saved: dict, mine: dict) -> list[str]:
    """The keys a resume must keep (`RESUME_KEYS`, and `RESUME_KEYS_BINNED` where the data is binned by length) that
    the checkpoint's config `saved` sets otherwise than this run's `mine`, each with both values."""
    differ = []
    for key in RESUME_KEYS + (RESUME_KEYS_BINNED if mine["balance"]["method"] != "none" else ()):
        *section, name = key.split(".")
        there = (saved.get(section[0]) or {}).get(name, _ABSENT) if section else saved.get(name, _ABSENT)
        here = mine[section[0]][name] if section else mine[name]
        if there is not _ABSENT and there != here:
            differ.append(f"{key} {_yaml_text(there)} there, {_yaml_text(here)} here")
    return differ


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
    raise ConfigError(f"checkpoint.dir: {path} does not fit this run ({what}); {earlier_save(path)}")


def _shape(value: Any) -> str:
    return str(list(value.shape)) if isinstance(value, torch.Tensor) else f"a {type(value).__name__}, not a tensor"


def resumed_batch(cfg: TrainerConfig, path: Path, state: TrainState, saved_world_size: int | None, world_size: int,
                  sequences: int, micro: int) -> int:  # fmt: skip
    """The micro-batch of its epoch at which a run on `world_size` ranks resumes checkpoint `path`, saved on
    `saved_world_size` (`saved_world_size`; None, a checkpoint that does not say, is taken as saved on this run's
    number): where this run's plan of the epoch has trained the samples the saved run had (`resume_batch`), the
    saved position itself on as many ranks. `ConfigError` where no position of this run's plan has (a method that
    bins by length, on another number of ranks), saying what to do."""
    saved = saved_world_size or world_size
    method, done = cfg.balance.method, state.batch_in_epoch
    batch = resume_batch(method, sequences, micro, saved, done, world_size)
    if batch is not None:  # always under `none`, whose global batch (a resume key) goes on in whole steps
        return batch
    ranks = f"{saved} rank{'s' * (saved != 1)}"
    on_saved = f"resume on {ranks} (torchrun --nproc-per-node {saved}{', or one process' * (saved == 1)})"
    afresh = ("start afresh in another checkpoint.dir (or with checkpoint.resume: false, which writes over the "
              "checkpoints there)")  # fmt: skip
    steps = steps_per_epoch(sequences, micro, saved)
    raise ConfigError(
        f"checkpoint.dir: {path} was saved on {ranks}, this run has {world_size}: balance.method {method} deals "
        f"an epoch's sequences out by length in rounds that the number of ranks decides, so the rest of epoch "
        f"{state.epoch} from where it was saved (micro-batch {done} of {steps} on each rank) would train some of "
        f"its sequences again and others never; {on_saved}, or {afresh}"
    )


def _yaml_text(value: Any) -> str:
    """A config value as a config file writes it: `false`, not Python's `False`, `null`, not `None`."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


# --------------------------------------------------------------------------- the schedule and the files a run writes


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


def earlier_save(latest: Path) -> str:
    """What to do about an unreadable latest.pt: resume from the newest earlier save that reads, or start afresh."""
    afresh = "set checkpoint.resume: false to start afresh (it writes over the checkpoints there)"
    for older in sorted(latest.parent.glob("ckpt-*.pt"), reverse=True):
        with suppress(OSError):
            if older.samefile(latest):
                continue
        with suppress(CheckpointError):
            check_intact(older)
            samples = saved_state(older).samples
            return (f"{older.name}, saved at {samples:,} samples, reads: `ln -f {older} {latest}` makes it the "
                    f"latest to resume from there (not a copy over {latest.name}, a link to the newest save, which a "
                    f"copy would write over), or {afresh}")  # fmt: skip
    return f"no earlier save there reads: {afresh}"
