"""Before a process takes an experiment over from its recorded controller (`hpo resume`, `hpo delete`, the API's
DELETE and stop): `settle_controller` waits for the claim of a controller that no longer runs on this machine to
lapse, and refuses (ControllerBusyError) where its controller still runs here though its heartbeat is old (stopped
with Ctrl-Z or `kill -STOP`, or unable to write to the database). A live controller elsewhere is refused by the
claim (`Storage.claim_controller`, `Storage.purge_experiment`). Such a controller's experiment is what users see as
`unresponsive` (`seen_status`). Light: the server imports it (hpo.runners.process
reads /proc; nothing of the training or tuning stacks)."""

from __future__ import annotations

import sys
import time
from datetime import datetime

from hpo.errors import ControllerBusyError

UNRESPONSIVE = "unresponsive"  # what users see of a stale claim whose controller still runs on this machine


def seen_status(record, now: datetime | None = None) -> str:
    """The status users see (`hpo status`, the report, the API): `liveness`, except that an `interrupted` experiment
    whose controller still runs on this machine though its heartbeat is old (stopped with Ctrl-Z or `kill -STOP`,
    or unable to write to the database) is `unresponsive`: `hpo resume` here would refuse to take it over
    (`settle_controller`). From another machine it shows as `interrupted`."""
    from hpo.engine.liveness import liveness
    from hpo.runners.process import controller_here

    status = liveness(record, now)
    if status == "interrupted" and controller_here(record.controller_host, record.controller_pid, record.heartbeat_at):
        return UNRESPONSIVE
    return status


def unresponsive_why(record) -> str:
    """What an `unresponsive` experiment's controller is doing and what to do, by its process state: stopped
    (Ctrl-Z) or unable to write. Empty where it no longer runs here."""
    from hpo.runners.process import controller_here

    state = controller_here(record.controller_host, record.controller_pid, record.heartbeat_at)
    return _why(state, record.controller_pid) if state else ""


def _why(state: str, held: int) -> str:
    """What the controller `held` in process state `state` (/proc's letter) is doing, and what to do."""
    if state == "T":
        return f"it is stopped (Ctrl-Z: `kill -CONT {held}` continues it, `kill -9 {held}` ends it)"
    return ("it could not write to the database (another process keeps it locked, or it is away); stop it first "
            f"(Ctrl-C there, or `kill {held}`), or wait until it ends")  # fmt: skip


def settle_controller(storage, record, quiet: bool):
    """The experiment's record, before this process claims it (`hpo resume`, `hpo delete`): once the claim of a
    controller that no longer runs on this machine has lapsed (`_wait_for_lapse`); ControllerBusyError where its
    controller still runs here though its heartbeat is old. A live controller elsewhere is refused by the claim."""
    from hpo.engine.liveness import controller_identity, liveness
    from hpo.runners.process import controller_gone_here, controller_here

    holder = (record.controller_host, record.controller_pid)
    if holder == controller_identity():
        return record
    if liveness(record) == "live" and controller_gone_here(*holder):
        record = _wait_for_lapse(storage, record, quiet)
    stale = liveness(record) == "interrupted"
    state = controller_here(*holder, record.heartbeat_at) if stale else None  # its process, still running here
    if state:  # what users see as unresponsive
        raise _running_here(record, state)
    return record


def _running_here(record, state: str) -> ControllerBusyError:
    """The error of a claim (a resume, a delete) whose experiment's controller still runs on this machine though
    its heartbeat is old: stopped (`state` T, Ctrl-Z) or unable to write to the database."""
    return ControllerBusyError(
        f"experiment {record.name!r} is driven by a controller that still runs on this machine (pid "
        f"{record.controller_pid}), host {record.controller_host}, though its last heartbeat is old: "
        f"{_why(state, record.controller_pid)}"
    )


def _wait_for_lapse(storage, record, quiet: bool):
    """The record once the claim of a controller that no longer runs on this machine (killed with SIGKILL, or by a
    power cut, a moment ago) has lapsed: its last heartbeat is fresh for at most `stale_after_s`. Waiting is safe
    where taking over at once is not: a controller of the same host name in another PID namespace (a container) is
    not seen here, and its heartbeats go on, so the claim that follows is refused as before."""
    from hpo.engine.liveness import liveness, stale_after_s

    beat = record.heartbeat_at
    deadline = time.monotonic() + stale_after_s() + 1.0
    if not quiet:
        print(f"experiment {record.name}: its controller (pid {record.controller_pid}) no longer runs on this machine; "
              f"waiting up to {stale_after_s():.1f} s for its last heartbeat to lapse", file=sys.stderr)  # fmt: skip
    while liveness(record) == "live" and record.heartbeat_at == beat and time.monotonic() < deadline:
        time.sleep(0.2)
        record = storage.get_experiment_by_name(record.name)
    return record
