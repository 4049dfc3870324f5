"""Migrations: they build exactly the models' schema, and storages refuse databases that are not at the head."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from hpo.errors import BadDatabaseError, SchemaOutOfDateError, StorageError
from hpo.storage import SqlStorage, current_revision, downgrade_database, head_revision, upgrade_database
from hpo.storage.engine import create_storage_engine
from hpo.storage.migrate import alembic_config
from hpo.storage.models import Base
from hpo.trials import TrialResult, TrialSpec, TrialState
from tests.hpo.storage.conftest import POSTGRES_SKIP_REASON, POSTGRES_URL_ENV, postgres_schema_url
from tests.polling import wait_for

DELETER = ("deleter-host", 4321)  # the (host, pid) `hpo delete` claims an experiment with


def test_an_empty_database_is_out_of_date_until_upgraded(database_url: str):
    assert current_revision(database_url) is None
    with pytest.raises(SchemaOutOfDateError, match="no hpo tables yet: run `hpo db upgrade`"):
        SqlStorage(database_url)
    upgrade_database(database_url)
    assert current_revision(database_url) == head_revision()
    with SqlStorage(database_url) as storage:
        assert storage.list_experiments() == []


def test_upgrade_is_idempotent_and_keeps_data(database_url: str):
    with SqlStorage(database_url, upgrade=True) as storage:
        storage.create_experiment("kept", {}, "minimize")
    upgrade_database(database_url)
    with SqlStorage(database_url) as storage:
        assert [e.name for e in storage.list_experiments()] == ["kept"]


def test_experiments_with_trials_from_before_trials_version_get_a_version_above_0(database_url: str):
    """Revision 0005 started every experiment at version 0; the server keeps an experiment's spec only once its
    version shows a trial, so an older experiment with trials had its spec parsed on every request."""
    with SqlStorage(database_url, upgrade=True) as storage:
        tried = storage.create_experiment("tried", {}, "minimize")
        for number in range(3):
            storage.create_trial(tried, TrialSpec(number, {}))
        empty = storage.create_experiment("empty", {}, "minimize")
    downgrade_database(database_url, "0004_trial_noise_kind_index")  # the version column dropped, trials kept
    upgrade_database(database_url)
    with SqlStorage(database_url) as storage:
        assert storage.trials_version(tried) == 3  # one per trial it holds
        assert storage.trials_version(empty) == 0  # no trial: it may still be removed and its name recorded again


def test_ids_of_a_database_from_before_0008_are_not_given_again_after_a_delete(database_url: str):
    """SQLite gave the highest id plus one, so the newest experiment's and trials' ids came back once deleted;
    the upgrade keeps the rows and their ids, and the counter starts above them."""
    with SqlStorage(database_url, upgrade=True) as storage:
        kept = storage.create_experiment("kept", {}, "minimize")
        newest = storage.create_experiment("newest", {}, "minimize")
        trials = [storage.create_trial(newest, TrialSpec(number, {})) for number in range(2)]
    downgrade_database(database_url, "0007_trials_version_backfill")
    upgrade_database(database_url)
    with SqlStorage(database_url) as storage:
        assert [(e.id, e.name) for e in storage.list_experiments()] == [(kept, "kept"), (newest, "newest")]
        assert [t.id for t in storage.list_trials(newest)] == trials
        storage.purge_experiment(newest, *DELETER, stale_after_s=60)
        again = storage.create_experiment("newest", {}, "minimize")
        assert again > newest and storage.create_trial(again, TrialSpec(0, {})) > max(trials)


def test_an_older_schema_is_out_of_date(database_url: str):
    upgrade_database(database_url)
    downgrade_database(database_url, "base")
    assert current_revision(database_url) is None
    with pytest.raises(SchemaOutOfDateError, match="hpo db upgrade"):
        SqlStorage(database_url)


def test_a_schema_newer_than_the_code_is_refused(database_url: str):
    upgrade_database(database_url)
    engine = create_storage_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'f00d'"))
    engine.dispose()
    with pytest.raises(SchemaOutOfDateError, match="newer than this code"):
        SqlStorage(database_url)
    with pytest.raises(StorageError, match="cannot migrate"):
        upgrade_database(database_url)


def test_tables_of_our_names_made_by_someone_else_are_refused_and_kept(database_url: str):
    engine = create_storage_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE experiments (id INTEGER PRIMARY KEY, owner VARCHAR(20))"))
        connection.execute(text("INSERT INTO experiments VALUES (1, 'another team')"))
    engine.dispose()
    with pytest.raises(
        BadDatabaseError, match="tables named experiments but no hpo schema revision.*nothing was changed"
    ):
        upgrade_database(database_url)  # bad input, as `hpo status` on it: `hpo db upgrade` exits 2 too
    with pytest.raises(SchemaOutOfDateError, match="tables named experiments but no hpo schema revision"):
        SqlStorage(database_url)
    engine = create_storage_engine(database_url)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT owner FROM experiments")).scalars().all() == ["another team"]
        assert not inspect(connection).has_table("alembic_version")
        assert not inspect(connection).has_table("trials")
    engine.dispose()


def test_a_file_that_is_not_a_sqlite_database_is_named_and_left_as_it_is(tmp_path):
    path = tmp_path / "hpo.db"
    path.write_text("notes, not a database\n")
    url = f"sqlite:///{path}"
    for opening in (lambda: upgrade_database(url), lambda: SqlStorage(url, read_only=True)):
        with pytest.raises(StorageError, match=f"{path} is not a SQLite database"):
            opening()
    assert path.read_text() == "notes, not a database\n"


def test_a_new_sqlite_file_appears_with_its_schema_in_it(tmp_path, monkeypatch):
    # Built in place, the file was there before its tables: `hpo status` or a second `hpo run` opening it then was
    # told it had no hpo tables yet. Now a reader finds no file until the schema is in it.
    from alembic import command

    path = tmp_path / "new" / "hpo.db"
    url = f"sqlite:///{path}"
    upgrade, seen = command.upgrade, []

    def watched(config, revision):
        seen.append(path.exists())
        upgrade(config, revision)
        seen.append(path.exists())

    monkeypatch.setattr(command, "upgrade", watched)
    upgrade_database(url)
    assert seen == [False, False]
    assert current_revision(url) == head_revision()
    assert [p.name for p in path.parent.iterdir()] == ["hpo.db"]  # nothing hidden left beside it


def test_a_new_sqlite_file_another_process_made_first_is_kept(tmp_path, monkeypatch):
    import threading

    from alembic import command

    path = tmp_path / "hpo.db"
    url = f"sqlite:///{path}"
    upgrade = command.upgrade

    def theirs() -> None:  # another creator, which finishes while this one builds its schema
        with SqlStorage(url, upgrade=True) as storage:
            storage.create_experiment("theirs", {}, "minimize")

    def racing(config, revision):
        upgrade(config, revision)
        if threading.current_thread() is threading.main_thread() and not path.exists():
            other = threading.Thread(target=theirs)
            other.start()
            other.join()

    monkeypatch.setattr(command, "upgrade", racing)
    upgrade_database(url)
    with SqlStorage(url) as storage:
        assert [e.name for e in storage.list_experiments()] == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hpo.db"]


def test_a_new_sqlite_file_removes_what_a_killed_creator_left_an_hour_ago_and_nothing_younger(tmp_path):
    import os
    import time

    path = tmp_path / "hpo.db"
    old, young = (tmp_path / f".hpo.db.new-{pid}-1" for pid in (4242, 4343))
    for hidden in (old, Path(f"{old}-wal"), young):
        hidden.write_bytes(b"half made")
    hour_ago = time.time() - 3601
    for hidden in (old, Path(f"{old}-wal")):
        os.utime(hidden, (hour_ago, hour_ago))
    upgrade_database(f"sqlite:///{path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [young.name, "hpo.db"]


def test_migrations_build_exactly_the_models(database_url: str):
    upgrade_database(database_url)
    engine = create_storage_engine(database_url)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert differences == []


def test_downgrade_then_upgrade_round_trips(database_url: str):
    upgrade_database(database_url)
    downgrade_database(database_url, "base")
    engine = create_storage_engine(database_url)
    with engine.connect() as connection:  # base: none of the models' tables is left
        left = set(inspect(connection).get_table_names()) & set(Base.metadata.tables)
    assert left == set()
    upgrade_database(database_url)
    with engine.connect() as connection:  # and back: the schema the models declare, exactly
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    engine.dispose()
    with SqlStorage(database_url) as storage:
        assert storage.create_experiment("again", {}, "minimize") == 1


def test_a_downgrade_keeps_the_rows_of_the_tables_it_keeps(database_url: str):
    # SQLite alters a table by rebuilding it: dropping the old `experiments` must not cascade to the trials.
    with SqlStorage(database_url, upgrade=True) as storage:
        experiment_id = storage.create_experiment("kept", {}, "minimize")
        trial_id = storage.create_trial(experiment_id, TrialSpec(number=None, params={"lr": 0.1}))
        storage.add_metrics(trial_id, [(1, 8, {"loss": 2.5})])
    for revision in ("0004_trial_noise_kind_index", "0002", "0001"):
        downgrade_database(database_url, revision)
        assert _counts(database_url) == (1, 1, 1), revision
    upgrade_database(database_url)
    with SqlStorage(database_url) as storage:
        assert [trial.id for trial in storage.list_trials(experiment_id)] == [trial_id]
        assert len(storage.get_metrics(trial_id)) == 1


def _counts(url: str) -> tuple[int, ...]:
    engine = create_storage_engine(url)
    with engine.connect() as connection:
        counts = tuple(connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
                       for table in ("experiments", "trials", "trial_metrics"))  # fmt: skip
    engine.dispose()
    return counts


def test_the_head_revision_constant_is_alembics_head_and_storages_open_without_importing_alembic(database_url: str):
    import subprocess
    import sys

    from hpo.storage.migrate import HEAD_REVISION

    assert head_revision() == HEAD_REVISION  # Alembic's own reading of migrations/versions
    upgrade_database(database_url)
    probe = (f"import sys; from hpo.storage import SqlStorage; SqlStorage({database_url!r}).list_experiments(); "
             "print('alembic' in sys.modules)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_the_upgrade_to_told_before_orders_stored_tells_by_their_times_as_resumes_did(database_url: str):
    """Each finished trial is told before the first trial of its experiment created after it finished; at the same
    instant the tell comes first, unless the trial finished the moment it was created (then after its own creation);
    never before its own creation (a worker's clock behind the controller's); a trial finished after the newest
    one, or not finished (an interrupted one has a finishing time too), has none."""
    with SqlStorage(database_url, upgrade=True) as storage:
        experiment_id = storage.create_experiment("by-times", {}, "minimize")
        ids = [storage.create_trial(experiment_id, TrialSpec(None, {"lr": i})) for i in range(6)]
        for trial_id in ids[:3]:
            storage.mark_trial_running(trial_id)
            storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=1.0))  # after trial 5
        storage.mark_trial_running(ids[3])
        storage.finish_trial(ids[3], TrialResult(TrialState.FAILED, reason="crash"))
        storage.mark_trial_running(ids[4])
        storage.interrupt_trial(ids[4], "the controller stopped")
        later = storage.create_experiment("later", {}, "minimize")
        storage.create_trial(later, TrialSpec(None, {"lr": 9}))  # another experiment's: not counted
    downgrade_database(database_url, "0005_trials_version_filters")
    engine = create_storage_engine(database_url)
    with engine.begin() as connection:
        same_time = "UPDATE trials SET finished_at = (SELECT o.created_at FROM trials o WHERE o.id = :at) WHERE id=:id"
        connection.execute(text(same_time), {"id": ids[0], "at": ids[1]})  # the moment trial 1 was created
        connection.execute(text(same_time), {"id": ids[1], "at": ids[1]})  # the moment it was itself created
        connection.execute(text(same_time), {"id": ids[3], "at": ids[0]})  # a clock behind: before it was created
        connection.execute(text(same_time), {"id": ids[4], "at": ids[0]})  # interrupted: never told
    engine.dispose()
    upgrade_database(database_url)
    with SqlStorage(database_url) as storage:
        trials = storage.list_trials(experiment_id)
        assert [t.told_before for t in trials] == [1, 2, None, 4, None, None]
        assert {t.told_order for t in trials} == {None}


@pytest.fixture
def postgres_url() -> Iterator[str]:
    base_url = os.environ.get(POSTGRES_URL_ENV)
    if not base_url:
        pytest.skip(POSTGRES_SKIP_REASON)
    yield from postgres_schema_url(base_url)


@pytest.mark.postgres
def test_an_upgrade_started_while_another_migrates_waits_for_it_and_finds_nothing_left(postgres_url: str):
    """Two `hpo db upgrade` at once (two hosts after a new release): the first's migration is held open here, on a
    connection whose transaction the test commits once the second waits for it. The second then reads the new
    revision and does nothing, where it used to run the same migration again and fail. (SQLite needs no test: a
    migration begins with BEGIN IMMEDIATE there, one writer at a time.)"""
    upgrade_database(postgres_url, "0005_trials_version_filters")
    engine = create_storage_engine(postgres_url)
    errors: list[BaseException] = []

    def second_upgrade() -> None:
        try:
            upgrade_database(postgres_url)
        except BaseException as exc:  # the assertion below shows it
            errors.append(exc)

    second = threading.Thread(target=second_upgrade, daemon=True)
    try:
        with engine.connect() as first:
            first_pid = first.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            command.upgrade(alembic_config(first), "head")  # inside first's transaction, still open
            second.start()
            wait_for(lambda: _waiting_for(engine, first_pid), timeout_s=60)
            first.commit()
        second.join(timeout=60)
    finally:
        engine.dispose()
    assert not second.is_alive() and errors == []
    assert current_revision(postgres_url) == head_revision()


def _waiting_for(engine, pid: int) -> int:
    """How many server processes wait for a lock that the process `pid` holds."""
    with engine.connect() as connection:  # a transaction of its own: pg_stat_activity is read once per transaction
        query = text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")
        return connection.execute(query, {"pid": pid}).scalar_one()
