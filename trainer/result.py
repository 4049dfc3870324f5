"""How a training run ended: the typed result every user of the trainer reads (the CLI, hpo, reporters).

`TrainStatus` is the one list of endings and their exit codes; `TrainResult` is the final record. Other
packages import these instead of copying status strings or exit codes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any


class TrainStatus(str, Enum):
    REACHED_TARGET = "reached_target"  # eval.target_mlm_accuracy reached
    BUDGET_EXHAUSTED = "budget_exhausted"  # budget.max_samples (or the max_time_s safety cap) used up
    DIVERGED = "diverged"  # the loss became NaN or inf
    FAILED = "failed"  # out of memory, bad data, a crash the trainer caught

    @property
    def exit_code(self) -> int:
        """The process exit code of `python -m trainer` (2 is a bad config, before any result exists)."""
        return {"reached_target": 0, "budget_exhausted": 0, "diverged": 3, "failed": 1}[self.value]

    @property
    def normal_end(self) -> bool:
        """The run trained as configured (its numbers are a measurement, not an accident)."""
        return self in (TrainStatus.REACHED_TARGET, TrainStatus.BUDGET_EXHAUSTED)


EXIT_BAD_CONFIG = 2
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports a process it stopped: 128 + the signal's number
EXIT_TERMINATED = 143  # SIGTERM, likewise


@dataclass(frozen=True)
class TrainResult:
    """The final record of a run."""

    status: TrainStatus
    reason: str | None = None  # why it failed or diverged (names the file/key for bad data)
    samples: int = 0  # training samples seen (all ranks)
    steps: int = 0  # optimizer steps taken
    samples_to_target: int | None = None  # samples when the target was first reached
    time_to_target_s: float | None = None  # training seconds when the target was first reached
    best_mlm_accuracy: float | None = None  # best evaluated masked-LM accuracy (None: never evaluated)
    final_mlm_accuracy: float | None = None  # accuracy of the last evaluation
    train_time_s: float = 0.0  # training seconds (evaluation included)
    sequences_per_s: float = 0.0
    tokens_per_s: float = 0.0
    world_size: int = 1
    global_batch_size: int | None = None
    micro_batch_size: int | None = None  # sequences per forward/backward on a rank (`auto`: the one chosen)
    target_mlm_accuracy: float | None = None
    # the kind of failure: "data", "oom", "disk_full", "crash" or "interrupted" (None unless FAILED)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able mapping (status as its string)."""
        return {**asdict(self), "status": self.status.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainResult:
        """Read a mapping written by `to_dict` (unknown keys, such as a report's `kind`, are ignored)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        return cls(**{**values, "status": TrainStatus(data["status"])})
