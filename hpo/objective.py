"""The objective, in one module: what a trial scores, how a run's ending maps to a trial state, and what the
tuner is told. The live loop and a resumed one both go through `tuner_feedback`, so a tuner sees the same
history either way.

The tuner minimizes `objective_value`: the metric itself (negated when maximized). For `samples_to_target`
and `time_to_target_s`, a run that misses the target (budget exhausted, diverged, failed, timed out) scores

    penalty_factor x cap x (1 + gap),   gap = clamp((target - best_mlm_accuracy) / target, 0, 1)

where cap is the experiment's full sample budget (budget.max_samples of the base config, or of the trial when
larger; a multi-fidelity trial's shortened budget does not lower it), or for time the trainer's budget.max_time_s
else the experiment's trial_timeout_s. Every miss is thus worse than every hit (penalty_factor > 1), at any
fidelity: a miss at a low rung never ranks above a run that reached the target, so an arm's best trial is never
a short run that missed. A near miss beats a run that learned nothing, which keeps the tuner's model
informative when few runs reach the target; misses at one fidelity rank as their accuracies do.
For the accuracy metrics, a run that did not end normally (diverged, failed, timeout) scores accuracy 0.

What the tuner is told (`tuner_feedback`): COMPLETED, DIVERGED and TIMEOUT trials report their objective as a
cost; a FAILED trial is a crash (the configuration does not run); a trial that failed on bad data
says nothing about the hyperparameters and is not told at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpo.trials import TrialResult, TrialState
from trainer.config import BudgetConfig
from trainer.result import TrainResult, TrainStatus

_TO_TARGET = ("samples_to_target", "time_to_target_s")
NOT_TOLD = object()  # tuner_feedback: nothing to tell the tuner
# Failures that say nothing about the hyperparameters (the final record's `error`).
NOT_HYPERPARAMETER_ERRORS = ("data",)


def objective_value(spec, result: TrainResult | None, cfg) -> float:
    """The objective of a trial whose run ended with `result` (None: no result, e.g. killed), with config `cfg`,
    in the experiment's own direction."""
    metric = spec.objective.metric
    normal = result is not None and result.status.normal_end
    value = getattr(result, metric) if normal else None
    if metric in _TO_TARGET:
        if value is not None:
            return float(value)
        cap = full_max_samples(spec, cfg) if metric == "samples_to_target" else cfg.budget.max_time_s
        cap = cap or spec.budget.trial_timeout_s or 0.0
        target = cfg.eval.target_mlm_accuracy
        best = (result.best_mlm_accuracy if result is not None else None) or 0.0
        gap = min(max((target - best) / target, 0.0), 1.0)
        return spec.objective.penalty_factor * cap * (1.0 + gap)
    return float(value or 0.0)


def missed_objective(spec, cfg, best_mlm_accuracy: float | None) -> float:
    """The objective of a run that ended without a result (killed, timed out), from the best accuracy it reported."""
    return objective_value(spec, TrainResult(TrainStatus.FAILED, best_mlm_accuracy=best_mlm_accuracy), cfg)


def full_max_samples(spec, cfg) -> int:
    """The experiment's full sample budget: the base config's budget.max_samples (after overrides), or the
    trial's own when it is larger (a tuned budget); a multi-fidelity trial's shortened budget is below it."""
    budget = spec.resolved_base().get("budget") or {}
    full = budget.get("max_samples", BudgetConfig.model_fields["max_samples"].default)
    return max(int(full), cfg.budget.max_samples)


def trial_result(spec, result: TrainResult, cfg, duration_s: float | None = None) -> TrialResult:
    """The stored outcome of a run that ended with a final record."""
    state = {
        TrainStatus.REACHED_TARGET: TrialState.COMPLETED,
        TrainStatus.BUDGET_EXHAUSTED: TrialState.COMPLETED,
        TrainStatus.DIVERGED: TrialState.DIVERGED,
        TrainStatus.FAILED: TrialState.FAILED,
    }[result.status]
    reason = result.reason
    if result.error == "data":
        reason = f"bad data: {reason}"
    return TrialResult(
        state,
        reason,
        objective_value(spec, result, cfg),
        result.samples_to_target,
        result.time_to_target_s,
        result.best_mlm_accuracy,
        duration_s,
        result.to_dict(),
    )


def reached_target_at_most(spec, cfg) -> float | None:
    """The tuner cost at or below which a trial reached the target (its cost is then exact, at any fidelity), for
    the experiment's base trainer config `cfg`; None when the objective has no target. A hit costs at most the
    cap, every miss at least penalty_factor (> 1) x the cap."""
    metric = spec.objective.metric
    if metric == "samples_to_target":
        return float(full_max_samples(spec, cfg))
    if metric == "time_to_target_s":
        return float(cfg.budget.max_time_s or spec.budget.trial_timeout_s or 0.0) or None
    return None


def tuner_cost(spec, objective: float) -> float:
    """The cost a tuner minimizes for a stored objective."""
    return -objective if spec.direction == "maximize" else objective


def tuner_feedback(spec, state: TrialState, objective: float | None, final: Mapping[str, Any] | None):
    """What to tell the tuner about a finished trial: a cost, None (a crash), or NOT_TOLD."""
    if (final or {}).get("error") in NOT_HYPERPARAMETER_ERRORS:
        return NOT_TOLD
    if state in (TrialState.COMPLETED, TrialState.DIVERGED, TrialState.TIMEOUT) and objective is not None:
        return tuner_cost(spec, objective)
    return None
