"""Writing twice leaves one, on every backend: what makes a write safe to retry after its first commit landed (the
database went away before it answered) and a trial's kept outcome safe to store again.

A retry is marked with `as_replay()`, as the retry loop marks every try after the first: the case where a first
try's commit landed but its answer was lost cannot be timed from a test, its second try can.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest
from sqlalchemy import text

from hpo.errors import NotFoundError, StorageError
from hpo.storage import MetricPoint, SqlStorage, downgrade_database, upgrade_database
from hpo.storage.engine import create_storage_engine
from hpo.storage.retry import as_replay
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from tests.hpo.storage.conftest import make_spec

CURVE = [MetricPoint(1, 8, {"loss": 2.5, "lr": 1e-3}), MetricPoint(2, 16, {"loss": 2.25, "mlm_accuracy": 0.125})]


def rows(storage: SqlStorage, trial_id: int) -> list[tuple]:
    return [(m.step, m.samples, m.name, m.value) for m in storage.get_metrics(trial_id)]


def running_trial(storage: SqlStorage) -> int:
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, make_spec(0))
    storage.mark_trial_running(trial_id, pid=4242, host="node-1", worker="slot-0", attempt=0)
    return trial_id


def test_a_metric_batch_written_twice_is_stored_once(storage: SqlStorage):
    trial_id = running_trial(storage)
    assert storage.add_metrics(trial_id, CURVE, attempt=0) == 4
    assert storage.add_metrics(trial_id, CURVE, attempt=0) == 4
    expected = [(1, 8, "loss", 2.5), (1, 8, "lr", 1e-3), (2, 16, "loss", 2.25), (2, 16, "mlm_accuracy", 0.125)]
    assert rows(storage, trial_id) == expected


def test_kept_points_written_again_with_new_ones_store_only_the_new(storage: SqlStorage):
    trial_id = running_trial(storage)
    storage.add_metrics(trial_id, CURVE[:1])
    storage.add_metrics(trial_id, [*CURVE, MetricPoint(3, 24, {"loss": 2.0})])
    assert rows(storage, trial_id) == [(1, 8, "loss", 2.5), (1, 8, "lr", 1e-3), (2, 16, "loss", 2.25),
                                       (2, 16, "mlm_accuracy", 0.125), (3, 24, "loss", 2.0)]  # fmt: skip
    # the value first stored stays: a repeat is the same measurement, not a correction
    storage.add_metrics(trial_id, [MetricPoint(3, 24, {"loss": 9.0})])
    assert storage.get_metrics(trial_id, "loss")[-1].value == 2.0


def test_a_result_written_twice_is_recorded_once_and_another_one_is_refused(storage: SqlStorage):
    trial_id = running_trial(storage)
    result = TrialResult(TrialState.COMPLETED, None, 4096.0, 4096, 12.5, 0.41, 30.25, {"samples": 4096})
    storage.finish_trial(trial_id, result, attempt=0)
    first = storage.get_trial(trial_id)
    storage.finish_trial(trial_id, result, attempt=0)
    assert storage.get_trial(trial_id) == first  # finished_at included: nothing was written
    with pytest.raises(StorageError, match="it is completed"):
        storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, None, 5000.0, 5000, 12.5, 0.41, 30.25))


def test_an_interruption_written_twice_is_recorded_once(storage: SqlStorage):
    trial_id = running_trial(storage)
    storage.interrupt_trial(trial_id, "stopped by request", attempt=0)
    first = storage.get_trial(trial_id)
    storage.interrupt_trial(trial_id, "stopped by request", attempt=0)
    assert storage.get_trial(trial_id) == first
    with pytest.raises(StorageError, match="cannot interrupt"):
        storage.interrupt_trial(trial_id, "another reason", attempt=0)


def test_a_retried_create_finds_the_experiment_and_the_trial_its_first_try_made(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {"budget": {"trials": 2}}, "minimize")
    with as_replay():
        assert storage.create_experiment("x", {"budget": {"trials": 2}}, "minimize") == experiment_id
    spec = TrialSpec(None, {"optimizer.lr": 0.001, "optimizer.name": "lamb"}, "lamb", 0.5)
    trial_id = storage.create_trial(experiment_id, spec)
    with as_replay():
        assert storage.create_trial(experiment_id, spec) == trial_id
        other = storage.create_trial(experiment_id, replace(spec, params={"optimizer.lr": 0.002}))
    assert other != trial_id
    assert [(t.number, t.params["optimizer.lr"]) for t in storage.list_trials(experiment_id)] == [
        (0, 0.001),
        (1, 0.002),
    ]
    confirmation = replace(spec, kind=TrialKind.CONFIRMATION, seed=7)
    with as_replay():  # the newest trial has other parameters: this one was never created
        third = storage.create_trial(experiment_id, confirmation)
    assert storage.get_trial(third).number == 2 and storage.count_trials(experiment_id) == 3


def test_a_retried_create_whose_first_try_never_landed_does_not_take_an_earlier_twin(tmp_path, monkeypatch):
    # A tuner may propose the same configuration twice in a row. Here the second create's first try meets a locked
    # SQLite file (another writer), so it never commits; its retry must create the trial, not return the twin's id.
    monkeypatch.setattr("hpo.storage.engine.SQLITE_BUSY_TIMEOUT_MS", 1)
    path = tmp_path / "hpo.db"
    other = sqlite3.connect(path, isolation_level=None)
    with SqlStorage(f"sqlite:///{path}", upgrade=True) as storage:
        experiment_id = storage.create_experiment("x", {}, "minimize")
        spec = TrialSpec(None, {"optimizer.name": "lamb"}, "lamb", 1.0)
        twin = storage.create_trial(experiment_id, spec)
        other.execute("BEGIN IMMEDIATE")  # the other writer holds the lock

        def release() -> None:  # asked while the retry pauses, after the first try failed: the writer commits
            if other.in_transaction:
                other.execute("COMMIT")

        storage.wait_for_outages(60, stop=release)
        created = storage.create_trial(experiment_id, spec)
        assert not other.in_transaction  # the first try did fail
        assert created != twin
        assert [trial.number for trial in storage.list_trials(experiment_id)] == [0, 1]
        storage.create_experiment("y", {}, "minimize")  # another controller's, of the same file
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StorageError, match="'y' already exists"):
            storage.create_experiment("y", {}, "minimize")
    other.close()


def test_a_retried_create_of_a_taken_name_or_number_still_refuses(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {"a": 1}, "minimize")
    with as_replay(), pytest.raises(StorageError, match="already exists"):
        storage.create_experiment("x", {"a": 2}, "minimize")  # another experiment's name
    storage.create_trial(experiment_id, make_spec(0))
    storage.mark_trial_running(storage.get_trial_by_number(experiment_id, 0).id)
    with as_replay(), pytest.raises(StorageError, match="already has a trial number 0"):
        storage.create_trial(experiment_id, make_spec(0))  # trial 0 is running: not a first try's work


def test_a_retried_start_requeue_and_delete_find_their_work_done(storage: SqlStorage):
    trial_id = running_trial(storage)
    with as_replay():
        storage.mark_trial_running(trial_id, pid=4242, host="node-1", worker="slot-0", attempt=0)
        with pytest.raises(StorageError, match="cannot start"):  # another process's claim is not this one's
            storage.mark_trial_running(trial_id, pid=99, host="node-2", worker="slot-1", attempt=0)
    requeued = storage.requeue_trial(trial_id, 0, "worker lost")
    with as_replay():
        assert storage.requeue_trial(trial_id, 0, "worker lost") == requeued
    assert requeued.attempt == 1 and requeued.state is TrialState.QUEUED
    empty = storage.create_experiment("empty", {}, "minimize")
    storage.delete_experiment(empty)
    with as_replay():
        storage.delete_experiment(empty)
    with pytest.raises(NotFoundError):
        storage.delete_experiment(empty)


def test_the_migration_keeps_one_of_each_repeated_metric_row(database_url: str):
    upgrade_database(database_url, "0002")
    engine = create_storage_engine(database_url)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO experiments (id, name, direction, status, spec, stop_requested, "
                "created_at) VALUES (1, 'x', 'minimize', 'running', '{}', false, '2026-01-01')"
            )
        )
        connection.execute(
            text(
                "INSERT INTO trials (id, experiment_id, number, state, params, budget, gpus, metrics, "
                "created_at) VALUES (1, 1, 0, 'running', '{}', 1.0, '[]', '{}', '2026-01-01')"
            )
        )
        for step, samples, value in [(1, 8, 2.5), (1, 8, 2.5), (2, 16, 2.0), (1, 8, 2.5), (3, None, 1.0),
                                     (3, None, 1.0)]:  # fmt: skip
            connection.execute(text("INSERT INTO trial_metrics (trial_id, step, samples, name, value, created_at) "
                                    "VALUES (1, :step, :samples, 'loss', :value, '2026-01-01')"),
                               {"step": step, "samples": samples, "value": value})  # fmt: skip
    engine.dispose()
    upgrade_database(database_url)
    with SqlStorage(database_url) as storage:
        assert rows(storage, 1) == [(1, 8, "loss", 2.5), (2, 16, "loss", 2.0), (3, None, "loss", 1.0),
                                    (3, None, "loss", 1.0)]  # without samples a value is not identified  # fmt: skip
    downgrade_database(database_url, "0002")
    upgrade_database(database_url)
