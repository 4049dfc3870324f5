"""The vocabulary shared by every layer (controller, runner, storage, server): small frozen dataclasses.

Failures are data: a trial that crashes, is killed, runs out of memory, diverges or times out ends with a
`TrialResult` whose `state` and `reason` say so; nothing is raised past the runner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class TrialState(str, Enum):
    QUEUED = "queued"  # proposed, waiting for a slot / GPUs
    RUNNING = "running"
    COMPLETED = "completed"  # the trainer ended normally: reached_target or budget_exhausted
    DIVERGED = "diverged"  # NaN/inf loss
    FAILED = "failed"  # crashed, killed, out of memory
    TIMEOUT = "timeout"  # exceeded its time limit
    INTERRUPTED = "interrupted"  # the controller died while it ran; re-queued on resume

    @property
    def finished(self) -> bool:
        return self in (TrialState.COMPLETED, TrialState.DIVERGED, TrialState.FAILED, TrialState.TIMEOUT)


class TrialKind(str, Enum):
    TUNING = "tuning"  # proposed by a tuner
    CONFIRMATION = "confirmation"  # an arm's best configuration re-run with another training seed


@dataclass(frozen=True)
class TrialSpec:
    """What to run: parameters (dotted trainer-config keys) on a share of the training budget."""

    number: int | None  # 0, 1, 2, ... within the experiment; None: the storage assigns the next one atomically
    params: dict[str, Any]
    arm: str | None = None  # the value(s) of the experiment's `compare` keys, e.g. "optimizer.name=lamb"
    budget: float = 1.0  # fraction of budget.max_samples (multi-fidelity); 1.0 = full
    gpus: tuple[int, ...] = ()  # device ids; empty = CPU slot
    global_batch_size: int | None = None
    kind: TrialKind = TrialKind.TUNING
    seed: int | None = None  # training seed, when it differs from the config's (confirmation runs)


@dataclass(frozen=True)
class TrialResult:
    """How a trial ended. `objective` is the experiment's objective in its own direction (penalty included);
    the tuner is told it negated when the direction is maximize."""

    state: TrialState
    reason: str | None = None
    objective: float | None = None
    samples_to_target: int | None = None
    time_to_target_s: float | None = None
    best_mlm_accuracy: float | None = None
    duration_s: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # the trainer's final record


def objective_text(value: float) -> str:
    """An objective for people: samples or seconds of 1,000 and more whole, with every digit (98,304, not 9.83e+04:
    trials that differ by a few samples must not look equal); others to 4 significant digits (0.1175, 12.5)."""
    if math.isfinite(value) and 1000 <= abs(value) < 1e15:
        return f"{value:,.0f}"
    return f"{value:,.4g}"
