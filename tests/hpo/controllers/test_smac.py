"""SMAC3 behind the ask/tell controller: what our adapter changes of SMAC3 must not change its proposals."""

from __future__ import annotations

import math

import pytest

from hpo.controllers.smac import SmacController
from search_spaces.space import SearchSpace

SPACE = SearchSpace.from_dict({"optimizer.lr": {"float": [1e-4, 1e-1], "log": True},
                               "schedule.warmup_steps": {"choice": [0, 40]}})  # fmt: skip


def cost(params) -> float:
    return (math.log10(params["optimizer.lr"]) + 2.5) ** 2 + params["schedule.warmup_steps"] / 100


def proposals(controller: SmacController, running: int, total: int) -> list[tuple]:
    """Keep `running` trials in flight (a cluster's slots), telling the oldest when a new one is asked; check the
    running configurations against SMAC3's own list at every ask."""
    from smac.runhistory.runhistory import RunHistory

    history = controller.smac.runhistory
    asked, in_flight = [], []
    while len(asked) < total:
        if len(in_flight) == running:
            done = in_flight.pop(0)
            controller.tell(done, cost(done.params))
        suggestion = controller.ask()
        in_flight.append(suggestion)
        asked.append(tuple(sorted(suggestion.params.items())))
        assert history.get_running_configs() == RunHistory.get_running_configs(history)
    return asked


@pytest.mark.slow  # 60 proposals of each lookup
def test_the_linear_running_configurations_lookup_changes_no_proposal(tmp_path):
    ours = SmacController(SPACE, seed=3, n_trials=60, output_dir=tmp_path / "a", save_history=False)
    smacs = SmacController(SPACE, seed=3, n_trials=60, output_dir=tmp_path / "b", save_history=False)
    del smacs.smac.runhistory.get_running_configs  # SMAC3's own, quadratic lookup
    assert "get_running_configs" in vars(ours.smac.runhistory)
    first, second = proposals(ours, running=16, total=60), proposals(smacs, running=16, total=60)
    assert first == second
    assert len(set(first)) > 40  # distinct proposals, not one repeated


def test_retrain_after_reaches_smacs_config_selector(tmp_path):
    default = SmacController(SPACE, seed=0, n_trials=20, output_dir=tmp_path / "a", save_history=False)
    wider = SmacController(SPACE, seed=0, n_trials=20, output_dir=tmp_path / "b", save_history=False,
                           options={"retrain_after": 16})  # fmt: skip
    assert default.smac.meta["config_selector"]["retrain_after"] == 8  # SMAC3's default
    assert wider.smac.meta["config_selector"]["retrain_after"] == 16
