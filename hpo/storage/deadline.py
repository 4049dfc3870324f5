"""A deadline on each statement sent to a database server, for the API: a server that stops answering without closing
its connections (its process stopped or hung while its machine still answers on the network, so that TCP's own
timeouts never fire: the kernel acknowledges what is sent) fails a statement after its deadline instead of holding
its caller until the server runs again. The API reads its hottest answers on its event loop, so one such statement
would hold every request, `/health` too.

Two deadlines: `seconds` for a call that may not wait (`quick()` true: on the API's event loop, where reads are
primary-key lookups, and `/health`), `slow_seconds` for the others (a report's reads of 100,000 trials take
seconds), which hold only their own thread of the API's pool. A pooled connection's ping and a connection attempt
take `seconds` whatever the call (`connect_timeout`, set by the engine; psycopg's least is 2 s).

A watchdog thread shuts down the socket of a connection whose statement, ping, commit or rollback has run past its
deadline (a commit or rollback is watched when it sends anything: a server that stops between a write's last
statement and its COMMIT would otherwise hold its caller until it runs again). The driver's wait then ends as on a
lost connection: SQLAlchemy invalidates the connection and raises an OperationalError that says no answer came in
time, which the storage reports as DatabaseUnavailableError (an API request answers 503 with Retry-After). A
connection cut just as its answer came keeps its answer and is replaced, never handed out again.

After a missed deadline, or a connection attempt that timed out, the server counts as not answering (`held()`) and
the storage fails its calls at once (each would wait out a deadline again, on the event loop for the hottest reads),
until a probe gets an answer: a thread of this module tries `SELECT 1` on a new connection every PROBE_INTERVAL_S,
under the short deadline. Closing waits for a probe under way, so that the engine's disposal closes its connection.

Only for PostgreSQL: a SQLite file answers or reports itself locked (its busy timeout bounds the wait).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DisconnectionError, OperationalError

PROBE_INTERVAL_S = 1.0  # between two tries of a server that missed a deadline
# close() waits this long at most for a probe under way: its connection attempt and its statement end within
# seconds (their deadlines), a host name's lookup that hangs does not
CLOSE_WAIT_S = 30.0
_CUT = "hpo_deadline_cut"  # in a pooled connection's `info`: its socket was shut down after its answer came
_IDLE = 0  # libpq's PQTRANS_IDLE (psycopg's pq.TransactionStatus.IDLE): no transaction open, nothing to end
TICK_SHARE = 0.1  # the watchdog looks at the connections waiting every tenth of the shorter deadline


_quick: ContextVar[bool] = ContextVar("hpo_storage_quick", default=False)


@contextlib.contextmanager
def quick_reads() -> Iterator[None]:
    """The statements inside take the short deadline wherever they run: a one-row lookup in a thread (the API's
    first lookup of an experiment by name) must not wait as long as a report's reads of a whole experiment."""
    token = _quick.set(True)
    try:
        yield
    finally:
        _quick.reset(token)


class NoAnswer(Exception):
    """The reason a statement failed: the server did not answer within its deadline."""


