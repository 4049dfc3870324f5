"""What is specific to SqlStorage: where the default database is, SQLite's settings, error translation."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError

from hpo.errors import BadDatabaseError, DatabaseUnavailableError, StorageError
from hpo.storage import SqlStorage, default_database_url
from hpo.storage import engine as engine_module
from hpo.storage.engine import create_storage_engine


def test_default_url_is_hpo_home_relative_to_the_current_directory(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("HPO_DATABASE_URL", raising=False)
    monkeypatch.delenv("HPO_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_database_url() == f"sqlite:///{tmp_path.resolve()}/.hpo/hpo.db"
    monkeypatch.setenv("HPO_HOME", str(tmp_path / "elsewhere"))
    assert default_database_url() == f"sqlite:///{tmp_path.resolve()}/elsewhere/hpo.db"
    monkeypatch.setenv("HPO_DATABASE_URL", "postgresql+psycopg://hpo@db:5432/hpo")
    assert default_database_url() == "postgresql+psycopg://hpo@db:5432/hpo"


def test_default_storage_creates_hpo_home(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("HPO_DATABASE_URL", raising=False)
    monkeypatch.setenv("HPO_HOME", str(tmp_path / "a" / "b"))
    with SqlStorage(upgrade=True) as storage:
        storage.create_experiment("x", {}, "minimize")
    assert (tmp_path / "a" / "b" / "hpo.db").is_file()


def test_sqlite_file_is_in_wal_mode_with_busy_timeout_and_foreign_keys(tmp_path: Path):
    path = tmp_path / "hpo.db"
    url = f"sqlite:///{path}"
    SqlStorage(url, upgrade=True).close()
    with sqlite3.connect(path) as raw:  # an independent connection sees the file's persistent journal mode
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    engine = create_storage_engine(url)
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10_000
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "nosuchdialect://host/db",
        "postgresql+psycopg://postgres@127.0.0.1:1/test",  # nothing listens on port 1
    ],
)
def test_bad_or_unreachable_databases_raise_storage_errors(url: str):
    with pytest.raises(StorageError) as raised:
        SqlStorage(url)
    assert not isinstance(raised.value, SQLAlchemyError)


def test_postgresql_connections_give_up_after_the_connect_timeout_unless_the_url_sets_one():
    from sqlalchemy.engine import make_url

    from hpo.storage.engine import CONNECT_TIMEOUT_S, server_connect_args

    dead = {"keepalives": 1, "keepalives_idle": 9, "keepalives_interval": 3, "keepalives_count": 3,
            "tcp_user_timeout": 18_000}  # a dead connection found within 18 s, idle (9 + 3 x 3) or sending  # fmt: skip
    assert server_connect_args(make_url("postgresql+psycopg://u@db:5432/hpo")) == {"connect_timeout": CONNECT_TIMEOUT_S,
                                                                                  **dead}  # fmt: skip
    assert server_connect_args(make_url("postgresql+psycopg://u@db:5432/hpo?connect_timeout=3")) == dead
    assert server_connect_args(make_url("sqlite:///x.db")) == {}
    # And the driver really receives it: the parameters of the connect call, caught before it is made.
    engine = create_storage_engine("postgresql+psycopg://u@db.invalid:5432/hpo")
    seen: dict = {}

    @event.listens_for(engine, "do_connect")
    def catch(dialect, record, cargs, cparams):
        seen.update(cparams)
        raise ConnectionAbortedError("not connecting in a test")

    with pytest.raises(ConnectionAbortedError):
        engine.connect()
    assert seen["connect_timeout"] == CONNECT_TIMEOUT_S and seen["host"] == "db.invalid"
    engine.dispose()


@pytest.mark.postgres
def test_a_postgresql_connection_is_made_with_the_dead_connection_bounds():
    """libpq takes them (an option it did not know would fail the connection) and the connection has them."""
    import os

    url = os.environ.get("HPO_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("HPO_TEST_POSTGRES_URL is not set")
    engine = create_storage_engine(url)
    with engine.connect() as connection:
        parameters = connection.connection.dbapi_connection.info.get_parameters()
    engine.dispose()
    assert {k: parameters.get(k) for k in ("keepalives", "keepalives_idle", "tcp_user_timeout")} == {
        "keepalives": "1", "keepalives_idle": "9", "tcp_user_timeout": "18000"}  # fmt: skip


def test_connection_errors_name_the_database_but_not_the_password():
    with pytest.raises(StorageError) as raised:
        SqlStorage("postgresql+psycopg://hpo:s3cret-pw@127.0.0.1:1/hpo")
    message = str(raised.value)
    assert "127.0.0.1:1/hpo" in message and "s3cret-pw" not in message
    assert "HPO_DATABASE_URL" in message


def test_sqlite_directory_that_cannot_be_created_is_a_storage_error(tmp_path: Path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StorageError, match="cannot create the directory"):
        SqlStorage(f"sqlite:///{tmp_path / 'file' / 'hpo.db'}")


def test_a_database_that_vanishes_raises_storage_errors(tmp_path: Path):
    """A folder where the file was is a replaced file, whatever inode number it took (the deleted file's, at times:
    the check by inode alone then let SQLite's own error through, and the message depended on the file system)."""
    path = tmp_path / "hpo.db"
    storage = SqlStorage(f"sqlite:///{path}", upgrade=True)
    storage.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.mkdir()  # now a directory where the file was: SQLite cannot open it
    with pytest.raises(StorageError, match=f"the SQLite database {re.escape(str(path))} was deleted or replaced while"):
        storage.list_experiments()
    with pytest.raises(BadDatabaseError, match="cannot use the SQLite file .* names a file \\(not a folder\\)"):
        SqlStorage(f"sqlite:///{path}")  # opened afresh: the folder is what is there


@pytest.fixture
def short_sqlite_waits(monkeypatch):
    """SQLite waits 50 ms for a lock instead of SQLITE_BUSY_TIMEOUT_MS."""
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 50)


