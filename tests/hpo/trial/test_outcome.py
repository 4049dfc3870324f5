"""A trial's outcome kept in its directory until the database has it (hpo/trial/outcome.py), the reporter that keeps
metric points while the database is away, and the controller's and resume's recovery of a kept outcome.

The database is away for real: another connection holds the SQLite file's write lock, with SQLite's own waits
shortened so that the lock outlasts them within milliseconds.
"""

from __future__ import annotations

import math
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hpo.engine.study import Study
from hpo.experiment import stored_form
from hpo.runners import build_runner
from hpo.storage import SqlStorage
from hpo.storage import engine as engine_module
from hpo.storage.base import MetricPoint
from hpo.trial.entry import KEPT_RETRY_MAX_S, KEPT_RETRY_S, DatabaseReporter
from hpo.trial.outcome import OUTCOME_FILE, keep_outcome, kept_outcome, store_kept_outcome
from hpo.trials import TrialResult, TrialSpec, TrialState
from tests.hpo.engine.test_study import make_spec

RESULT = TrialResult(TrialState.COMPLETED, None, 96.0, 96, 1.5, 0.0123, 4.25, {"samples": 96, "loss": math.nan})
MEASURED = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)
POINTS = [MetricPoint(2, 16, {"loss": 4.5}, MEASURED), MetricPoint(4, 32, {"loss": 4.25, "mlm_accuracy": 0.01},
                                                                      MEASURED + timedelta(seconds=1))]  # fmt: skip


def running_trial(tmp_path: Path) -> tuple[SqlStorage, int]:
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, TrialSpec(None, {"optimizer.lr": 1e-3}))
    storage.mark_trial_running(trial_id, attempt=0)
    return storage, trial_id


def test_a_kept_outcome_reads_back_as_written_and_only_for_its_attempt(tmp_path: Path):
    keep_outcome(tmp_path, 7, 1, RESULT, POINTS)
    result, points = kept_outcome(tmp_path, 7, 1)
    assert (result.state, result.objective, result.samples_to_target, result.duration_s) == (
        TrialState.COMPLETED, 96.0, 96, 4.25)  # fmt: skip
    assert math.isnan(result.metrics["loss"]) and result.metrics["samples"] == 96
    assert points == POINTS
    assert kept_outcome(tmp_path, 7, 0) is None and kept_outcome(tmp_path, 8, 1) is None
    (tmp_path / OUTCOME_FILE).write_text('{"trial_id": 7, "attempt": 1, "res')  # cut short: not an outcome
    assert kept_outcome(tmp_path, 7, 1) is None


def test_a_kept_outcome_is_stored_once_with_its_points_at_their_measured_times(tmp_path: Path):
    storage, trial_id = running_trial(tmp_path)
    storage.add_metrics(trial_id, POINTS[:1], attempt=0)  # stored before the database went away
    keep_outcome(tmp_path / "trial", trial_id, 0, RESULT, POINTS)
    assert store_kept_outcome(storage, tmp_path / "trial", trial_id, 0)
    assert not (tmp_path / "trial" / OUTCOME_FILE).exists()
    trial = storage.get_trial(trial_id)
    assert (trial.state, trial.objective, trial.samples_to_target) == (TrialState.COMPLETED, 96.0, 96)
    assert [(m.step, m.name, m.value, m.created_at) for m in storage.get_metrics(trial_id)] == [
        (2, "loss", 4.5, MEASURED), (4, "loss", 4.25, MEASURED + timedelta(seconds=1)),
        (4, "mlm_accuracy", 0.01, MEASURED + timedelta(seconds=1))]  # fmt: skip
    assert not store_kept_outcome(storage, tmp_path / "trial", trial_id, 0)  # nothing kept any more


def test_a_kept_outcome_of_a_record_closed_meanwhile_is_dropped_and_the_record_stands(tmp_path: Path):
    storage, trial_id = running_trial(tmp_path)
    storage.interrupt_trial(trial_id, "experiment stopped by request", attempt=0)
    keep_outcome(tmp_path, trial_id, 0, RESULT, POINTS)
    assert not store_kept_outcome(storage, tmp_path, trial_id, 0)
    assert not (tmp_path / OUTCOME_FILE).exists()
    assert storage.get_trial(trial_id).state is TrialState.INTERRUPTED and storage.get_metrics(trial_id) == []


@pytest.fixture
def short_sqlite_waits(monkeypatch):
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 20)