class StatementDeadline:
    """Shut down a connection that has waited its deadline for one answer (see the module docstring)."""

    def __init__(self, seconds: float, slow_seconds: float, quick: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.seconds, self.slow_seconds, self.quick, self._clock = seconds, slow_seconds, quick, clock
        self._tick = min(seconds, slow_seconds) * TICK_SHARE  # a missed deadline is cut at most this late
        # id() of a driver connection waiting for an answer -> its deadline, its socket's file descriptor (read at
        # the start: a connection whose socket was shut down may no longer say) and the deadline's seconds
        self._waiting: dict[int, tuple[float, int, float]] = {}
        self._cut: dict[int, float] = {}  # id() of connections cut, with their deadline's seconds, until their error
        self._missed_at: float | None = None  # when a deadline was missed, None once an answer came since
        self._changed = threading.Condition()
        self._watchdog: threading.Thread | None = None
        self._prober: threading.Thread | None = None
        self._probing = threading.local()  # `active` in the prober's thread: its statements take the short deadline
        self._engine: Engine | None = None
        self._closed = False

    def install(self, engine: Engine) -> None:
        """Watch every statement of `engine` (a PostgreSQL engine), and every commit and rollback that sends
        anything: a server that stops between a write's last statement and its COMMIT would hold its caller as long
        as a statement would. SQLAlchemy has no event at a commit's end, so the dialect's own `do_commit` and
        `do_rollback` are wrapped (they serve the engine's connections and its pool's rollback at a connection's
        return). The pool's pings are watched by `watch()`."""
        self._engine = engine
        event.listen(engine, "before_cursor_execute", lambda conn, *_: self._begin(conn))
        event.listen(engine, "after_cursor_execute", lambda conn, *_: self._answered(conn))
        event.listen(engine, "checkin", self._checked_in)
        event.listen(engine, "handle_error", self._failed, retval=True)
        dialect = engine.dialect  # the engine's own (create_engine makes one per engine)
        dialect.do_commit = self._ending(dialect.do_commit)  # type: ignore[method-assign]
        dialect.do_rollback = self._ending(dialect.do_rollback)  # type: ignore[method-assign]

    def close(self) -> None:
        """Stop probing, and the watchdog once no statement waits (the storage is closed: a thread left ticking
        for each storage ever opened would add up in a long-lived process). A probe under way is waited for, so that
        the engine's disposal that follows closes its connection too (one that came after would stay open, in a
        pool nobody uses): it ends within a connection attempt's timeout and the short deadline (CLOSE_WAIT_S at
        most)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()  # a probe between two tries ends now
            prober = self._prober
        if prober is not None and prober is not threading.current_thread():
            prober.join(CLOSE_WAIT_S)

    @contextlib.contextmanager
    def watch(self, dbapi_connection: Any) -> Iterator[None]:
        """A call on `dbapi_connection` outside SQLAlchemy's statements (the pool's ping) under the short deadline,
        whatever the caller (one round trip: a server that answers at all answers it at once, and a call in the
        thread pool would otherwise wait the long one for it); a missed one raises NoAnswer. A connection cut just
        after its answer came raises DisconnectionError, which has the pool replace it (see `_answered`)."""
        seconds = self._start(dbapi_connection, quick=True)
        try:
            yield
        except Exception as exc:
            if self._end(dbapi_connection) is not None:
                raise NoAnswer(self.reason(seconds)) from exc
            raise
        else:
            cut = self._end(dbapi_connection)
            self._heard()
            if cut is not None:
                # The answer came, then the watchdog cut the socket before this thread ran again (the GIL, a busy
                # machine), as for a statement (`_answered`); here the connection is about to be handed out, so
                # it is replaced now: one cut socket, and the caller's next statement would fail. _end() reads
                # and clears the cut under the watchdog's lock, so a cut is seen either here or by the ping's error
                raise DisconnectionError("a pooled connection was cut for its deadline just after its ping answered")

    def held(self) -> str | None:
        """Why calls should not try the server now (it missed a deadline and no probe got an answer since), or
        None."""
        missed = self._missed_at  # one read of one attribute needs no lock: every read of the API asks
        if missed is None:
            return None
        return (f"the database server missed a deadline {self._clock() - missed:.0f} s ago and has not answered "
                "since (its process may be stopped or hung); it is tried again in the background, and calls go "
                "through as soon as it answers")  # fmt: skip

    @staticmethod
    def reason(seconds: float) -> str:
        return (f"the database server gave no answer within {seconds:g} s (its process may be stopped or hung, or its "
                "disk not answering)")  # fmt: skip

    # -- the events ---------------------------------------------------------------------------------------------

    def _begin(self, conn: Any) -> None:
        self._start(conn.connection.dbapi_connection)

    def _answered(self, conn: Any) -> None:
        if self._end(conn.connection.dbapi_connection) is not None:
            # Cut after its answer came, before this thread ran again (the GIL, a busy machine): the answer stands,
            # the connection is gone, and a pool that sends nothing at its return (autocommit) would hand it out again
            conn.connection.info[_CUT] = True
        self._heard()

    def _ending(self, end: Callable[[Any], None]) -> Callable[[Any], None]:
        """The dialect's `do_commit` or `do_rollback` (`end`), watched when the driver sends anything: psycopg
        sends nothing when no transaction is open (the rollback of an autocommit connection as it closes, after each
        of the API's hottest reads), and that case costs a few attribute reads, no lock. Cut for its deadline, it
        raises NoAnswer, which `_failed` reports as it does a statement's; cut just after its answer came, the
        commit stands and the connection is replaced at its return, as for a statement (`_answered`)."""

        def ending(connection: Any) -> None:  # a pool's connection (SQLAlchemy's proxy), or a driver's
            dbapi_connection = getattr(connection, "dbapi_connection", connection)
            pgconn = getattr(dbapi_connection, "pgconn", None)  # psycopg's; another driver's end is always watched
            if pgconn is not None and pgconn.transaction_status == _IDLE:
                return end(connection)
            seconds = self._start(dbapi_connection)
            try:
                end(connection)
            except Exception as exc:
                if self._end(dbapi_connection) is not None:
                    raise NoAnswer(self.reason(seconds)) from exc
                raise
            except BaseException:  # interrupted: no longer waiting
                self._end(dbapi_connection)
                raise
            if self._end(dbapi_connection) is not None:
                info = getattr(connection, "info", None)  # the pool record's (a driver connection's own info is not)
                if isinstance(info, dict):
                    info[_CUT] = True
            self._heard()

        return ending

    def _checked_in(self, dbapi_connection: Any, record: Any) -> None:
        """A connection back in the pool: a statement that neither answered nor failed (interrupted) is no longer
        watched, and a connection cut without an error to invalidate it is replaced at its next checkout."""
        if (dbapi_connection is not None and self._end(dbapi_connection) is not None) or record.info.pop(_CUT, False):
            record.invalidate()

    def _failed(self, context: Any) -> BaseException | None:
        """A statement's error: OperationalError(NoAnswer) in its place when it was cut for its deadline. A
        connection attempt that timed out (a stopped server's port still accepts) holds calls as a missed deadline
        does: every call that needs a new connection would otherwise wait its timeout again, on the event loop too,
        while the pool's connections are busy with statements under the long deadline."""
        if context.connection is None and _connect_timed_out(context.original_exception):
            with self._changed:
                self._missed()
            return None
        if isinstance(context.original_exception, NoAnswer):  # a commit or rollback cut for its deadline (_ending)
            context.is_disconnect = True
            return OperationalError(None, None, context.original_exception, connection_invalidated=True)
        connection = context.connection
        dbapi_connection = connection.connection.dbapi_connection if connection is not None else None
        seconds = self._end(dbapi_connection) if dbapi_connection is not None else None
        if seconds is None:
            return None
        context.is_disconnect = True  # the connection is gone: the pool replaces it
        return OperationalError(context.statement, context.parameters, NoAnswer(self.reason(seconds)),
                                connection_invalidated=True)  # fmt: skip

    # -- the watchdog and the probe -------------------------------------------------------------------------------

    def _start(self, dbapi_connection: Any, quick: bool = False) -> float:
        """Watch `dbapi_connection` from now on (`quick`: under the short deadline); the seconds of its deadline."""
        quick = quick or _quick.get() or getattr(self._probing, "active", False) or self.quick()
        seconds = self.seconds if quick else self.slow_seconds
        fd = _socket(dbapi_connection)
        if fd is None:
            return seconds
        with self._changed:
            self._waiting[id(dbapi_connection)] = (self._clock() + seconds, fd, seconds)
            self._cut.pop(id(dbapi_connection), None)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, name="hpo-statement-deadline", daemon=True)
                self._watchdog.start()
        return seconds

    def _end(self, dbapi_connection: Any) -> float | None:
        """The wait of `dbapi_connection` is over: the seconds of its deadline when it was cut for it, else None."""
        key = id(dbapi_connection)
        with self._changed:
            self._waiting.pop(key, None)
            return self._cut.pop(key, None)

    def _heard(self) -> None:
        with self._changed:
            self._missed_at = None

    def _watch(self) -> None:
        with self._changed:
            while not (self._closed and not self._waiting):  # a statement of a closed storage still gets its cut
                now = self._clock()
                for key in [key for key, (deadline, *_) in self._waiting.items() if deadline <= now]:
                    _, fd, seconds = self._waiting.pop(key)
                    self._cut[key] = seconds
                    _shut_down(fd)  # under the lock: the connection cannot end its wait and close meanwhile
                    self._missed()
                # It looks every tick, not when told of each statement: a wake-up per statement would cost the
                # API's hottest reads a thread switch each (a third more time per read, measured)
                self._changed.wait(self._tick)
            self._watchdog = None  # a statement after close() starts another

    def _missed(self) -> None:
        """The server missed a deadline: hold calls until the probe (started here) gets an answer. Under the lock."""
        if self._missed_at is None:
            self._missed_at = self._clock()
        if self._prober is None and self._engine is not None and not self._closed:
            self._prober = threading.Thread(target=self._probe, name="hpo-database-probe", daemon=True)
            self._prober.start()

    def _probe(self) -> None:
        """Try the server until it answers (which ends the hold), then end."""
        assert self._engine is not None
        self._probing.active = True
        while True:
            with self._changed:
                if not self._closed:
                    self._changed.wait(PROBE_INTERVAL_S)  # close() wakes it
                if self._missed_at is None or self._closed:  # an answer came meanwhile, or nobody asks any more
                    self._prober = None
                    return
            with contextlib.suppress(Exception), self._engine.connect() as connection:
                connection.execute(text("SELECT 1"))  # answered: _answered() ended the hold


def unanswered(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, says that the server gave no answer in time: a missed deadline
    (NoAnswer) or a connection attempt that timed out. The API holds its requests after either (server.storage), as
    `held()` does a storage's calls: another try would wait as long again."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, NoAnswer) or _connect_timed_out(error):
            return True
        error = getattr(error, "orig", None) or error.__cause__
    return False


def _connect_timed_out(exc: BaseException) -> bool:
    """Whether a failed connection attempt gave up at its `connect_timeout`: psycopg's ConnectionTimeout (3.2 on),
    or before it the OperationalError that says so (both read "connection timeout expired")."""
    return type(exc).__name__ == "ConnectionTimeout" or "connection timeout expired" in str(exc)


def _socket(dbapi_connection: Any) -> int | None:
    """The file descriptor of a driver connection's socket; None when it has none (closed)."""
    try:
        fd = dbapi_connection.fileno()
    except Exception:  # a closed connection
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


def _shut_down(fd: int) -> None:
    """End both directions of the socket behind `fd` (shutdown acts on the socket, so on every descriptor of it); the
    descriptor stays open for its driver to close."""
    with contextlib.suppress(OSError):
        duplicate = socket.socket(fileno=os.dup(fd))
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        finally:
            duplicate.close()
