"""Waiting out an unreachable database (hpo/storage/retry.py): which errors count as an outage, the pauses between
tries, the bound, and a storage that waits through a real lock of its SQLite file.

The errors classified are real ones: a TCP port nobody listens on, a database name the PostgreSQL server does not
have, a SQLite file another connection holds locked. The retry loop runs on a clock of its own in the tests of its
arithmetic (no test asserts a duration measured on the wall clock).
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError

from hpo.errors import BadDatabaseError, DatabaseUnavailableError, HpoError, NotFoundError
from hpo.storage import SqlStorage
from hpo.storage import engine as engine_module
from hpo.storage.engine import is_transient, storage_error
from hpo.storage.retry import (
    DEFAULT_OUTAGE_S,
    DEFAULT_STATEMENT_S,
    MAX_DELAY_S,
    OUTAGE_ENV,
    QUICK_STATEMENT_S,
    STALE_FAILURE_S,
    STATEMENT_ENV,
    Outage,
    as_replay,
    backoff,
    call_with_retry,
    outage_bound,
    replaying,
    without_waiting,
    writer_deadlines,
)
from hpo.trial.launch import free_port
from tests.hpo.storage.conftest import POSTGRES_SKIP_REASON, POSTGRES_URL_ENV, postgres_schema_url

# -- which errors are an outage ----------------------------------------------------------------------------------


def connect_error(url: str) -> OperationalError:
    engine = create_engine(url, connect_args={"connect_timeout": 5} if url.startswith("postgresql") else {})
    try:
        with pytest.raises(OperationalError) as raised, engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    finally:
        engine.dispose()
    return raised.value


def test_a_server_that_refuses_connections_is_an_outage():
    error = connect_error(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/hpo")
    assert "connection refused" in str(error.orig).lower()
    assert is_transient(error)
    translated = storage_error(error, "postgresql+psycopg://postgres:secret@127.0.0.1/hpo")
    assert isinstance(translated, DatabaseUnavailableError) and "secret" not in str(translated)


@pytest.mark.postgres
def test_a_database_name_the_server_does_not_have_is_not_an_outage():
    base_url = os.environ.get(POSTGRES_URL_ENV)
    if not base_url:
        pytest.skip(POSTGRES_SKIP_REASON)
    error = connect_error(make_url(base_url).set(database="no_such_database_here").render_as_string(False))
    assert "does not exist" in str(error.orig)
    assert not is_transient(error)
    translated = storage_error(error, base_url)
    assert type(translated) is BadDatabaseError and "names an existing database and user" in str(translated)


@pytest.mark.postgres
def test_a_deadlock_the_server_broke_is_said_as_one_not_as_a_server_to_check():
    """Two transactions each wait for the other's row: PostgreSQL ends one ("deadlock detected"). It was translated
    into the advice for a server that cannot be reached; it says what happened and to run the command again."""
    base_url = os.environ.get(POSTGRES_URL_ENV)
    if not base_url:
        pytest.skip(POSTGRES_SKIP_REASON)
    url = next(schema := postgres_schema_url(base_url))
    engine = create_engine(url)
    errors: list[BaseException] = []
    both_hold = threading.Barrier(2)
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE t (x INTEGER PRIMARY KEY, y INTEGER)"))
            connection.execute(text("INSERT INTO t VALUES (1, 0), (2, 0)"))

        def cross(first: int, second: int) -> None:
            try:
                with engine.begin() as connection:
                    connection.execute(text("UPDATE t SET y = y + 1 WHERE x = :x"), {"x": first})
                    both_hold.wait(timeout=30)
                    connection.execute(text("UPDATE t SET y = y + 1 WHERE x = :x"), {"x": second})
            except OperationalError as e:
                errors.append(e)

        threads = [threading.Thread(target=cross, args=pair) for pair in ((1, 2), (2, 1))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        engine.dispose()
        next(schema, None)  # drops the schema
    (error,) = errors
    assert "deadlock detected" in str(error.orig)
    translated = str(storage_error(error, url))
    assert "ended this command's transaction to break a deadlock with another client's" in translated
    assert "run the command again" in translated and "Check that the database server is running" not in translated


def test_a_locked_sqlite_file_is_an_outage_and_a_missing_table_is_not(tmp_path: Path):
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
    holder.execute("BEGIN EXCLUSIVE")
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.05})
    try:
        with pytest.raises(OperationalError) as locked, engine.begin() as connection:
            connection.execute(text("INSERT INTO t VALUES (1)"))
        holder.execute("ROLLBACK")
        with pytest.raises(OperationalError) as missing, engine.begin() as connection:
            connection.execute(text("SELECT * FROM no_such_table"))
        with pytest.raises(IntegrityError) as refused, engine.begin() as connection:
            connection.execute(text("INSERT INTO t VALUES (1), (1)"))
    finally:
        engine.dispose()
        holder.close()
    assert "database is locked" in str(locked.value) and is_transient(locked.value)
    assert not is_transient(missing.value) and not is_transient(refused.value)


def test_an_sqlite_file_that_fails_is_said_as_a_file_not_as_a_server_to_check():
    """SQLite's "disk I/O error" (its file's disk, or a file changed under it) was told to check the database server,
    its host, port and user."""
    error = OperationalError("INSERT INTO trials ...", {}, sqlite3.OperationalError("disk I/O error"))
    translated = str(storage_error(error, "sqlite:////srv/hpo/hpo.db"))
    assert translated.startswith("cannot use the SQLite file of sqlite:////srv/hpo/hpo.db: disk I/O error. Check the")
    assert "server" not in translated and "host" not in translated and "-wal and -shm" in translated


def test_the_statement_deadline_of_a_command_that_writes_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(STATEMENT_ENV, raising=False)
    assert writer_deadlines() == (QUICK_STATEMENT_S, DEFAULT_STATEMENT_S) == (10, 60)
    monkeypatch.setenv(STATEMENT_ENV, "3")
    assert writer_deadlines() == (3, 3)
    for bad in ("a minute", "0", "-1", "inf"):
        monkeypatch.setenv(STATEMENT_ENV, bad)
        with pytest.raises(HpoError, match=f"{STATEMENT_ENV}={bad!r}: expected the seconds a statement waits"):
            writer_deadlines()


# -- the pauses and the bound ------------------------------------------------------------------------------------


def test_pauses_double_up_to_the_cap_each_drawn_between_half_and_all_of_it():
    pauses = backoff(random.Random(7), base_s=0.25, cap_s=MAX_DELAY_S)
    drawn = [next(pauses) for _ in range(9)]
    ceilings = [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]
    again = random.Random(7)
    assert drawn == [again.uniform(c / 2, c) for c in ceilings]
    assert all(c / 2 <= d <= c for d, c in zip(drawn, ceilings, strict=True))


def test_the_bound_comes_from_the_environment_first_then_the_file_then_the_default(monkeypatch):
    monkeypatch.delenv(OUTAGE_ENV, raising=False)
    assert outage_bound() == DEFAULT_OUTAGE_S == 600
    assert outage_bound(45) == 45
    monkeypatch.setenv(OUTAGE_ENV, "12.5")
    assert outage_bound(45) == 12.5
    monkeypatch.setenv(OUTAGE_ENV, "0")
    assert outage_bound(45) == 0
    for bad in ("ten minutes", "-1", "inf"):
        monkeypatch.setenv(OUTAGE_ENV, bad)
        with pytest.raises(HpoError, match=f"{OUTAGE_ENV}={bad!r}: expected the seconds"):
            outage_bound(45)


class FakeTime:
    """The retry loop's clock and sleep: sleeping moves the clock (the loop's arithmetic, not the wall clock)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Away:
    """A call whose database is away until `back_at` (clock seconds); records whether each try was a replay."""

    def __init__(self, time: FakeTime, back_at: float) -> None:
        self.time, self.back_at = time, back_at
        self.tries: list[bool] = []

    def __call__(self) -> str:
        self.tries.append(replaying())
        if self.time.now < self.back_at:
            raise DatabaseUnavailableError("cannot use the database: connection refused")
        return "stored"


