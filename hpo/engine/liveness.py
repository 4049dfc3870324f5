"""Is an experiment's controller alive? Heartbeats in the experiments table, and how to read them.

A controller claims its experiment (`Storage.claim_controller`), then a `Heartbeat` thread stamps
`heartbeat_at` every `heartbeat_interval_s()` seconds, with a one-line note of what it sees. A database server
dates the beats and judges a claim by its own clock, so a machine whose clock runs ahead cannot take a live
controller's experiment over. A RUNNING
experiment whose last heartbeat is older than `STALE_AFTER` intervals has lost its controller: it shows as
`interrupted`, and `hpo resume` may take it over. The thread, not the study loop, beats, so a tuner that thinks
for a few seconds does not look dead. A beat tries the database once (`without_waiting`): while it is away the
thread tries every `OUTAGE_BEAT_S` seconds, so the claim is fresh again right after it returns. A stale claim
whose controller still runs on this machine (`hpo.runners.process.controller_here`) is not taken over by
`hpo resume` there.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from datetime import datetime, timezone

from hpo.errors import HpoError, NotFoundError, StorageError
from hpo.storage.retry import without_waiting

HEARTBEAT_ENV = "HPO_HEARTBEAT_S"
DEFAULT_HEARTBEAT_S = 5.0
STALE_AFTER = 1.5  # intervals without a heartbeat before a controller counts as dead
OUTAGE_BEAT_S = 1.0  # how often a beat is tried while the database is away


def heartbeat_interval_s() -> float:
    """Seconds between heartbeats: HPO_HEARTBEAT_S when set (at least 0.1), default 5. A value that is not a
    number > 0 raises HpoError naming the variable (`check_heartbeat_env` checks it before anything is written)."""
    raw = os.environ.get(HEARTBEAT_ENV, "").strip()
    if not raw:
        return DEFAULT_HEARTBEAT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise HpoError(f"{HEARTBEAT_ENV}={raw!r}: expected the seconds between the controller's heartbeats, a "
                       f"number > 0 (default {DEFAULT_HEARTBEAT_S:g}); unset it for the default")  # fmt: skip
    return max(0.1, value)


def check_heartbeat_env() -> None:
    """HPO_HEARTBEAT_S, when set, must be a number of seconds > 0: HpoError naming it, for the commands that start
    a controller (`hpo run`, `hpo resume`) to call before anything is written."""
    heartbeat_interval_s()


def stale_after_s() -> float:
    return STALE_AFTER * heartbeat_interval_s()


def controller_identity() -> tuple[str, int]:
    """(host, pid) of this process, as recorded in the experiments table."""
    return socket.gethostname(), os.getpid()


def liveness(record, now: datetime | None = None) -> str:
    """`live` or `interrupted` for a RUNNING experiment (by its heartbeat), else its status (finished, ...). The
    heartbeat's age is taken on the clock that dated it: the database server's, read with the record
    (`read_at`), so a reader whose clock is off does not see a live controller as gone, or the reverse."""
    status = record.status.value
    if status != "running":
        return status
    now = now or record.read_at or datetime.now(timezone.utc)
    beat = record.heartbeat_at
    if record.controller_pid is None or beat is None or (now - beat).total_seconds() > stale_after_s():
        return "interrupted"
    return "live"


class Heartbeat:
    """A daemon thread that keeps the controller's claim fresh; `note()` says what the controller sees."""

    def __init__(self, storage, experiment_id: int, note: Callable[[], str] | None = None):
        self.storage, self.experiment_id = storage, experiment_id
        self.host, self.pid = controller_identity()
        self.note = note or (lambda: "")
        self.lost = False  # another controller took the experiment over, or it was deleted
        self.deleted = False  # deleted (`hpo delete` while this controller seemed gone)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpo-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.storage.claim_controller(self.experiment_id, self.host, self.pid, stale_after_s())
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._next_beat_s()):
            self.beat()

    def _next_beat_s(self) -> float:
        away = self.storage.unreachable_for() is not None
        return min(heartbeat_interval_s(), OUTAGE_BEAT_S) if away else heartbeat_interval_s()

    def beat(self) -> None:
        """One beat now: the claim refreshed and the note stored (the thread beats every interval)."""
        with contextlib.suppress(StorageError), without_waiting():  # the database away: the next beat tries again
            try:
                self.lost = not self.storage.heartbeat(self.experiment_id, self.host, self.pid, self.note())
            except NotFoundError:
                self.lost = self.deleted = True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with contextlib.suppress(StorageError):
            self.storage.release_controller(self.experiment_id, self.host, self.pid)
