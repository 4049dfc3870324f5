"""What a simulated experiment cost, from its trial records: GPU-hours, wall-clock and idle slot-time.

GPU-hours: every attempt's simulated duration x the GPUs of a slot. Wall-clock: from the first trial's creation to
the last trial's end. Idle slot-time: slots x wall-clock - the busy slot-time, as a fraction of slots x wall-clock
(the tails, and waits for confirmations). The trials' times are simulated (runner: simulated stamps them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cost:
    gpu_hours: float
    wall_hours: float
    idle_fraction: float

    def line(self, slots: int, gpu: str) -> str:
        return (f"simulated on {slots} slot(s) of {gpu.upper()} GPUs: {self.gpu_hours:,.1f} GPU-hours, "
                f"{self.wall_hours:,.2f} h wall-clock, {self.idle_fraction:.1%} of slot-time idle")  # fmt: skip


def experiment_cost(trials: Iterable[Any], slots: int, gpus_per_slot: int) -> Cost | None:
    """The cost of the trials (records with created_at, started_at, finished_at, duration_s); None before any
    ended."""
    ended = [t for t in trials if t.started_at is not None and t.finished_at is not None]
    if not ended:
        return None
    busy_s = sum((t.finished_at - t.started_at).total_seconds() for t in ended)
    start = min(t.created_at for t in ended)
    wall_s = (max(t.finished_at for t in ended) - start).total_seconds()
    idle = 1.0 - busy_s / (slots * wall_s) if wall_s > 0 else 0.0
    return Cost(busy_s * gpus_per_slot / 3600, wall_s / 3600, max(idle, 0.0))


def simulated_line(spec, trials: Iterable[Any]) -> str | None:
    """The cost line of a simulated experiment (None for a real one, or before a trial ended)."""
    if spec.runner.name != "simulated":
        return None
    cost = experiment_cost(trials, spec.budget.max_parallel, spec.resources.gpus_per_trial)
    slots, gpu = spec.budget.max_parallel, spec.runner.simulation.gpu
    return cost.line(slots, gpu) if cost else f"simulated on {slots} slot(s) of {gpu.upper()} GPUs: nothing ended yet"