def retry(call, time: FakeTime, bound_s: float, outage: Outage | None = None, stop=lambda: None):
    return call_with_retry(call, outage or Outage(time.clock), bound_s, random.Random(0), stop, time.sleep, time.clock)


def test_a_call_is_retried_until_the_database_is_back_and_later_tries_are_replays():
    time = FakeTime()
    outage = Outage(time.clock)
    away = Away(time, back_at=time.now + 20)
    assert retry(away, time, bound_s=600, outage=outage) == "stored"
    assert away.tries[0] is False and set(away.tries[1:]) == {True} and len(away.tries) > 2
    assert 20 <= time.now - 1000 <= 20 + MAX_DELAY_S  # back within one pause of its return
    assert outage.unreachable_for() is None  # it answered: the outage is over


def test_past_the_bound_a_call_raises_saying_for_how_long():
    time = FakeTime()
    away = Away(time, back_at=float("inf"))
    with pytest.raises(DatabaseUnavailableError, match=r"unreachable for 30 s, the longest this process waits "
                                                       r"\(database.outage_s = 30 s"):  # fmt: skip
        retry(away, time, bound_s=30)
    assert time.now - 1000 == pytest.approx(30)  # the last pause ends at the bound: no wait beyond it


def test_the_bound_counts_from_the_first_failure_of_any_call_on_the_storage():
    time = FakeTime()
    outage = Outage(time.clock)
    outage.failed(started=time.now - 25)  # another thread met the outage 25 s ago
    away = Away(time, back_at=float("inf"))
    with pytest.raises(DatabaseUnavailableError, match="unreachable for 30 s"):
        retry(away, time, bound_s=30, outage=outage)
    assert time.now - 1000 == pytest.approx(5)


