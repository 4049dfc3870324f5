"""The verdict's evidence computed here, independently of hpo.evidence.verdict: per arm, the finished confirmation
runs of
its best tuning trial, and their samples to target read off each run's stored accuracy curve by linear
interpolation (numpy) between the evaluations around the target."""

from __future__ import annotations

import numpy as np

from hpo.trials import TrialKind, TrialState


def interpolated(storage, trial, target: float) -> float | None:
    """Samples to target between evaluations; None for a miss."""
    if trial.state is not TrialState.COMPLETED or trial.samples_to_target is None:
        return None
    points = sorted((m.samples, m.value) for m in storage.get_metrics(trial.id, "mlm_accuracy"))
    first = next(i for i, (_, accuracy) in enumerate(points) if accuracy >= target)
    if first == 0:
        return float(points[0][0])
    (s0, a0), (s1, a1) = points[first - 1], points[first]
    return float(np.interp(target, [a0, a1], [s0, s1]))


def best_tuning_trial(trials, arm: str):
    """The arm's best: the completed tuning trial with the lowest objective, ties by number."""
    tuning = [t for t in trials if t.arm == arm and t.kind is TrialKind.TUNING and t.state is TrialState.COMPLETED]
    return min(tuning, key=lambda t: (t.objective, t.number)) if tuning else None


def arm_evidence(storage, trials, arm: str, target: float):
    """(best tuning trial, its finished confirmation runs, the hits' interpolated samples to target)."""
    best = best_tuning_trial(trials, arm)
    if best is None:
        return None, [], []
    runs = [t for t in trials if t.kind is TrialKind.CONFIRMATION and t.arm == arm and t.params == best.params
            and t.state.finished]  # fmt: skip
    hits = [s for s in (interpolated(storage, t, target) for t in runs) if s is not None]
    return best, runs, hits
