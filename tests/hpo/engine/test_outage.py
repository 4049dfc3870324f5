"""The database goes away while `hpo run` drives an experiment: it waits, retries and loses nothing.

Real parts throughout: a PostgreSQL cluster of the test's own (tests/pgcluster.py) stopped with `pg_ctl stop -m
immediate` while trials of the tiny CPU trainer run on the local runner and started again later, or an SQLite file
that a second process holds exclusively locked; `hpo run` and `hpo resume` as a user runs them. What each trial
recorded is checked against its own `report.jsonl` (written by the trainer, beside the database): its result, and
one metric row per value it reported, none twice. Survivors are looked for as an operator would (every process
whose command line names the run directory).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from hpo.storage import SqlStorage
from hpo.storage.base import ExperimentStatus
from hpo.storage.engine import create_storage_engine
from hpo.trial.outcome import OUTCOME_FILE
from hpo.trials import TrialState
from tests.hpo.engine.test_stop import processes_naming
from tests.hpo.engine.test_study import tiny_overrides
from tests.pgcluster import PostgresCluster, why_no_cluster
from tests.polling import wait_for

TRIALS, SLOTS = 20, 4
OUTAGE_S = 20  # how long the database is away in the outage the controller waits out
NAME = "outage"


def experiment_file(directory: Path) -> Path:
    """20 trials of the tiny trainer, 4 at a time on CPU slots; a target that most trials reach within the budget."""
    overrides = tiny_overrides(directory / "data", **{"eval.target_mlm_accuracy": 0.008, "budget.max_samples": 96,
                                                      "log.every_steps": 1})  # fmt: skip
    spec = {
        "name": NAME, "base_config": {}, "overrides": overrides,
        "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}},
        "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": TRIALS, "max_parallel": SLOTS, "trial_timeout_s": 600},
        "resources": {"gpus": "none", "cpu_slots": SLOTS},
    }  # fmt: skip
    path = directory / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def hpo(database_url: str, *args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    environment = {**os.environ, "HPO_HEARTBEAT_S": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "hpo", "--db", database_url, *args], env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)  # fmt: skip


def finish(process: subprocess.Popen, timeout_s: float = 900) -> tuple[int, str]:
    try:
        out, err = process.communicate(timeout=timeout_s)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, out + err


def running_trials(storage: SqlStorage, at_least_finished: int) -> int:
    """How many trials run now, once `at_least_finished` have finished (0 before)."""
    experiments = storage.list_experiments()
    if not experiments:
        return 0
    counts = storage.count_trials_by_state(experiments[0].id)
    finished = sum(n for state, n in counts.items() if state.finished)
    return counts[TrialState.RUNNING] if finished >= at_least_finished else 0


def reported(run_dir: Path, number: int) -> tuple[dict, set[tuple]]:
    """What the trial's trainer reported in report.jsonl: its last final record, and (name, step, samples, value)
    of every value the database reporter stores, from every intermediate record (of every run of the trial)."""
    from hpo.trial.entry import METRIC_KEYS

    report = run_dir / "trials" / f"{number:05d}" / "report.jsonl"
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    final = [r for r in lines if r["kind"] == "final"][-1]
    values = {(k, r["step"], r["samples"], float(r[k])) for r in lines if r["kind"] == "intermediate"
              for k in METRIC_KEYS if isinstance(r.get(k), int | float)}  # fmt: skip
    return final, values


def check_recorded_once(storage: SqlStorage, database_url: str, run_dir: Path, *, reruns_allowed: bool) -> None:
    """Every trial once, finished, with the result and curve its trainer reported; no metric row twice; nothing of
    the experiment left running, no outcome left unstored."""
    (experiment,) = storage.list_experiments()
    assert experiment.status is ExperimentStatus.FINISHED
    trials = storage.list_trials(experiment.id)
    assert [t.number for t in trials] == list(range(TRIALS))
    assert all(t.state.finished and t.state is not TrialState.FAILED for t in trials), [
        (t.number, t.state, t.reason) for t in trials]  # fmt: skip
    reached = 0
    for trial in trials:
        final, values = reported(run_dir, trial.number)
        assert trial.samples_to_target == final["samples_to_target"], trial.number
        assert trial.metrics["samples"] == final["samples"], trial.number
        reached += trial.samples_to_target is not None
        stored = {(m.name, m.step, m.samples, m.value) for m in storage.get_metrics(trial.id)}
        if trial.attempt == 0:  # a single run in report.jsonl: the database holds every value it reported
            assert stored == values, trial.number
        else:  # a re-run appends to the same report: the rows are the last run's
            assert reruns_allowed and stored <= values and stored, trial.number
    assert reached > 0  # the samples to target compared above are not all None
    engine = create_storage_engine(database_url)
    with engine.connect() as connection:
        repeated = connection.execute(text(
            "SELECT trial_id, name, step, samples, COUNT(*) FROM trial_metrics "
            "GROUP BY trial_id, name, step, samples HAVING COUNT(*) > 1")).all()  # fmt: skip
    engine.dispose()
    assert repeated == []
    assert processes_naming(str(run_dir)) == {}
    assert list(run_dir.glob(f"trials/*/{OUTCOME_FILE}")) == []


@pytest.fixture
def cluster():
    reason = why_no_cluster()
    if reason:
        pytest.skip(reason)
    with PostgresCluster.create() as created:
        yield created


@pytest.mark.slow
@pytest.mark.postgres
def test_a_postgres_restart_while_trials_run_is_waited_out_and_nothing_is_lost_or_repeated(cluster, tmp_path):
    url, run_dir = cluster.url, tmp_path / "run"
    storage = SqlStorage(url, upgrade=True)
    controller = hpo(url, "run", str(experiment_file(tmp_path)), "--run-dir", str(run_dir))
    try:
        assert wait_for(lambda: running_trials(storage, at_least_finished=SLOTS), timeout_s=600)
        cluster.stop()  # immediate: connections cut, no shutdown checkpoint
        time.sleep(OUTAGE_S)
        assert controller.poll() is None  # it waited
        cluster.start()
        code, output = finish(controller)
    finally:
        if not cluster.running():
            cluster.start()
    assert code == 0, output[-3000:]
    assert "database unreachable for" in output and ", retrying" in output
    assert "database reachable again" in output
    check_recorded_once(storage, url, run_dir, reruns_allowed=False)
    assert all(t.attempt == 0 for t in storage.list_trials(storage.list_experiments()[0].id))  # none ran twice
    storage.close()


@pytest.mark.slow
@pytest.mark.postgres
def test_an_outage_longer_than_the_bound_stops_cleanly_and_resume_completes_it(cluster, tmp_path):
    url, run_dir = cluster.url, tmp_path / "run"
    storage = SqlStorage(url, upgrade=True)
    bound = {"HPO_DATABASE_OUTAGE_S": "8"}
    controller = hpo(url, "run", str(experiment_file(tmp_path)), "--run-dir", str(run_dir), env=bound)
    kept: dict[int, dict] = {}
    try:
        assert wait_for(lambda: running_trials(storage, at_least_finished=SLOTS), timeout_s=600)
        cluster.stop()
        code, output = finish(controller, timeout_s=300)  # it gives up at the bound, the database still away
        assert code == 1, output[-3000:]
        assert "unreachable for" in output and "database.outage_s = 8 s" in output
        assert f"`hpo resume {NAME}` stores what they kept" in output
        assert processes_naming(str(run_dir)) == {}  # every trial ended, though nothing could be recorded
        for path in run_dir.glob(f"trials/*/{OUTCOME_FILE}"):
            kept[int(path.parent.name)] = json.loads(path.read_text())
    finally:
        cluster.start()
    (experiment,) = storage.list_experiments()
    assert storage.get_experiment(experiment.id).status is ExperimentStatus.RUNNING  # it could not say otherwise
    resumed = hpo(url, "resume", NAME, env=bound)
    code, output = finish(resumed)
    assert code == 0, output[-3000:]
    check_recorded_once(storage, url, run_dir, reruns_allowed=True)
    assert kept  # some trials finished while the database was away
    for number, outcome in kept.items():  # stored from the file they kept, not run again
        trial = storage.get_trial_by_number(experiment.id, number)
        assert not (run_dir / "trials" / f"{number:05d}" / OUTCOME_FILE).exists()
        assert (trial.attempt, trial.state.value, trial.objective) == (
            outcome["attempt"], outcome["result"]["state"], outcome["result"]["objective"])  # fmt: skip
    storage.close()


# A second process holding SQLite's exclusive lock (in WAL mode: the write lock) for the given seconds: every writer,
# the controller's and each trial's, waits on it; readers go on.
LOCK_HOLDER = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
connection.execute("BEGIN EXCLUSIVE")
connection.execute("UPDATE experiments SET controller_note = controller_note")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
connection.execute("COMMIT")
connection.close()
"""