def test_without_waiting_a_call_tries_once_and_the_outage_still_counts():
    time = FakeTime()
    outage = Outage(time.clock)
    away = Away(time, back_at=float("inf"))
    with without_waiting(), pytest.raises(DatabaseUnavailableError, match="connection refused"):
        retry(away, time, bound_s=600, outage=outage)
    assert away.tries == [False] and time.slept == []
    time.now += 42
    assert outage.unreachable_for() == 42


def test_a_stop_gives_up_waiting_at_once():
    time = FakeTime()
    away = Away(time, back_at=float("inf"))
    stop = lambda: "the controller was terminated (SIGTERM)" if time.now >= 1003 else None  # noqa: E731
    with pytest.raises(DatabaseUnavailableError, match=r"Stopped waiting for it: the controller was terminated"):
        retry(away, time, bound_s=600, stop=stop)
    assert 1003 <= time.now < 1003.5  # within one look at stop()


def test_a_refusal_is_an_answer_it_ends_the_outage_and_is_not_retried():
    time = FakeTime()
    outage = Outage(time.clock)
    outage.failed(started=time.now)
    tries = []

    def refused():
        tries.append(1)
        raise NotFoundError("experiment 7 does not exist")

    with pytest.raises(NotFoundError):
        retry(refused, time, bound_s=600, outage=outage)
    assert tries == [1] and outage.unreachable_for() is None


def test_reads_that_answer_do_not_end_an_outage_of_writes():
    """An SQLite file that another writer keeps locked still answers reads (WAL): the progress view's reads between
    a write's tries must not restart the write's outage, or the write waits past its bound for as long as the lock
    lasts. A write that gets through ends both."""
    time = FakeTime()
    outage = Outage(time.clock)
    locked = Away(time, back_at=float("inf"))
    reads: list[str] = []

    def read_between_tries() -> None:  # another thread of the process reads while the write waits
        if len(reads) > 1000:
            pytest.fail("the write never reached its bound: the reads kept ending its outage")
        reads.append(call_with_retry(lambda: "read", outage, 30, random.Random(0), wrote=lambda: False))

    with pytest.raises(DatabaseUnavailableError, match="unreachable for 30 s"):
        retry(locked, time, bound_s=30, outage=outage, stop=lambda: read_between_tries())
    assert reads and time.now - 1000 == pytest.approx(30)
    assert outage.unreachable_for() == pytest.approx(30)  # the reads answered, the writes still do not
    outage.failed(started=time.now, write=False)
    time.now += 5
    assert outage.unreachable_for() == pytest.approx(35)  # the longest outage of the two
    outage.ended(write=False)
    assert outage.unreachable_for() == pytest.approx(35)
    outage.ended(write=True)
    assert outage.unreachable_for() is None


def test_a_write_counts_from_the_first_failed_read_and_a_lone_old_failure_starts_no_outage():
    """A server that is down fails reads first (the progress view's), then the controller's write: the write's bound
    counts from the first read that failed. A write that failed once, hours before, with no write waiting since
    (a server that writes rarely), does not make the next failure hours long."""
    time = FakeTime()
    outage = Outage(time.clock)
    outage.failed(started=time.now, write=False)
    time.now += 5
    assert outage.failed(started=time.now, write=True) == pytest.approx(5)
    outage.ended(write=True)
    assert outage.failed(started=time.now, write=True) == 0  # one failed write, then reads that answer for 3 h
    outage.ended(write=False)
    time.now += STALE_FAILURE_S + 3 * 3600
    assert outage.failed(started=time.now - 0.5, write=True) == pytest.approx(0.5)
    time.now += STALE_FAILURE_S / 2  # a write waiting on it fails again within the limit: the same outage
    assert outage.failed(started=time.now, write=True) == pytest.approx(0.5 + STALE_FAILURE_S / 2)


