"""An NNI trial that starts while the database is away waits for it, as the local engine's trial does.

The database is away for real: another connection holds the SQLite file in exclusive locking mode, which shuts out
readers too (SQLite's wait shortened so the lock outlasts it within milliseconds); it lets go while the trial waits.
"""

from __future__ import annotations

import sqlite3

import pytest

from hpo.nni import trial as trial_module
from hpo.storage import SqlStorage
from hpo.storage import engine as engine_module
from hpo.storage import retry as retry_module
from hpo.trial.outcome import EXIT_DATABASE_UNREACHABLE
from tests.hpo.nni.conftest import make_nni_spec, store_experiment


@pytest.mark.filterwarnings("ignore:.*Running trial code without runtime:RuntimeWarning")  # NNI's standalone mode
def test_a_trial_started_while_the_database_is_locked_waits_and_records_itself(tmp_path, monkeypatch):
    """It read the stored experiment before it took any bound, so it failed at once with a traceback (NNI counted a
    failed trial, and our database had no row of it); now it waits from its first read, HPO_DATABASE_OUTAGE_S or the
    default bound, as `hpo.trial.entry` does."""
    spec = make_nni_spec(tmp_path, "nni_random", trials=2, parallel=1)
    url, storage, experiment_id, run_dir = store_experiment(tmp_path, spec)
    storage.close()  # no connection of the test's own while the file is locked
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 20)
    monkeypatch.setattr(trial_module, "lead_process_group", lambda: 0)  # the test's process keeps its group
    monkeypatch.delenv("HPO_DATABASE_OUTAGE_S", raising=False)
    holder = sqlite3.connect(tmp_path / "hpo.db", isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE experiments SET controller_note = 'held'")
    pauses: list[float] = []
    pause = retry_module._pause

    def release_then_pause(seconds, *args):  # the other process ends its write while the trial waits
        if not pauses:
            holder.execute("ROLLBACK")
            holder.close()
        pauses.append(seconds)
        pause(seconds, *args)

    monkeypatch.setattr(retry_module, "_pause", release_then_pause)
    try:
        trial_module.run(url, experiment_id, 0, run_dir)  # NNI's standalone mode: its trial id is STANDALONE
    finally:
        if not pauses:
            holder.close()
    assert pauses  # it waited for the lock instead of failing
    with SqlStorage(url) as after:
        (recorded,) = after.list_trials(experiment_id)
        assert recorded.worker == "nni:STANDALONE" and recorded.state.finished


@pytest.mark.filterwarnings("ignore:.*Running trial code without runtime:RuntimeWarning")
def test_a_trial_whose_database_stays_away_past_the_bound_says_so_in_a_line_and_exits_with_its_code(
    tmp_path, monkeypatch, capsys
):
    """Past HPO_DATABASE_OUTAGE_S it ended with a traceback; the local engine's trial prints one line and exits with
    EXIT_DATABASE_UNREACHABLE, and now so does NNI's."""
    spec = make_nni_spec(tmp_path, "nni_random", trials=2, parallel=1)
    url, storage, experiment_id, run_dir = store_experiment(tmp_path, spec)
    storage.close()
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 20)
    monkeypatch.setattr(trial_module, "lead_process_group", lambda: 0)
    monkeypatch.setenv("HPO_DATABASE_OUTAGE_S", "1")
    holder = sqlite3.connect(tmp_path / "hpo.db", isolation_level=None, check_same_thread=False)
    try:
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("UPDATE experiments SET controller_note = 'held'")
        code = trial_module.main(["--db", url, "--experiment-id", str(experiment_id), "--arm", "0",
                                  "--run-dir", str(run_dir)])  # fmt: skip
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert code == EXIT_DATABASE_UNREACHABLE
    assert err.startswith(f"error: NNI trial of experiment {experiment_id}, arm 0: ") and "Traceback" not in err
    assert err.count("\n") == 1