@pytest.mark.slow
def test_an_sqlite_file_locked_by_another_process_for_20_s_is_waited_out(tmp_path):
    path, run_dir = tmp_path / "hpo.db", tmp_path / "run"
    url = f"sqlite:///{path}"
    storage = SqlStorage(url, upgrade=True)
    controller = hpo(url, "run", str(experiment_file(tmp_path)), "--run-dir", str(run_dir))
    try:
        assert wait_for(lambda: running_trials(storage, at_least_finished=SLOTS), timeout_s=600)
        storage.close()  # no connection of the test's own while the file is locked
        holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path), str(OUTAGE_S)],
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert holder.stdout.readline().strip() == "locked"
        code, output = finish(controller)
        assert holder.wait(timeout=60) == 0
    finally:
        if controller.poll() is None:
            controller.kill()
    assert code == 0, output[-3000:]
    check_recorded_once(SqlStorage(url), url, run_dir, reruns_allowed=False)


@pytest.mark.slow
@pytest.mark.postgres
def test_sigterm_while_waiting_for_the_database_stops_at_once_and_resume_completes_it(cluster, tmp_path):
    url, run_dir = cluster.url, tmp_path / "run"
    storage = SqlStorage(url, upgrade=True)
    controller = hpo(url, "run", str(experiment_file(tmp_path)), "--run-dir", str(run_dir))
    try:
        assert wait_for(lambda: running_trials(storage, at_least_finished=SLOTS), timeout_s=600)
        cluster.stop()
        time.sleep(5)  # within the bound (600 s): it waits
        controller.send_signal(signal.SIGTERM)
        code, output = finish(controller, timeout_s=120)
        assert code == 1, output[-3000:]
        assert "Stopped waiting for it: the controller was terminated (SIGTERM)" in output
        assert processes_naming(str(run_dir)) == {}
    finally:
        cluster.start()
    code, output = finish(hpo(url, "resume", NAME))
    assert code == 0, output[-3000:]
    check_recorded_once(storage, url, run_dir, reruns_allowed=True)
    storage.close()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_frozen_server_is_an_outage_at_the_statement_deadline_and_resume_completes_it(cluster, tmp_path):
    """A server whose processes stopped (SIGSTOP: its port still open, the kernel acknowledging what is sent) held
    the controller on its open connections without a word, past database.outage_s, for as long as it was frozen: a
    statement without an answer for HPO_DATABASE_STATEMENT_S is now the start of an outage, and the bound applies."""
    url, run_dir = cluster.url, tmp_path / "run"
    storage = SqlStorage(url, upgrade=True)
    bounds = {"HPO_DATABASE_OUTAGE_S": "8", "HPO_DATABASE_STATEMENT_S": "3"}
    controller = hpo(url, "run", str(experiment_file(tmp_path)), "--run-dir", str(run_dir), env=bounds)
    try:
        assert wait_for(lambda: running_trials(storage, at_least_finished=SLOTS), timeout_s=600)
        cluster.freeze()
        code, output = finish(controller, timeout_s=240)  # without the deadline: until the thaw, never here
        assert code == 1, output[-3000:]
        assert "the database server missed a deadline" in output and "database.outage_s = 8 s" in output, output[-3000:]
        assert processes_naming(str(run_dir)) == {}
    finally:
        cluster.thaw()
    code, output = finish(hpo(url, "resume", NAME))
    assert code == 0, output[-3000:]
    check_recorded_once(storage, url, run_dir, reruns_allowed=True)
    storage.close()


