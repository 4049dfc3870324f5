"""A deadline on each statement (hpo/storage/deadline.py): a PostgreSQL server that stops answering without closing
its connections fails a statement after the deadline, not when it runs again, and the connection is replaced.

On a real throw-away cluster (tests/pgcluster.py): a statement that runs longer than the deadline (`pg_sleep`), and a
server whose processes are stopped (SIGSTOP: the port still accepts, the kernel acknowledges, nothing answers). Each
call that should give up runs in a thread joined with a generous limit: a call still waiting past it is the hang the
deadline exists to end (no test asserts how long a call took)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import OperationalError

import hpo.storage.deadline as deadline_module
import hpo.storage.engine as engine_module
from hpo.errors import DatabaseUnavailableError, NotFoundError, StorageError
from hpo.storage import SqlStorage
from hpo.storage.deadline import NoAnswer, StatementDeadline, quick_reads, unanswered
from hpo.storage.engine import PING_AFTER_IDLE_S, create_storage_engine
from hpo.storage.retry import without_waiting
from tests.pgcluster import PostgresCluster, why_no_cluster
from tests.polling import wait_for

HANG_S = 60  # a call that has not returned by then hangs
DEADLINE_S = 2.0  # for a call that may not wait (on an event loop, or without_waiting())
SLOW_DEADLINE_S = 4.0  # for the others


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    reason = why_no_cluster()
    if reason:
        pytest.skip(reason)
    with PostgresCluster.create() as made:
        yield made


@pytest.fixture
def quick_probe(monkeypatch) -> float:
    """The probe tries a server that missed a deadline every 0.1 s (not every second), and a pooled connection idle
    0.5 s (not a second) is pinged: the calls after a thaw and the wait for a ping are shorter, the deadlines the
    same. Returns the idle time after which a connection is pinged."""
    monkeypatch.setattr(deadline_module, "PROBE_INTERVAL_S", 0.1)
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 0.5)
    return engine_module.PING_AFTER_IDLE_S


def outcome(call: Callable[[], object]) -> BaseException | object:
    """What `call()` returned or raised, from a thread; fails the test when it is still waiting after HANG_S."""
    result: list = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"the call was still waiting for the database after {HANG_S} s"
    return result[0]


def once_answered(call: Callable[[], object]) -> BaseException | object:
    """The outcome of `call()` once the server answers again (a probe heard it: calls no longer fail at once)."""
    outcomes: list = []
    wait_for(lambda: not isinstance(outcomes.append(outcome(call)) or outcomes[-1], DatabaseUnavailableError),
             timeout_s=HANG_S)  # fmt: skip
    return outcomes[-1]


def on_an_event_loop(call: Callable[[], object]) -> object:
    """`call()` made on a running asyncio event loop, as the API's hottest reads are."""

    async def on_loop() -> object:
        return call()

    return asyncio.run(on_loop())


