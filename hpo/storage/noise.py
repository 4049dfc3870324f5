"""A trial's late-training noise scale, from its stored metric records: what the report shows per trial.

The noise scale of a trial is the median of its reported, positive and finite `noise_scale` values over the second
half of its training samples (the estimate is smoothed over steps and lags, and is noisiest at the start; see
trainer/noise_scale.py), with the share of its measured late steps (those that reported the big batch's gradient
norm, `grad_sq_norm_big`) that gave no such estimate. hpo/report/data.py says when that makes the value only a lower
bound.

The storage keeps both on the trial when it finishes (`Storage.finish_trial`): a finished trial takes no more
records, so they never change, and a report of 100,000 trials reads two numbers per trial instead of every
noise-scale record (about a hundred per trial).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from hpo.storage.base import MetricRecord

NOISE_METRICS = ("noise_scale", "grad_sq_norm_big")  # the estimates, and the steps that measured one


@dataclass(frozen=True)
class LateNoise:
    """A trial's late-training noise scale: the median estimate and the share of measured steps without one."""

    value: float | None
    undefined: float = 0.0


def late_noise(estimates: Sequence[MetricRecord], measured: Sequence[MetricRecord] = ()) -> LateNoise:
    """The median of the positive, finite estimates over the second half of the samples, and the share of the
    measured steps there (those that reported the big batch's gradient norm) without such an estimate."""
    value = late_noise_scale(estimates)
    steps = [(r.step, r.samples) for r in measured if r.samples is not None]
    if value is None or not steps:
        return LateNoise(value)
    half = max(s for _, s in steps) / 2
    late = {step for step, s in steps if s >= half}
    estimated = {r.step for r in estimates if _positive(r.value)}
    return LateNoise(value, len(late - estimated) / len(late))


def late_noise_scale(records: Sequence[MetricRecord]) -> float | None:
    """The median of the positive, finite noise-scale values reported over the second half of the samples."""
    points = [(r.samples, r.value) for r in records if r.samples is not None and _positive(r.value)]
    if not points:
        return None
    half = max(s for s, _ in points) / 2
    return statistics.median(v for s, v in points if s >= half)


def late_noise_of(records: Sequence[MetricRecord]) -> LateNoise:
    """`late_noise` of one trial's records of both NOISE_METRICS (other names are ignored)."""
    return late_noise([r for r in records if r.name == NOISE_METRICS[0]],
                      [r for r in records if r.name == NOISE_METRICS[1]])  # fmt: skip


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0