def test_an_sqlite_file_deleted_under_the_controller_stops_it_saying_so(tmp_path):
    """The folder of the SQLite file removed while trials ran: the controller went on writing into the deleted file,
    and ended with the summary of a finished experiment and exit code 0, which no command could then read."""
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "hpo.db"
    url, run_dir = f"sqlite:///{path}", tmp_path / "run"
    controller = hpo(url, "run", str(experiment_file(tmp_path)), "--run-dir", str(run_dir))
    try:

        def one_completed() -> bool:
            if not path.exists():
                return False
            read = contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True))
            with read as connection, contextlib.suppress(sqlite3.OperationalError):  # tables not made yet
                completed = "SELECT COUNT(*) FROM trials WHERE state = 'completed'"
                return connection.execute(completed).fetchone()[0] > 0
            return False

        assert wait_for(one_completed, timeout_s=300)
        shutil.rmtree(folder)
        code, output = finish(controller, timeout_s=300)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert code == 1, output[-3000:]
    assert f"error: the SQLite database {path} was deleted or replaced while this command used it" in output
    assert not re.search(r"^experiment outage: \d+ completed", output, re.M)  # no summary of a finished one
    assert processes_naming(str(run_dir)) == {}
    assert not folder.exists()  # no trial made the database anew, empty, where it was