def test_replaying_is_false_outside_a_retry():
    assert replaying() is False
    with as_replay():
        assert replaying() is True
    assert replaying() is False


# -- a storage through a real lock -------------------------------------------------------------------------------


@pytest.fixture
def short_sqlite_waits(monkeypatch):
    """SQLite waits 50 ms for a lock instead of 10 s: past that, the lock is an outage for the storage's retry."""
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 50)


def hold_lock(path: Path, release: threading.Event) -> threading.Thread:
    """Another process's view: a connection that holds the SQLite write lock until `release` is set."""
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


def test_a_storage_waits_for_a_locked_database_and_says_for_how_long(short_sqlite_waits, tmp_path: Path):
    path = tmp_path / "hpo.db"
    with SqlStorage(f"sqlite:///{path}", upgrade=True) as storage:
        storage.wait_for_outages(60)
        release = threading.Event()
        holder = hold_lock(path, release)
        seen: list[float | None] = []

        def release_once_waiting() -> None:  # the writer below is then in its retry, not in SQLite's busy wait
            while (waited := storage.unreachable_for()) is None:
                threading.Event().wait(0.01)
            seen.append(waited)
            release.set()

        watcher = threading.Thread(target=release_once_waiting)
        watcher.start()
        experiment_id = storage.create_experiment("patient", {}, "minimize")
        watcher.join()
        holder.join()
        assert [e.name for e in storage.list_experiments()] == ["patient"]
        assert storage.get_experiment(experiment_id).name == "patient"
        assert seen and seen[0] >= 0 and storage.unreachable_for() is None


def test_a_storage_gives_up_at_its_bound_while_its_reads_still_answer(short_sqlite_waits, tmp_path: Path):
    """The file locked by another writer: the storage's reads answer (WAL) while a write waits, as the progress
    view's do every few seconds, and the write still gives up at its bound."""
    path = tmp_path / "hpo.db"
    with SqlStorage(f"sqlite:///{path}", upgrade=True) as storage:
        reads: list[int] = []

        def read_while_waiting() -> str | None:  # called at every step of the write's pauses
            reads.append(len(storage.list_experiments()))
            return "the write never reached its bound" if len(reads) > 200 else None

        storage.wait_for_outages(0.5, stop=read_while_waiting)
        release = threading.Event()
        holder = hold_lock(path, release)
        try:
            gives_up = r"stayed locked by another writer.*unreachable for \d+ s, the longest"
            with pytest.raises(DatabaseUnavailableError, match=gives_up):
                storage.create_experiment("impatient", {}, "minimize")
            assert reads and set(reads) == {0}
            assert storage.unreachable_for() is not None  # the reads answered; the write did not get through
        finally:
            release.set()
            holder.join()
        storage.create_experiment("patient", {}, "minimize")
        assert storage.unreachable_for() is None


def test_a_call_on_a_running_event_loop_never_waits():
    time = FakeTime()
    away = Away(time, back_at=float("inf"))

    async def on_the_loop():
        retry(away, time, bound_s=600)

    with pytest.raises(DatabaseUnavailableError, match="connection refused"):
        asyncio.run(on_the_loop())
    assert away.tries == [False] and time.slept == []


def test_a_full_disk_under_a_sqlite_file_is_an_outage_that_says_to_free_space(tmp_path):
    """SQLite's own error when it cannot grow its file (here at its page limit, as at a full disk): the commands
    wait for it as for a database away, and the message speaks of the disk, not of a server."""
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    engine = create_engine(url)
    try:
        with pytest.raises(OperationalError) as raised, engine.begin() as connection:
            connection.execute(text("CREATE TABLE t (b BLOB)"))
            connection.execute(text("PRAGMA max_page_count = 4"))
            connection.execute(text("INSERT INTO t VALUES (zeroblob(1000000))"))
    finally:
        engine.dispose()
    assert "database or disk is full" in str(raised.value.orig)
    assert is_transient(raised.value)
    translated = storage_error(raised.value, url)
    assert isinstance(translated, DatabaseUnavailableError)
    assert str(translated).startswith(f"the disk of the database {url} is full: database or disk is full. Free space")
    assert translated.state == "out of disk space"  # what the progress line says ("database out of disk space for")
    assert "database server" not in str(translated)
