"""Waiting out a database that is away: how long between tries, for how long, and what a retried write may find.

A storage method that meets a transient error (`hpo.storage.engine.is_transient`: the server down or restarting,
the connection refused or lost, the server short of disk, memory or connection slots (SQLSTATE class 53 but 53400),
the database closed to connections, SQLite's "database is locked") runs again, whole: each method is one
transaction, so a failed try left nothing behind (a server that refuses a statement rolls its transaction back).
The pause before each new try doubles from `BASE_DELAY_S` up to `MAX_DELAY_S`, and each is drawn between half and
all of that (jitter: the trial processes of an experiment do not all come back at the same instant). Once the
database has been unreachable for the bound, the call raises DatabaseUnavailableError saying for how long.

The bound is `database.outage_s` of the experiment file (default `DEFAULT_OUTAGE_S`, 10 minutes), or
`HPO_DATABASE_OUTAGE_S` when set: the environment wins, so an operator can change it for an experiment that is
already stored (a resume reads the stored file) without editing anything. The outage is counted from the first
failure any caller of the same storage saw, not per call: a controller whose threads each meet it gives up once,
at the bound, and after the bound every call tries once and fails at once. Writes and reads keep apart clocks
(`Outage`): an answer to a write (a row, or a refusal such as NotFoundError) ends the outage, an answer to a read
only an outage of reads, since an SQLite file another writer keeps locked still answers reads.

`without_waiting()` makes the calls inside it try once (the progress view and the heartbeat, which try again at
their next tick anyway; a trial's intermediate metrics, which it keeps until a later write gets through). A call
made on a running asyncio event loop (the API's fastest routes) never waits either: a pause there would stall
every other request the loop serves.
`replaying()` is true inside a retried call: the write's first try may have committed just before the connection
broke, so the writes that are not idempotent by themselves (creating an experiment or a trial) look for their own
work first. A caller may also give up early (`stop`): a controller asked to stop (SIGTERM, Ctrl-C) does not wait
for the database to come back first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from hpo.errors import DatabaseUnavailableError, HpoError, StorageError

OUTAGE_ENV = "HPO_DATABASE_OUTAGE_S"
DEFAULT_OUTAGE_S = 600.0
BASE_DELAY_S = 0.25  # the first pause: a lock or a dropped connection is often gone by then
MAX_DELAY_S = 5.0  # the longest pause: a database that is back is noticed within this
STOP_CHECK_S = 0.2  # how often a pause looks whether its caller has given up
# A write's failure this long after the last one, with none between, starts a new outage: a write that waits fails
# every MAX_DELAY_S plus SQLite's busy timeout (10 s) at most.
STALE_FAILURE_S = 60.0

T = TypeVar("T")

_no_wait: ContextVar[bool] = ContextVar("hpo_storage_no_wait", default=False)
_replay: ContextVar[bool] = ContextVar("hpo_storage_replay", default=False)


def outage_bound(configured: float | None = None) -> float:
    """Seconds to wait for a database that is away: HPO_DATABASE_OUTAGE_S when set, else `configured` (the
    experiment file's `database.outage_s`), else DEFAULT_OUTAGE_S. A value that is not a number >= 0 raises
    HpoError naming the variable."""
    raw = os.environ.get(OUTAGE_ENV, "").strip()
    if not raw:
        return DEFAULT_OUTAGE_S if configured is None else float(configured)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise HpoError(f"{OUTAGE_ENV}={raw!r}: expected the seconds to wait for an unreachable database, a number "
                       f">= 0 (0: do not wait); unset it to use the experiment file's database.outage_s")  # fmt: skip
    return value


STATEMENT_ENV = "HPO_DATABASE_STATEMENT_S"
DEFAULT_STATEMENT_S = 60.0
QUICK_STATEMENT_S = 10.0  # a call that may not wait (the heartbeat, the progress view), and a connection attempt


def writer_deadlines() -> tuple[float, float]:
    """The statement deadlines of a command that writes to a database server (hpo.storage.deadline): a server whose
    process stopped or hung while its machine answers held the controller without a word, past any outage bound. A
    statement without an answer for HPO_DATABASE_STATEMENT_S (default DEFAULT_STATEMENT_S; the calls that may not
    wait, at most QUICK_STATEMENT_S) then fails, and the outage's wait and bound apply. A value that is not a number
    > 0 raises HpoError naming the variable."""
    raw = os.environ.get(STATEMENT_ENV, "").strip()
    try:
        seconds = float(raw) if raw else DEFAULT_STATEMENT_S
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise HpoError(f"{STATEMENT_ENV}={raw!r}: expected the seconds a statement waits for the database server's "
                       f"answer, a number > 0; unset it for {DEFAULT_STATEMENT_S:g}")  # fmt: skip
    return min(QUICK_STATEMENT_S, seconds), seconds


def backoff(rng: random.Random, base_s: float = BASE_DELAY_S, cap_s: float = MAX_DELAY_S) -> Iterator[float]:
    """The pauses between tries: the n-th is drawn uniformly from [d/2, d] with d = min(cap_s, base_s * 2**n)."""
    ceiling = base_s
    while True:
        yield rng.uniform(ceiling / 2, ceiling)
        ceiling = min(cap_s, ceiling * 2)


@contextlib.contextmanager
def without_waiting() -> Iterator[None]:
    """Storage calls inside try once: a transient error raises DatabaseUnavailableError at once (and still counts
    as the start of an outage for `Outage.unreachable_for`)."""
    token = _no_wait.set(True)
    try:
        yield
    finally:
        _no_wait.reset(token)


def replaying() -> bool:
    """Whether the current storage call is a retry of one that failed: its earlier try may have committed."""
    return _replay.get()


@contextlib.contextmanager
def as_replay() -> Iterator[None]:
    """Run the calls inside as retries (`replaying()` true): how the retry loop runs every try after the first, and
    how tests reach the case where a first try's commit landed but its answer was lost."""
    token = _replay.set(True)
    try:
        yield
    finally:
        _replay.reset(token)


class Outage:
    """Since when the database has been unreachable, for writes and for reads apart, shared by every thread of one
    storage (thread-safe). A write that gets through ends both; a read that answers ends only an outage of reads: an
    SQLite file that another writer keeps locked still answers reads (WAL), and those answers must not restart the
    clock of the writes that wait for it. Reads that fail mean writes fail too (a server that is down), so a write's
    outage counts from the first failure of either. A write failure with no other for `STALE_FAILURE_S` was one
    that no write waited on (a server that writes once in hours): the next starts a new outage. The latest failure's
    state (DatabaseUnavailableError.state: unreachable, out of disk space, ...) says what holds the database up."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: dict[bool, float] = {}  # write? -> when the first try that failed began
        self._last_write_failure: float | None = None
        self._state = "unreachable"
        self._lock = threading.Lock()

    def failed(self, started: float, write: bool = True, state: str = "unreachable") -> float:
        """A try (a write, or only reads) that began at `started` (clock seconds) failed, the database being `state`:
        how long it has now been unreachable for such calls."""
        with self._lock:
            self._state = state
            now = self._clock()
            if write:
                last, self._last_write_failure = self._last_write_failure, now
                if last is not None and now - last > STALE_FAILURE_S:
                    self._since.pop(True, None)
            since = self._since.setdefault(write, started)
            if write:
                since = min(self._since.values())
        return now - since

    def ended(self, write: bool = True) -> None:
        """The database answered a write (every outage is over) or a read (an outage of reads is)."""
        with self._lock:
            if write:
                self._since.clear()
                self._last_write_failure = None
            else:
                self._since.pop(False, None)

    def unreachable_for(self) -> float | None:
        """Seconds since the longest outage began, or None when the database answered every kind of call last."""
        with self._lock:
            since = min(self._since.values(), default=None)
        return None if since is None else self._clock() - since

    def state(self) -> str:
        """What the latest failure said holds the database up ("unreachable", "out of disk space", ...)."""
        with self._lock:
            return self._state


def call_with_retry(call: Callable[[], T], outage: Outage, bound_s: float, rng: random.Random,
                    stop: Callable[[], str | None] = lambda: None, sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic,
                    wrote: Callable[[], bool] = lambda: True,
                    waiting: Callable[[DatabaseUnavailableError, float], None] | None = None) -> T:  # fmt: skip
    """`call()`, run again after each DatabaseUnavailableError until the database has been unreachable for
    `bound_s` (see the module docstring); `stop()` returns a reason to give up early, or None. `wrote()`, asked
    after each try, says whether that try wrote (or tried to): a try that only read neither starts nor ends an
    outage of writes. `waiting(error, bound_s)` is told before each pause (a command says that it waits)."""
    pauses = backoff(rng)
    replay = False
    while True:
        started = clock()
        try:
            if replay:
                with as_replay():
                    result = call()
            else:
                result = call()
        except DatabaseUnavailableError as exc:
            waited = outage.failed(started, wrote(), exc.state)
            if bound_s <= 0 or not may_wait():
                raise
            if waited >= bound_s:
                raise DatabaseUnavailableError(
                    f"{exc} It has been unreachable for {waited:.0f} s, the longest this process waits "
                    f"(database.outage_s = {bound_s:g} s; {OUTAGE_ENV} sets it).",
                    exc.state,
                ) from exc
            if waiting is not None:
                waiting(exc, bound_s)
            _pause(min(next(pauses), bound_s - waited), stop, sleep, clock, exc)
            replay = True
            continue
        except StorageError:
            outage.ended(wrote())  # the database answered, with a refusal
            raise
        outage.ended(wrote())
        return result


def may_wait() -> bool:
    """Whether the current call may pause: not inside `without_waiting()`, not on a running event loop."""
    return not _no_wait.get() and not on_event_loop()


def on_event_loop() -> bool:
    """Whether this call runs on a running asyncio event loop (the API's fastest routes), where any wait stalls
    every request the loop serves."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _pause(seconds: float, stop: Callable[[], str | None], sleep: Callable[[float], None],
           clock: Callable[[], float], exc: DatabaseUnavailableError) -> None:  # fmt: skip
    """Sleep `seconds`, in short steps that look at `stop()`; a reason to stop raises DatabaseUnavailableError."""
    deadline = clock() + seconds
    while True:
        reason = stop()
        if reason:
            raise DatabaseUnavailableError(f"{exc} Stopped waiting for it: {reason}.", exc.state) from exc
        left = deadline - clock()
        if left <= 0:
            return
        sleep(min(left, STOP_CHECK_S))
