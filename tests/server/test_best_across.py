"""`GET /best` over several experiments (the API in the test's process): a trial that reached the target ranks above
one that missed it, whatever their objectives. A miss's objective is a penalty scaled by its own experiment's sample
budget (hpo.objective), so an experiment with a small budget scores its misses below another experiment's hits."""

from __future__ import annotations

from hpo.experiment import stored_form
from hpo.storage import SqlStorage
from hpo.trials import TrialResult, TrialSpec, TrialState
from tests.hpo.engine.test_study import make_spec
from tests.server.conftest import api_in_process

TARGET = 0.02  # tiny_overrides' eval.target_mlm_accuracy


def add_finished_trial(storage: SqlStorage, eid: int, result: TrialResult) -> None:
    trial = storage.create_trial(eid, TrialSpec(None, {"optimizer.lr": 1e-3}, global_batch_size=8))
    storage.mark_trial_running(trial)
    storage.finish_trial(trial, result)


def test_a_trial_that_reached_the_target_ranks_above_a_miss_of_another_experiment(tmp_path):
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    long = make_spec(tmp_path, name="long-budget", **{"budget.max_samples": 480})
    short = make_spec(tmp_path, name="short-budget", **{"budget.max_samples": 48})
    hit = storage.create_experiment(long.name, stored_form(long, tmp_path / "run"), long.direction)
    add_finished_trial(storage, hit, TrialResult(TrialState.COMPLETED, objective=400.0, samples_to_target=400,
                                                 best_mlm_accuracy=0.021))  # fmt: skip
    miss = storage.create_experiment(short.name, stored_form(short, tmp_path / "run"), short.direction)
    gap = (TARGET - 0.01) / TARGET
    penalty = short.objective.penalty_factor * 48 * (1 + gap)  # 144 samples: below the hit's 400
    add_finished_trial(storage, miss, TrialResult(TrialState.COMPLETED, objective=penalty, best_mlm_accuracy=0.01))
    storage.close()
    assert penalty < 400

    with api_in_process(url) as api:
        body = api.get("/best", params={"global_batch_size": 8, "optimizer": "lamb"}).json()
    ranked = [(c["experiment"], c["reached_target"], c["trial"]["result"]["objective"]) for c in body["candidates"]]
    assert ranked == [("long-budget", True, 400.0), ("short-budget", False, penalty)]
    assert body["best"]["experiment"] == "long-budget" and body["best"]["reached_target"] is True


def test_where_every_experiment_missed_the_one_that_came_nearest_the_target_ranks_first(tmp_path):
    """Misses of two experiments: each penalty is scaled by its own experiment's budget, so ranked by it, a run of a
    small-budget experiment that learned nothing came before a long-budget run that all but reached the target."""
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    long = make_spec(tmp_path, name="long-budget", **{"budget.max_samples": 480})
    short = make_spec(tmp_path, name="short-budget", **{"budget.max_samples": 48})
    penalties = {}
    for spec, budget, accuracy in ((short, 48, 0.001), (long, 480, 0.019)):
        eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
        gap = (TARGET - accuracy) / TARGET
        penalties[spec.name] = spec.objective.penalty_factor * budget * (1 + gap)
        add_finished_trial(storage, eid, TrialResult(TrialState.COMPLETED, objective=penalties[spec.name],
                                                     best_mlm_accuracy=accuracy))  # fmt: skip
    storage.close()
    assert penalties["short-budget"] < penalties["long-budget"]  # the penalty alone would rank the short one first

    with api_in_process(url) as api:
        body = api.get("/best", params={"global_batch_size": 8, "optimizer": "lamb"}).json()
    ranked = [(c["experiment"], c["reached_target"], c["trial"]["result"]["best_mlm_accuracy"])
              for c in body["candidates"]]  # fmt: skip
    assert ranked == [("long-budget", False, 0.019), ("short-budget", False, 0.001)]