def hold_write_lock(path: Path, release: threading.Event) -> threading.Thread:
    """Another writer that keeps the SQLite write lock until `release` is set (in a thread)."""
    locked = threading.Event()

    def hold() -> None:
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(timeout=60)
        connection.execute("ROLLBACK")
        connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    locked.wait()
    return thread


def test_a_locked_database_is_an_outage_after_one_busy_wait(short_sqlite_waits, tmp_path: Path):
    """A write that finds the file locked waits SQLite's busy timeout once, then raises DatabaseUnavailableError: any
    further waiting is the storage's retry (`wait_for_outages`), which counts it against `database.outage_s`. Waits
    of its own inside a try would hide the lock from that bound and from the progress line."""
    path = tmp_path / "hpo.db"
    with SqlStorage(f"sqlite:///{path}", upgrade=True) as storage:
        begins: list[str] = []
        event.listen(storage._write_engine, "begin", lambda connection: begins.append("begin"))
        release = threading.Event()
        holder = hold_write_lock(path, release)
        try:
            with pytest.raises(DatabaseUnavailableError, match="stayed locked by another writer"):
                storage.create_experiment("impatient", {}, "minimize")
        finally:
            release.set()
            holder.join()
        assert begins == ["begin"]  # one try, one busy wait
        storage.create_experiment("patient", {}, "minimize")  # the lock gone, the write goes through
        assert [e.name for e in storage.list_experiments()] == ["patient"]


def test_a_database_locked_for_too_long_is_a_storage_error(short_sqlite_waits, tmp_path: Path):
    path = tmp_path / "hpo.db"
    with SqlStorage(f"sqlite:///{path}", upgrade=True) as storage:
        release = threading.Event()
        holder = hold_write_lock(path, release)  # held until every retry has given up
        try:
            with pytest.raises(StorageError, match="stayed locked by another writer"):
                storage.create_experiment("impatient", {}, "minimize")
            assert storage.list_experiments() == []  # readers are never blocked by the writer (WAL)
        finally:
            release.set()
            holder.join()


@pytest.mark.postgres
def test_a_pooled_connection_that_idled_is_pinged_and_replaced_when_the_server_closed_it(monkeypatch):
    """PostgreSQL ends the storage's pooled connections (a restart does so); the next read, after the pool sat idle
    past PING_AFTER_IDLE_S, pings its connection, finds it gone and reads on a new one. (A connection in steady use
    is not pinged: a ping costs a round trip.)"""
    import os

    from sqlalchemy.engine import make_url

    from tests.hpo.storage.conftest import POSTGRES_SKIP_REASON, POSTGRES_URL_ENV, postgres_schema_url

    base_url = os.environ.get(POSTGRES_URL_ENV) or pytest.skip(POSTGRES_SKIP_REASON)
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 0.2)
    for schema_url in postgres_schema_url(base_url):
        url = make_url(schema_url).update_query_dict({"application_name": "hpo-ping-test"})
        with SqlStorage(url.render_as_string(hide_password=False), upgrade=True) as storage:
            experiment_id = storage.create_experiment("x", {}, "minimize")
            assert storage.trials_version(experiment_id) == 0  # both engines' connections are now in the pool
            admin = create_storage_engine(base_url)
            with admin.connect() as connection:
                ended = connection.exec_driver_sql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = 'hpo-ping-test'"
                ).scalar()
            admin.dispose()
            assert ended >= 1
            time.sleep(0.3)
            assert storage.trials_version(experiment_id) == 0 and storage.list_experiments()[0].name == "x"