def test_the_reporter_keeps_points_while_the_database_is_away_and_stores_them_once_it_is_back(
    short_sqlite_waits, tmp_path: Path
):
    storage, trial_id = running_trial(tmp_path)
    reporter = DatabaseReporter(storage, trial_id, 0)
    reporter.intermediate({"step": 1, "samples": 8, "loss": 5.0})
    holder = sqlite3.connect(tmp_path / "hpo.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock: the database is away for writers
    try:
        before = datetime.now(timezone.utc)
        reporter.intermediate({"step": 2, "samples": 16, "loss": 4.5, "lr": 0.001})  # returns: training goes on
        reporter.intermediate({"step": 3, "samples": 24, "loss": 4.0})  # tried again only after KEPT_RETRY_S
        assert [p.step for p in reporter.pending] == [2, 3]
        assert reporter.pending[0].at is not None and reporter.pending[0].at >= before
        assert storage.unreachable_for() is not None
        kept_by = datetime.now(timezone.utc)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    reporter.flush()
    assert reporter.pending == [] and storage.unreachable_for() is None
    stored = storage.get_metrics(trial_id)
    assert [(m.step, m.name, m.value) for m in stored] == [(1, "loss", 5.0), (2, "loss", 4.5), (2, "lr", 0.001),
                                                           (3, "loss", 4.0)]  # fmt: skip
    assert before <= stored[1].created_at <= stored[3].created_at <= kept_by  # stamped when measured, not stored


def test_kept_points_are_tried_again_less_and_less_often_while_the_database_stays_away(
    short_sqlite_waits, tmp_path: Path, monkeypatch
):
    """Each try at a locked file holds the training loop for SQLite's busy timeout (10 s): the pauses between tries
    double from KEPT_RETRY_S up to KEPT_RETRY_MAX_S, so a long lock costs training a shrinking share of its time."""
    storage, trial_id = running_trial(tmp_path)
    now = [0.0]
    reporter = DatabaseReporter(storage, trial_id, 0, clock=lambda: now[0])
    tries: list[float] = []
    add_metrics = storage.add_metrics

    def counted(*args, **kwargs):
        tries.append(now[0])
        return add_metrics(*args, **kwargs)

    monkeypatch.setattr(storage, "add_metrics", counted)
    holder = sqlite3.connect(tmp_path / "hpo.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        for second in range(400):  # a record every second for 400 s, the file locked throughout
            now[0] = float(second)
            reporter.intermediate({"step": second, "samples": 8 * second, "loss": 1.0})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert KEPT_RETRY_S == 5 and KEPT_RETRY_MAX_S == 60
    assert tries == [0, 5, 15, 35, 75, 135, 195, 255, 315, 375]
    now[0] = 376.0
    reporter.intermediate({"step": 400, "samples": 3200, "loss": 1.0})  # paused: kept
    now[0] = 435.0
    reporter.intermediate({"step": 401, "samples": 3208, "loss": 1.0})  # the lock gone: every point stored
    assert reporter.pending == [] and len(storage.get_metrics(trial_id)) == 402
    now[0] = 436.0
    reporter.intermediate({"step": 402, "samples": 3216, "loss": 1.0})  # stored at once again
    assert tries[-2:] == [435, 436] and reporter.pending == []


def test_resume_stores_a_kept_outcome_instead_of_running_the_trial_again(tmp_path: Path):
    spec = make_spec(tmp_path, trials=2)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    run_dir = tmp_path / "run"
    experiment_id = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
    finished, unfinished = (storage.create_trial(experiment_id, TrialSpec(None, {"optimizer.lr": lr}))
                            for lr in (1e-3, 2e-3))  # fmt: skip
    for trial_id in (finished, unfinished):
        storage.mark_trial_running(trial_id, attempt=0)  # the controller died (or gave up) while both ran
    keep_outcome(run_dir / "trials" / "00000", finished, 0, RESULT, POINTS)  # trial 0 finished meanwhile
    study = Study(spec, storage, experiment_id, run_dir, build_runner(spec), url)
    try:
        study.restore()
    finally:
        study.runner.close()
    first, second = storage.list_trials(experiment_id)
    assert (first.state, first.attempt, first.objective) == (TrialState.COMPLETED, 0, 96.0)
    assert len(storage.get_metrics(first.id)) == 3
    assert (second.state, second.attempt) == (TrialState.QUEUED, 1)  # without a kept outcome: runs again
    assert [p.number for p in study.queue] == [1]


def test_a_database_error_other_than_a_refused_claim_is_not_taken_for_one(tmp_path, capsys):
    """Exit 4 says "this attempt may not run the trial (now)", which a Dask runner reads as a re-run after a lost
    worker; a trial that does not exist (or a schema to upgrade) exits 6 with the database's message instead."""
    from hpo.storage import SqlStorage
    from hpo.trial.entry import EXIT_STORAGE_ERROR, main

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    SqlStorage(url, upgrade=True).close()
    code = main(["--db", url, "--trial-id", "999", "--attempt", "0", "--workdir", str(tmp_path / "w")])
    assert code == EXIT_STORAGE_ERROR == 6
    assert "error: trial id 999 attempt 0: trial 999 does not exist" in capsys.readouterr().err
    # in a run directory's trials/NNNNN the trial is named by its number, as everything else names it
    code = main(["--db", url, "--trial-id", "999", "--attempt", "0", "--workdir", str(tmp_path / "trials" / "00007")])
    assert code == 6 and "error: trial 7 (id 999) attempt 0: trial 999 does not exist" in capsys.readouterr().err
