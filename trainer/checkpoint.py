"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds the model, optimizer, scheduler and loss-scaler states, the loop position (`TrainState`),
the RNG states and the resolved config (as YAML text, so a checkpoint says how it was made). Files are written
to a temporary name and renamed, so a run killed mid-save never leaves a half-written "latest" checkpoint; a save
cut short removes its temporary file, and the next save removes any that a killed one left. A resume checks the
checksums the file was written with first (`check_intact`), so bytes changed on disk are refused, not trained from.
"""

from __future__ import annotations

import errno
import os
import shutil
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.config import TrainerConfig
from trainer.errors import CheckpointError, DiskFullError, Terminated
from trainer.result import TrainResult, TrainStatus

LATEST = "latest.pt"
FULL_BELOW_BYTES = 1 << 20  # a disk with less free than this when a write failed was full


@dataclass
class TrainState:
    """Where the loop is. `batch_in_epoch` counts micro-batches of this epoch already consumed, on each of
    `world_size` ranks (None in a checkpoint written before it was recorded: `saved_world_size`)."""

    step: int = 0
    samples: int = 0
    tokens: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    train_time_s: float = 0.0
    next_eval_samples: int = 0
    best_mlm_accuracy: float = 0.0
    samples_to_target: int | None = None
    time_to_target_s: float | None = None
    evals: list[dict[str, Any]] = field(default_factory=list)
    world_size: int | None = None


def save_checkpoint(directory: str | Path, payload: dict[str, Any], state: TrainState, keep: int | None = None) -> Path:
    """Write `ckpt-<samples>.pt` and point `latest.pt` at the same content; returns the file written. Saves of more
    samples are deleted (an earlier run's in the same directory, started afresh with checkpoint.resume false, or
    what the run resumed from an earlier save left behind): this run's latest is the newest that stays, and the
    directory holds one run's saves. `keep`: also delete the saves but the newest `keep` - 1 before this one."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "state": asdict(state), "rng": rng_state()}
    path = directory / f"ckpt-{state.samples:012d}.pt"
    for left in directory.glob(".*.pt.tmp"):  # what a save killed outright (SIGKILL) left
        left.unlink(missing_ok=True)
    tmp = directory / f".{path.name}.tmp"
    try:
        torch.save(payload, tmp)
    except BaseException as e:  # SIGTERM or Ctrl-C (KeyboardInterrupt), a full disk: nothing half-written stays
        full = isinstance(e, (OSError, RuntimeError)) and _disk_full(e, directory)  # measured while tmp is there
        tmp.unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError)):  # torch.save's writer says a full disk as a RuntimeError
            error = DiskFullError if full else CheckpointError
            raise error(f"checkpoint.dir: cannot save {path}: {_why_not_written(e, directory)}") from e
        raise
    try:
        os.replace(tmp, path)
        tmp_latest = directory / f".{LATEST}.tmp"
        if tmp_latest.exists():
            tmp_latest.unlink()
        os.link(path, tmp_latest)
        os.replace(tmp_latest, directory / LATEST)
    except OSError as e:
        raise CheckpointError(f"checkpoint.dir: cannot make {directory / LATEST} point at {path}: "
                              f"{_why_not_written(e, directory)}") from e  # fmt: skip
    older = sorted(p for p in directory.glob("ckpt-*.pt") if p.name < path.name)
    later = [p for p in directory.glob("ckpt-*.pt") if p.name > path.name]
    for stale in (older[: max(0, len(older) - (keep - 1))] if keep is not None else []) + later:
        stale.unlink(missing_ok=True)
    return path


def _disk_full(error: BaseException, directory: Path) -> bool:
    """Whether a failed write was a full disk: ENOSPC, or torch's writer failing with (almost) nothing left free
    (it says `file write failed`, not why)."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno == errno.ENOSPC
    try:
        return shutil.disk_usage(directory).free < FULL_BELOW_BYTES
    except OSError:
        return False


def _why_not_written(error: BaseException, directory: Path) -> str:
    """What stopped a checkpoint's write, with the free space of its disk (a full disk is the usual cause)."""
    what = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0]
    if isinstance(error, OSError) and error.errno != errno.ENOSPC:
        return f"{what}: fix that, or choose another checkpoint.dir"
    try:  # no space left, or torch's writer failing part-way (how it says a full disk)
        free = f"; {shutil.disk_usage(directory).free / 2**20:,.0f} MiB free on its disk"
    except OSError:
        free = ""
    return f"{what}{free}: free space there, or choose another checkpoint.dir"


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], TrainState]:
    """Read a checkpoint written by `save_checkpoint`; restores nothing by itself except what it returns."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
        state = TrainState(**payload["state"])
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}; delete it to start from scratch") from e
    return payload, state


def check_intact(path: str | Path) -> None:
    """Raise CheckpointError if the file is not the one `save_checkpoint` wrote: torch.save writes a zip archive with a
    CRC-32 of every record, which torch.load does not check (bytes changed inside a tensor load as other weights, and
    the run goes on from them). Reads the whole file (about 0.3 s a GB)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from e
    if bad is not None:
        raise CheckpointError(f"its record {bad} does not match the checksum saved with it: the file changed after it "
                              "was written")  # fmt: skip


def saved_state(path: str | Path) -> TrainState:
    """Where the checkpoint's run was, reading no weights (memory-mapped)."""
    try:
        return TrainState(**torch.load(path, map_location="cpu", weights_only=False, mmap=True)["state"])
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}; delete it to start from scratch") from e


def saved_world_size(payload: dict[str, Any], state: TrainState) -> int | None:
    """The number of ranks whose micro-batches a checkpoint's position counts: its own record; in a checkpoint
    written before that was recorded, the number of ranks whose random states it holds (all the ranks of a run that
    saved together), else None (one process, or rank 0 of a failed run saving alone: not known)."""
    if state.world_size is not None:
        return state.world_size
    return len(payload["rng_ranks"]) if payload.get("rng_ranks") else None


def saved_position(path: str | Path) -> tuple[TrainState, int | None]:
    """Where the checkpoint's run was, and on how many ranks (`saved_world_size`), reading no weights
    (memory-mapped)."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        state = TrainState(**payload["state"])
        return state, saved_world_size(payload, state)
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}; delete it to start from scratch") from e


def saved_config(path: str | Path) -> dict[str, Any]:
    """The resolved config the checkpoint's run trained with, as a plain mapping, reading no weights
    (memory-mapped); empty for a checkpoint that does not say."""
    import yaml

    try:
        config = torch.load(path, map_location="cpu", weights_only=False, mmap=True).get("config")
        raw = yaml.safe_load(config) if config else None
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}; delete it to start from scratch") from e
    return raw if isinstance(raw, dict) else {}


def saved_micro_batch(path: str | Path) -> int | None:
    """The micro-batch the checkpoint's run trained with (its resolved config), reading no weights (memory-mapped);
    None for a checkpoint that does not say."""
    micro = (saved_config(path).get("batch") or {}).get("micro_batch_size")
    return micro if isinstance(micro, int) else None


def latest_checkpoint(directory: str | Path | None) -> Path | None:
    if directory is None:
        return None
    path = Path(directory) / LATEST
    return path if path.is_file() else None


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


def final_save_interrupted(cfg: TrainerConfig, e: KeyboardInterrupt, result: TrainResult) -> str:
    """What to say of Ctrl-C or SIGTERM during the final save of a run whose final record is written."""
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