def test_filtered_key_pages_read_one_index_range_not_the_experiment(tmp_path: Path):
    """SQLite's plan of every key page `list_trial_versions` reads, filtered by state, arm, both or two states: an
    index search on (experiment, [arm,] [state,] number), never a scan of the trials table nor a sort of it (two
    states: one range each, only their first `limit` rows merged and sorted)."""
    from hpo.trials import TrialState

    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    experiment_id = storage.create_experiment("x", {}, "minimize")
    statements: list[tuple[str, tuple]] = []
    event.listen(storage._engine, "before_cursor_execute",
                 lambda _c, _cur, sql, params, *_: statements.append((sql, params)))  # fmt: skip
    pages = {
        "state": {"state": TrialState.COMPLETED},
        "arm": {"arm": "lamb"},
        "state and arm": {"state": [TrialState.FAILED], "arm": "lamb"},
        "two states": {"state": [TrialState.COMPLETED, TrialState.FAILED]},
    }
    plans = {}
    for name, filters in pages.items():
        statements.clear()
        storage.list_trial_versions(experiment_id, after=10, limit=51, **filters)
        sql, params = next((sql, params) for sql, params in statements if sql.lstrip().startswith("SELECT"))
        with storage._engine.connect() as connection:
            plans[name] = [row[-1] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)]
    storage.close()
    index = {"state": "ix_trials_experiment_state_number", "arm": "ix_trials_experiment_arm_number",
             "state and arm": "ix_trials_experiment_arm_state_number",
             "two states": "ix_trials_experiment_state_number"}  # fmt: skip
    for name, plan in plans.items():
        assert any(step.startswith("SEARCH trials USING") and index[name] in step for step in plan), (name, plan)
        assert not any(step.startswith("SCAN trials") for step in plan), (name, plan)
        if name != "two states":
            assert not any("TEMP B-TREE" in step for step in plan), (name, plan)


@pytest.mark.postgres
def test_the_best_trial_is_read_from_the_objective_index_even_right_after_a_bulk_load():
    """Right after 50,000 trials are bulk-loaded (PostgreSQL has no statistics on them yet), the best-trial
    statement reads the index on (experiment, state, objective, ...) in objective order, not the one on (experiment,
    kind, state, ...) that matches more of its equalities: that one read and sorted every completed trial (70 ms at
    100,000). The earlier statement took that index from between 20,000 and 30,000 trials on."""
    from bench.storage import load_trials
    from tests.hpo.storage.conftest import POSTGRES_SKIP_REASON, POSTGRES_URL_ENV, postgres_schema_url

    base_url = os.environ.get(POSTGRES_URL_ENV)
    if not base_url:
        pytest.skip(POSTGRES_SKIP_REASON)
    schema = postgres_schema_url(base_url)
    database_url = next(schema)
    try:
        with SqlStorage(database_url, upgrade=True) as storage:
            experiment_id = storage.create_experiment("best", {}, "minimize")
        load_trials(database_url, experiment_id, 50_000)
        with SqlStorage(database_url) as storage:
            statements: list[tuple[str, object]] = []
            event.listen(storage._engine, "before_cursor_execute",
                         lambda _c, _cur, sql, params, *_: statements.append((sql, params)))  # fmt: skip
            assert storage.best_trial_id(experiment_id) is not None
            sql, params = next((sql, params) for sql, params in statements if "ORDER BY" in sql)
            with storage._engine.connect() as connection:
                plan = "\n".join(str(row[-1]) for row in connection.exec_driver_sql("EXPLAIN " + sql, params))
    finally:
        next(schema, None)  # drops the schema
    assert "ix_trials_experiment_state_objective" in plan, plan
    assert "ix_trials_experiment_kind_state_arm_target" not in plan, plan


def test_a_postgres_url_in_libpqs_spelling_is_read_as_postgresql_with_psycopg():
    """`postgres://` (libpq's and many hosts' spelling) was refused: SQLAlchemy no longer knows that name."""
    from hpo.storage.engine import create_storage_engine

    engine = create_storage_engine("postgres://user@db.example:5432/hpo")  # nothing connects until used
    assert (engine.dialect.name, engine.dialect.driver, engine.url.host, engine.url.database) == (
        "postgresql", "psycopg", "db.example", "hpo")  # fmt: skip
    engine.dispose()
