"""`GET /best` for an experiment that tunes `optimizer.name` without comparing it: the best is a tuning trial's
configuration; a confirmation run, the best configuration re-run with another seed, is never reported as a better
one however lucky its seed (as the storage's own best trial has it)."""

from __future__ import annotations

from hpo.experiment import stored_form
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from server.routes.best import _best_with
from server.storage import SpecCache
from tests.hpo.engine.test_study import make_spec


def test_a_lucky_confirmation_seed_is_not_the_best_configuration(tmp_path):
    spec = make_spec(tmp_path, space={"optimizer.name": {"choice": ["adamw", "lamb"]},
                                      "optimizer.lr": {"float": [1e-4, 1e-2], "log": True}})  # fmt: skip
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    runs = [  # (kind, lr, objective): samples to target, lower is better
        (TrialKind.TUNING, 1e-3, 900.0), (TrialKind.TUNING, 2e-3, 800.0), (TrialKind.CONFIRMATION, 2e-3, 500.0),
    ]  # fmt: skip
    for kind, lr, objective in runs:
        params = {"optimizer.name": "lamb", "optimizer.lr": lr}
        trial = storage.create_trial(eid, TrialSpec(None, params, global_batch_size=8, kind=kind,
                                                    seed=7 if kind is TrialKind.CONFIRMATION else None))  # fmt: skip
        storage.mark_trial_running(trial)
        storage.finish_trial(trial, TrialResult(TrialState.COMPLETED, objective=objective))
    record = storage.get_experiment(eid)
    best = _best_with(storage, SpecCache(), record, 8, "lamb")
    assert (best.kind, best.objective, best.params["optimizer.lr"]) == (TrialKind.TUNING, 800.0, 2e-3)
    assert storage.best_trial(eid, global_batch_size=8).number == best.number  # the storage's own answer
