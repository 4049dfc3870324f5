"""What a simulated experiment cost, from its trial records (or their span, one aggregate query): GPU-hours,
wall-clock and idle slot-time.

GPU-hours: every attempt's simulated duration x the GPUs of a slot. Wall-clock: from the first trial's creation to
the last trial's end. Idle slot-time: slots x wall-clock - the busy slot-time, as a fraction of slots x wall-clock
(the tails, and waits for confirmations). The trials' times are simulated (runner: simulated stamps them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from hpo.storage.base import TrialSpan

MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class Cost:
    gpu_hours: float
    wall_hours: float
    idle_fraction: float

    def line(self, slots: int, gpu: str) -> str:
        return (f"simulated on {slots} slot(s) of {gpu.upper()} GPUs: {self.gpu_hours:,.1f} GPU-hours, "
                f"{self.wall_hours:,.2f} h wall-clock, {self.idle_fraction:.1%} of slot-time idle")  # fmt: skip


def experiment_cost(trials: Iterable[Any], slots: int, gpus_per_slot: int) -> Cost | None:
    """The cost of the trials (records with created_at, started_at, finished_at); None before any ended."""
    return span_cost(span_of(trials), slots, gpus_per_slot)


def span_of(trials: Iterable[Any]) -> TrialSpan:
    """The span of the trials that started and ended, as `Storage.trial_span` reads it from the database (busy time
    summed in whole microseconds, so both give the same number)."""
    ended = [t for t in trials if t.started_at is not None and t.finished_at is not None]
    if not ended:
        return TrialSpan(0, 0.0, None, None)
    busy_us = sum((t.finished_at - t.started_at) // MICROSECOND for t in ended)
    return TrialSpan(len(ended), busy_us / 1e6, min(t.created_at for t in ended), max(t.finished_at for t in ended))


def span_cost(span: TrialSpan, slots: int, gpus_per_slot: int) -> Cost | None:
    """The cost of a span of trials (None when none ended): GPU-hours, wall-clock and idle slot-time."""
    if not span.ended:
        return None
    wall_s = (span.last_finished - span.first_created).total_seconds()
    idle = 1.0 - span.busy_s / (slots * wall_s) if wall_s > 0 else 0.0
    return Cost(span.busy_s * gpus_per_slot / 3600, wall_s / 3600, max(idle, 0.0))


def simulated_line(spec, trials: Iterable[Any] | TrialSpan) -> str | None:
    """The cost line of a simulated experiment (None for a real one, or before a trial ended), from its trials or
    their span (`Storage.trial_span`)."""
    if spec.runner.name != "simulated":
        return None
    span = trials if isinstance(trials, TrialSpan) else span_of(trials)
    cost = span_cost(span, spec.budget.max_parallel, spec.resources.gpus_per_trial)
    slots, gpu = spec.budget.max_parallel, spec.runner.simulation.gpu
    return cost.line(slots, gpu) if cost else f"simulated on {slots} slot(s) of {gpu.upper()} GPUs: nothing ended yet"
