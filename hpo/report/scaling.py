"""Several experiments side by side: samples to target against global batch size per optimizer, next to the
gradient noise scale measured at each batch size (e.g. the runs of the `batch_scaling` presets).

One point per arm of every experiment: its optimizer and global batch size (those of the arm's best trial), the
verdict's evidence for the arm (mean samples to target over the runs that reached the target, its 95 % t
interval, and the hit rate, from the best configuration's confirmation seeds), and the noise scale: the
median, minimum and maximum over the arm's trials at that batch size of each trial's late-training noise scale
(see data.py), flagged as a lower bound when any of those trials' estimates is one. Reading it: where the
measured noise scale is far below the batch size, a larger batch buys little, and samples to target grows with
the batch instead of staying flat.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from hpo.report.data import ExperimentData
from hpo.verdict import ArmSummary


@dataclass(frozen=True)
class ScalingPoint:
    experiment: str
    arm: str
    optimizer: str
    global_batch_size: int
    evidence: ArmSummary
    noise_scale: float | None  # the median over the arm's trials at this batch size (None: not measured)
    noise_low: float | None
    noise_high: float | None
    noise_trials: int  # trials with a measured noise scale
    noise_lower_bounds: int = 0  # of those, the trials whose estimate is only a lower bound (see data.py)


def scaling_points(experiments: Sequence[ExperimentData]) -> list[ScalingPoint]:
    """Every arm with a global batch size and evidence, ordered by optimizer, then batch size."""
    points = []
    for data in experiments:
        for arm in data.arms:
            batch = arm.best.global_batch_size if arm.best else None
            if batch is None or arm.evidence is None:
                continue
            rows = [t for t in arm.trials if t.global_batch_size == batch and t.noise_scale is not None]
            noise = [t.noise_scale for t in rows]
            median = statistics.median(noise) if noise else None
            bounds = sum(1 for t in rows if t.noise_lower_bound)
            points.append(ScalingPoint(data.name, arm.label, arm.optimizer or "?", batch, arm.evidence, median,
                                       min(noise, default=None), max(noise, default=None), len(noise),
                                       bounds))  # fmt: skip
    return sorted(points, key=lambda p: (p.optimizer, p.global_batch_size, p.experiment, p.arm))


def optimizers(points: Sequence[ScalingPoint]) -> list[str]:
    return sorted({p.optimizer for p in points})
