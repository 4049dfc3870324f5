"""Attempts fence stale writers: after a trial is re-queued (its worker was lost), the old attempt's process
can neither start, report metrics nor finish it; the new attempt can."""

from __future__ import annotations

import pytest

from hpo.errors import StaleAttemptError, StorageError
from hpo.storage import MetricPoint
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState


def test_a_requeued_trial_refuses_its_old_attempt(storage):
    eid = storage.create_experiment("e", {}, "minimize")
    tid = storage.create_trial(eid, TrialSpec(None, {"x": 1}))
    storage.mark_trial_running(tid, pid=10, host="h", worker="tcp://w1", attempt=0)
    storage.add_metrics(tid, [MetricPoint(1, 8, {"loss": 2.0})], attempt=0)
    requeued = storage.requeue_trial(tid, 0, "interrupted: its Dask worker tcp://w1 was lost")
    assert (requeued.state, requeued.attempt, requeued.worker, requeued.pid) == (TrialState.QUEUED, 1, None, None)
    assert storage.get_metrics(tid) == []  # the lost attempt's curve is gone; the re-run reports its own
    with pytest.raises(StaleAttemptError, match="attempt 1, not 0"):
        storage.add_metrics(tid, [MetricPoint(2, 16, {"loss": 1.0})], attempt=0)
    with pytest.raises(StaleAttemptError):
        storage.mark_trial_running(tid, attempt=0)
    with pytest.raises(StaleAttemptError):
        storage.finish_trial(tid, TrialResult(TrialState.COMPLETED, objective=1.0), attempt=0)
    storage.mark_trial_running(tid, worker="tcp://w2", attempt=1)
    storage.finish_trial(tid, TrialResult(TrialState.COMPLETED, objective=3.0), attempt=1)
    done = storage.get_trial(tid)
    assert (done.state, done.objective, done.worker, done.attempt) == (TrialState.COMPLETED, 3.0, "tcp://w2", 1)
    with pytest.raises(StorageError):
        storage.requeue_trial(tid, 1, "too late")  # a finished trial never goes back


def test_requeue_interrupted_starts_a_new_attempt(storage):
    eid = storage.create_experiment("e", {}, "minimize")
    tid = storage.create_trial(eid, TrialSpec(None, {"x": 1}))
    storage.mark_trial_running(tid, attempt=0)
    assert [t.attempt for t in storage.requeue_interrupted(eid)] == [1]


def test_confirmation_trials_keep_kind_and_seed_and_never_win(storage):
    eid = storage.create_experiment("e", {}, "minimize")
    tuned = storage.create_trial(eid, TrialSpec(None, {"x": 1}, arm="a"))
    confirm = storage.create_trial(eid, TrialSpec(None, {"x": 1}, arm="a", kind=TrialKind.CONFIRMATION, seed=43))
    for tid, objective in ((tuned, 10.0), (confirm, 5.0)):
        storage.mark_trial_running(tid)
        storage.finish_trial(tid, TrialResult(TrialState.COMPLETED, objective=objective))
    record = storage.get_trial(confirm)
    assert (record.kind, record.seed, record.number) == (TrialKind.CONFIRMATION, 43, 1)
    assert storage.best_trial(eid).id == tuned and storage.best_per_arm(eid)["a"].id == tuned
