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


def test_imported_trials_reach_smac_as_its_own_results(tmp_path):
    """What a resumed arm's tuner gets through NNI's import_data: the earlier run's parameters and results."""
    earlier = make_tuner(tmp_path / "a", optimize_mode="maximize")
    done = [earlier.generate_parameters(i) for i in range(3)]
    resumed = make_tuner(tmp_path / "b", optimize_mode="maximize")
    results = [{"default": 0.1 * (i + 1), "trial": i} for i in range(3)]  # as our NNI trials report them
    resumed.import_data([{"parameter": p, "value": r} for p, r in zip(done, results, strict=True)])
    history = resumed.controller.smac.runhistory
    told = sorted(((dict(history.ids_config[k.config_id]), v.cost) for k, v in history._data.items()),
                  key=lambda t: -t[1])  # fmt: skip
    assert [p for p, _ in told] == done  # a maximized objective: SMAC minimizes -0.1, -0.2, -0.3
    assert [c for _, c in told] == pytest.approx([-0.1, -0.2, -0.3])
    proposed = [resumed.generate_parameters(10 + i) for i in range(3)]
    assert all(p not in done for p in proposed)  # SMAC does not propose what it was told about