# waits out deadlines (make test-all); by default a missed deadline fails a read and the storage goes on in
# test_a_stopped_server_fails_a_read_at_its_deadline_then_every_call_at_once_until_a_probe_hears_it
@pytest.mark.slow
@pytest.mark.postgres
def test_a_statement_past_its_deadline_fails_as_no_answer_and_the_engine_goes_on(cluster):
    engine = create_storage_engine(cluster.url, deadline=StatementDeadline(DEADLINE_S, SLOW_DEADLINE_S))
    try:
        with engine.connect() as connection:
            assert connection.execute(text("select 1")).scalar() == 1

            def sleep() -> object:
                return connection.execute(text("select pg_sleep(600)")).scalar()

            failed = outcome(sleep)
        assert isinstance(failed, OperationalError) and failed.connection_invalidated
        assert isinstance(failed.orig, NoAnswer) and f"no answer within {DEADLINE_S:g} s" in str(failed)
        with engine.connect() as connection:  # a new connection: the cut one was invalidated
            assert connection.execute(text("select 2")).scalar() == 2
            connection.commit()
            time.sleep(DEADLINE_S * 1.5)  # a connection that waits for nothing is never cut, however long it sits
            assert connection.execute(text("select 4")).scalar() == 4
            assert outcome(lambda: connection.execute(text("select 3 from pg_sleep(0.2)")).scalar()) == 3
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_stopped_server_fails_a_read_at_its_deadline_then_every_call_at_once_until_a_probe_hears_it(
    cluster, quick_probe
):
    storage = SqlStorage(cluster.url, upgrade=True, deadlines=(DEADLINE_S, SLOW_DEADLINE_S))

    def read() -> object:
        return storage.get_experiment_by_name("no such experiment")

    def read_on_an_event_loop() -> object:
        return on_an_event_loop(read)

    def read_without_waiting() -> object:
        with without_waiting():
            return read()

    def hot_read_on_an_event_loop() -> object:  # the API's best config: one primary-key read without a Session
        return on_an_event_loop(lambda: storage.trials_version(1))

    try:
        assert isinstance(outcome(read), NotFoundError)  # answered
        cluster.freeze()
        try:
            failed = outcome(read_on_an_event_loop)  # tries, and gives up at the deadline of a call that may not wait
            assert isinstance(failed, DatabaseUnavailableError), failed
            assert f"gave no answer within {DEADLINE_S:g} s" in str(failed)
            # then no call tries until a probe hears
            for call in (read_on_an_event_loop, hot_read_on_an_event_loop, read_without_waiting, read):
                held = outcome(call)
                assert isinstance(held, DatabaseUnavailableError) and "has not answered since" in str(held), held
                # what happened and what a caller may expect, not a retry interval the probe does not keep (its
                # connection attempts wait out their timeout)
                assert "missed a deadline" in str(held) and "every 1 s" not in str(held), held
        finally:
            cluster.thaw()
        wait_for(lambda: isinstance(outcome(read), NotFoundError), timeout_s=HANG_S)  # the probe got an answer
        assert isinstance(outcome(read_on_an_event_loop), NotFoundError)
        time.sleep(quick_probe * 1.5)  # the pooled connection is now pinged before it is handed out
        cluster.freeze()
        try:
            failed = outcome(read)
        finally:
            cluster.thaw()
        # a ping is one round trip whatever the call: the short deadline, even for a call that may wait
        assert isinstance(failed, DatabaseUnavailableError) and f"within {DEADLINE_S:g} s" in str(failed)
        assert isinstance(failed.__cause__, OperationalError) and failed.__cause__.statement == "ping"
        wait_for(lambda: isinstance(outcome(read), NotFoundError), timeout_s=HANG_S)

        def quick_read() -> object:  # a one-row lookup from a thread that marks itself quick (the API's by name)
            with quick_reads():
                return read()

        assert isinstance(outcome(read), NotFoundError)  # the connection is in steady use: no ping next
        cluster.freeze()
        try:
            failed = outcome(quick_read)
        finally:
            cluster.thaw()
        assert isinstance(failed, DatabaseUnavailableError) and f"within {DEADLINE_S:g} s" in str(failed), failed
        assert failed.__cause__.statement != "ping"  # the statement's own deadline, the short one
        wait_for(lambda: isinstance(outcome(read), NotFoundError), timeout_s=HANG_S)
    finally:
        storage.close()


@pytest.mark.postgres
def test_closing_the_storage_ends_its_watchdog_thread(cluster):
    storage = SqlStorage(cluster.url, upgrade=True, deadlines=(DEADLINE_S, SLOW_DEADLINE_S))
    assert isinstance(outcome(lambda: storage.get_experiment_by_name("no such experiment")), NotFoundError)
    watchdog = storage._deadline._watchdog  # started by the first statement
    assert watchdog is not None and watchdog.is_alive()
    storage.close()
    watchdog.join(HANG_S)
    assert not watchdog.is_alive(), "the watchdog of a closed storage still runs (a thread per storage ever opened)"


@pytest.mark.slow  # waits out deadlines (make test-all); a stopped server's read and write stay in the default suite
@pytest.mark.postgres
def test_a_connection_cut_just_after_its_answer_came_is_not_handed_out_again(cluster):
    deadline = StatementDeadline(DEADLINE_S, SLOW_DEADLINE_S)
    engine = create_storage_engine(cluster.url, deadline=deadline).execution_options(isolation_level="AUTOCOMMIT")
    answered, late = deadline._answered, [True]

    def answered_late(conn: object) -> None:  # the thread that got the answer runs again after the deadline (the GIL)
        if late:
            late.pop()
            time.sleep(DEADLINE_S * 1.5)
        answered(conn)

    deadline._answered = answered_late
    try:
        with engine.connect() as connection:
            assert connection.execute(text("select 1")).scalar() == 1  # answered, then cut at the deadline
        with engine.connect() as connection:  # not the cut connection: no rollback went out to notice it
            assert outcome(lambda: connection.execute(text("select 2")).scalar()) == 2
    finally:
        engine.dispose()


