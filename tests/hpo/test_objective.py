"""The objective and what the tuner is told, computed by hand from the formula in hpo/objective.py."""

from __future__ import annotations

import pytest

from hpo.experiment.arms import trial_config
from hpo.objective import NOT_TOLD, objective_value, trial_result, tuner_cost, tuner_feedback
from hpo.trials import TrialState
from tests.hpo.experiment.test_experiment import objective_spec
from trainer.config import TrainerConfig
from trainer.result import TrainResult, TrainStatus


def result(status: str, **values) -> TrainResult:
    return TrainResult(TrainStatus(status), **values)


def test_objective_is_the_metric_when_the_target_is_reached():
    spec = objective_spec(metric="samples_to_target")
    cfg = TrainerConfig.model_validate(spec.resolved_base())
    hit = result("reached_target", samples_to_target=1024, best_mlm_accuracy=0.55)
    assert objective_value(spec, hit, cfg) == 1024.0


def test_objective_penalty_for_a_miss_grows_with_the_accuracy_gap():
    spec = objective_spec(metric="samples_to_target", penalty_factor=3.0)
    cfg = TrainerConfig.model_validate(spec.resolved_base())  # max_samples 4096, target 0.5
    near = result("budget_exhausted", best_mlm_accuracy=0.4)
    assert objective_value(spec, near, cfg) == pytest.approx(3.0 * 4096 * (1 + 0.1 / 0.5))
    assert objective_value(spec, result("diverged", best_mlm_accuracy=0.0), cfg) == 3.0 * 4096 * 2
    assert objective_value(spec, None, cfg) == 3.0 * 4096 * 2  # a crash without any record
    assert objective_value(spec, near, cfg) > 4096  # every miss is worse than every hit


def test_a_miss_at_a_low_fidelity_is_worse_than_every_hit_at_any_fidelity():
    """Multi-fidelity (Hyperband, ASHA): a trial at 1/9 of the budget that misses is penalized from the full
    budget, not its shortened one, so it never ranks above a full run that reached the target."""
    spec = objective_spec(metric="samples_to_target", penalty_factor=2.0)
    short = trial_config(spec, {}, fidelity=1 / 9)  # budget 4096 -> 455 samples
    assert short.budget.max_samples == 455
    near = result("budget_exhausted", best_mlm_accuracy=0.4)
    assert objective_value(spec, near, short) == pytest.approx(2.0 * 4096 * (1 + 0.1 / 0.5))
    full_hit = result("reached_target", samples_to_target=4096, best_mlm_accuracy=0.5)
    assert objective_value(spec, near, short) > objective_value(spec, full_hit, trial_config(spec, {})) == 4096
    early_hit = result("reached_target", samples_to_target=400, best_mlm_accuracy=0.5)
    assert objective_value(spec, early_hit, short) == 400.0  # a hit at a low rung is exact


def test_time_objective_caps_with_the_trial_timeout():
    spec = objective_spec(metric="time_to_target_s")
    cfg = TrainerConfig.model_validate(spec.resolved_base())
    assert objective_value(spec, result("reached_target", time_to_target_s=12.5), cfg) == 12.5
    assert objective_value(spec, result("failed", best_mlm_accuracy=0.5), cfg) == 2.0 * 100  # at the target
    assert objective_value(spec, None, cfg) == 2.0 * 100 * 2  # killed by the timeout, nothing learned


def test_accuracy_objectives_are_stored_as_is_and_negated_only_for_the_tuner():
    spec = objective_spec(metric="best_mlm_accuracy")
    cfg = TrainerConfig.model_validate(spec.resolved_base())
    assert spec.direction == "maximize"
    assert objective_value(spec, result("budget_exhausted", best_mlm_accuracy=0.42), cfg) == 0.42
    assert objective_value(spec, result("diverged", best_mlm_accuracy=0.42), cfg) == 0.0
    assert tuner_cost(spec, 0.42) == -0.42


def test_the_tuner_is_told_costs_crashes_or_nothing():
    spec = objective_spec(metric="samples_to_target")
    assert tuner_feedback(spec, TrialState.COMPLETED, 1024.0, {}) == 1024.0
    assert tuner_feedback(spec, TrialState.DIVERGED, 9000.0, {}) == 9000.0
    assert tuner_feedback(spec, TrialState.TIMEOUT, 9000.0, {}) == 9000.0
    assert tuner_feedback(spec, TrialState.FAILED, 9000.0, {"error": "oom"}) is None  # a crash
    assert tuner_feedback(spec, TrialState.FAILED, None, {"error": "data"}) is NOT_TOLD  # not the params' fault


def test_trial_result_maps_the_trainer_status_and_names_bad_data():
    spec = objective_spec(metric="samples_to_target")
    cfg = TrainerConfig.model_validate(spec.resolved_base())
    bad = trial_result(spec, result("failed", reason="shard x.h5: masked_lm_ids row 3", error="data"), cfg)
    assert bad.state == TrialState.FAILED and bad.reason == "bad data: shard x.h5: masked_lm_ids row 3"
    assert bad.metrics["error"] == "data"
    ok = trial_result(spec, result("budget_exhausted", best_mlm_accuracy=0.5, samples=4096), cfg)
    assert ok.state == TrialState.COMPLETED and ok.metrics["samples"] == 4096
