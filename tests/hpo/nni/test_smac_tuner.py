"""SMAC3 as an NNI custom tuner, driven through NNI's tuner interface in-process (no NNI manager)."""

from __future__ import annotations

import pytest
from smac.runner.abstract_runner import StatusType

from hpo.nni.smac_tuner import SmacTuner
from tests.hpo.nni.conftest import CONDITIONAL_SPACE


def make_tuner(tmp_path, optimize_mode="minimize", n_trials=8):
    return SmacTuner(CONDITIONAL_SPACE, seed=0, n_trials=n_trials, optimize_mode=optimize_mode,
                     output_dir=str(tmp_path), n_initial_configs=3)  # fmt: skip


def test_parameters_respect_the_condition(tmp_path):
    tuner = make_tuner(tmp_path)
    tuner.update_search_space({"ignored": {"_type": "choice", "_value": [1]}})  # SMAC uses our own space
    seen = []
    for i in range(8):
        params = tuner.generate_parameters(i)
        seen.append(params)
        assert 1e-4 <= params["optimizer.lr"] <= 1e-2
        if params["clipping.strategy"] == "none":
            assert set(params) == {"optimizer.lr", "clipping.strategy"}
        else:
            assert 0.5 <= params["clipping.max_norm"] <= 5.0
        tuner.receive_trial_result(i, params, {"default": params["optimizer.lr"] * 100})
    assert {p["clipping.strategy"] for p in seen} == {"none", "after_allreduce"}


def test_results_reach_smac_as_costs_and_missing_ones_as_crashes(tmp_path):
    tuner = make_tuner(tmp_path, optimize_mode="maximize")
    first = tuner.generate_parameters(0)
    tuner.generate_parameters(1)
    tuner.receive_trial_result(0, first, 0.25)  # a maximized objective: SMAC minimizes -0.25
    tuner.trial_end(0, success=True)  # after a result: nothing more is told
    tuner.trial_end(1, success=False)  # no result: a crash
    history = tuner.controller.smac.runhistory
    values = sorted((v.status, v.cost) for v in history._data.values())
    assert values[0] == (StatusType.SUCCESS, pytest.approx(-0.25))
    assert [s for s, _ in values].count(StatusType.CRASHED) == 1 and len(values) == 2
    assert not tuner.pending