# waits out deadlines (make test-all); by default a connection timeout counts as unanswered in
# test_a_storage_whose_first_connection_gets_no_answer_fails_and_leaves_no_probe_behind, and calls are held after a
# missed deadline in test_a_stopped_server_fails_a_read_at_its_deadline_then_every_call_at_once_until_a_probe_hears_it
@pytest.mark.slow
@pytest.mark.postgres
def test_a_connection_attempt_that_times_out_holds_calls_as_a_missed_deadline_does(cluster):
    storage = SqlStorage(cluster.url, upgrade=True, deadlines=(DEADLINE_S, SLOW_DEADLINE_S))

    def read_on_an_event_loop() -> object:
        return on_an_event_loop(lambda: storage.get_experiment_by_name("no such experiment"))

    try:
        storage._engine.pool.dispose()  # no pooled connection: the next read connects (the pool's were in use)
        cluster.freeze()
        try:
            failed = outcome(read_on_an_event_loop)  # the stopped server accepts the connection but never answers
            assert isinstance(failed, DatabaseUnavailableError) and "timeout" in str(failed), failed
            held = outcome(read_on_an_event_loop)  # not another connection attempt, holding the event loop again
            assert isinstance(held, DatabaseUnavailableError) and "has not answered since" in str(held), held
        finally:
            cluster.thaw()
        wait_for(lambda: isinstance(outcome(read_on_an_event_loop), NotFoundError), timeout_s=HANG_S)
    finally:
        storage.close()


def test_a_storage_whose_first_connection_gets_no_answer_fails_and_leaves_no_probe_behind():
    """A port that accepts connections and never answers (no cluster needed): opening the storage fails as a timeout
    (unanswered, which the API holds its requests after: server.storage), and the probe that the attempt started
    ends with it, instead of trying a storage nobody holds every second until a server answers there."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    url = f"postgresql+psycopg://hpo@127.0.0.1:{listener.getsockname()[1]}/hpo"
    try:
        failed = outcome(lambda: SqlStorage(url, read_only=True, deadlines=(DEADLINE_S, SLOW_DEADLINE_S)))
    finally:
        listener.close()
        for connection in accepted:
            connection.close()
    assert isinstance(failed, DatabaseUnavailableError) and "timeout" in str(failed), failed
    assert unanswered(failed)
    assert [t for t in threading.enumerate() if t.name == "hpo-database-probe"] == []


def test_freezing_a_cluster_passes_over_a_backend_that_exited_meanwhile(cluster, monkeypatch):
    gone = subprocess.Popen(["true"])  # a closed connection's backend, listed as the postmaster's child, then gone
    gone.wait()
    listed = cluster._processes()
    monkeypatch.setattr(cluster, "_processes", lambda: [*listed, gone.pid])
    cluster.freeze()  # no ProcessLookupError, and the others stopped
    try:
        # a signal is delivered asynchronously: a process stops (T) a moment after kill() returns; Z, "": a backend
        # that exited meanwhile
        wait_for(lambda: all(_state(pid) in ("T", "Z", "") for pid in listed), timeout_s=HANG_S)
    finally:
        cluster.thaw()
    wait_for(lambda: all(_state(pid) != "T" for pid in listed), timeout_s=HANG_S)


def _state(pid: int) -> str:
    """A process's state letter from /proc (T: stopped, Z: exited, not yet waited for), "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return ""


def freeze_as_it_ends(cluster: PostgresCluster, engine: Engine, end: str) -> None:
    """Stop the cluster's processes as the next `end` ("commit" or "rollback") of a transaction that sent a statement
    on `engine` is about to go out: a server that stops answering between a write's last statement and its end."""

    pending = [True]

    def freeze(connection: Connection) -> None:
        if pending and connection.connection.dbapi_connection.info.transaction_status != TransactionStatus.IDLE:
            pending.pop()
            cluster.freeze()

    event.listen(engine, end, freeze)


@pytest.mark.postgres
def test_a_server_that_stops_before_a_writes_commit_fails_the_write_at_its_deadline(cluster, quick_probe):
    storage = SqlStorage(cluster.url, upgrade=True, deadlines=(DEADLINE_S, SLOW_DEADLINE_S))
    try:
        experiment_id = storage.create_experiment("stopped before its commit", {}, "minimize")
        freeze_as_it_ends(cluster, storage._engine, "commit")
        try:
            # the API's one write (POST /experiments/{name}/stop), in its thread pool: the long deadline
            failed = outcome(lambda: storage.request_stop(experiment_id))
        finally:
            cluster.thaw()
        assert isinstance(failed, DatabaseUnavailableError), failed
        assert f"gave no answer within {SLOW_DEADLINE_S:g} s" in str(failed), failed
        assert once_answered(lambda: storage.request_stop(experiment_id)) is None
        assert storage.is_stop_requested(experiment_id)
    finally:
        storage.close()


@pytest.mark.slow  # waits out deadlines (make test-all); a stopped server's read and write stay in the default suite
@pytest.mark.postgres
def test_a_server_that_stops_before_a_failed_writes_rollback_fails_the_write_at_its_deadline(cluster):
    storage = SqlStorage(cluster.url, upgrade=True, deadlines=(DEADLINE_S, SLOW_DEADLINE_S))
    try:
        storage.create_experiment("stopped before its rollback", {}, "minimize")
        freeze_as_it_ends(cluster, storage._engine, "rollback")
        try:  # the name is taken: the insert fails, and its transaction is rolled back
            failed = outcome(lambda: storage.create_experiment("stopped before its rollback", {}, "minimize"))
        finally:
            cluster.thaw()
        assert isinstance(failed, DatabaseUnavailableError), failed
        assert f"gave no answer within {SLOW_DEADLINE_S:g} s" in str(failed), failed

        again = once_answered(lambda: storage.create_experiment("stopped before its rollback", {}, "minimize"))
        assert isinstance(again, StorageError) and "already exists" in str(again), again
    finally:
        storage.close()


@pytest.mark.slow  # waits out deadlines (make test-all); a stopped server's read and write stay in the default suite
@pytest.mark.postgres
def test_a_connection_cut_just_after_its_ping_answered_is_not_handed_out(cluster):
    engine = create_storage_engine(cluster.url, deadline=StatementDeadline(DEADLINE_S, SLOW_DEADLINE_S))
    engine = engine.execution_options(isolation_level="AUTOCOMMIT")
    ping, late = engine.dialect.do_ping, [True]

    def ping_answered_late(dbapi_connection: object) -> bool:  # the pinging thread runs again after the deadline
        answered = ping(dbapi_connection)
        if late:
            late.pop()
            time.sleep(DEADLINE_S * 1.5)
        return answered

    engine.dialect.do_ping = ping_answered_late
    try:
        with engine.connect() as connection:
            assert connection.execute(text("select 1")).scalar() == 1
        time.sleep(PING_AFTER_IDLE_S * 1.5)  # the pooled connection is now pinged before it is handed out
        with engine.connect() as connection:  # pinged, answered, then cut at the deadline
            assert not late
            assert outcome(lambda: connection.execute(text("select 2")).scalar()) == 2
    finally:
        engine.dispose()


@pytest.mark.slow  # waits out deadlines (make test-all); a stopped server's read and write stay in the default suite
@pytest.mark.postgres
def test_closing_the_storage_while_a_probe_connects_leaves_no_connection_open(cluster):
    name = "hpo-probe-at-close"
    storage = SqlStorage(f"{cluster.url}?application_name={name}", upgrade=True,
                         deadlines=(DEADLINE_S, SLOW_DEADLINE_S))  # fmt: skip
    engine = storage._engine
    connecting, disposed = threading.Event(), threading.Event()

    def probe_connects(*_: object) -> None:  # the probe's connection attempt goes on once the engine is disposed
        if threading.current_thread() is storage._deadline._prober:
            connecting.set()
            disposed.wait(DEADLINE_S)  # a close that waits for the probe disposes only after it

    event.listen(engine, "do_connect", probe_connects)
    event.listen(engine, "engine_disposed", lambda *_: disposed.set())
    try:
        cluster.freeze()
        try:
            # a missed deadline (the short one): the cut connection is replaced, so the probe makes a new one
            failed = outcome(lambda: on_an_event_loop(lambda: storage.get_experiment_by_name("no such experiment")))
        finally:
            cluster.thaw()
        assert isinstance(failed, DatabaseUnavailableError), failed
        assert connecting.wait(HANG_S), "no probe tried the server after a missed deadline"
        prober = storage._deadline._prober
    finally:
        storage.close()
    assert prober is not None
    prober.join(HANG_S)
    assert not prober.is_alive()
    with create_engine(cluster.url).connect() as connection:
        left = connection.execute(text("select count(*) from pg_stat_activity where application_name = :name"),
                                  {"name": name}).scalar()  # fmt: skip
    assert left == 0, "a connection of the closed storage is still open"
