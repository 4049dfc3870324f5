"""`SqlStorage`: the `Storage` contract on SQLAlchemy 2, for SQLite (the embedded default) and PostgreSQL.

    storage = SqlStorage()                      # HPO_DATABASE_URL, else sqlite:///$HPO_HOME/hpo.db
    storage = SqlStorage("postgresql+psycopg://hpo:secret@db:5432/hpo")

Where the default database lives: `HPO_DATABASE_URL` when set, else the SQLite file `$HPO_HOME/hpo.db`, with
`HPO_HOME` defaulting to `./.hpo` relative to the current directory (see `default_database_url`).

Opening checks that the schema is at the newest migration and raises SchemaOutOfDateError ("run
`hpo db upgrade`") otherwise; `SqlStorage(url, upgrade=True)` migrates first (tests and `hpo db upgrade`).
Every public method runs in one transaction through `_session`, the only place that talks to SQLAlchemy's
session machinery and the only place database errors are turned into StorageError (DatabaseUnavailableError
when the database is away for now). Every method of the interface is wrapped once, at the end of this module,
in the retry of `hpo.storage.retry`: with `outage_s` > 0 (`SqlStorage(url, outage_s=600)`, what controllers and
trial processes open) a method that meets an unreachable database runs again, whole, until it has been away for
`outage_s` seconds; with the default 0 (read-only commands) it raises at once, and the API server waits briefly
(server/storage.py). The API's two hottest reads
(`trials_version` and a key page of `list_trial_versions`), one prebuilt statement each, go through the session's
light sibling `_rows` instead (a pooled connection without a Session, errors turned the same way).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Select,
    bindparam,
    delete,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from hpo.errors import (
    ClaimLostError,
    ControllerBusyError,
    DatabaseUnavailableError,
    NotFoundError,
    StorageError,
    TrialClosedError,
)
from hpo.storage.base import (
    Direction,
    ExperimentRecord,
    ExperimentStatus,
    MetricPoint,
    Storage,
    TrialRecord,
)
from hpo.storage.deadline import StatementDeadline
from hpo.storage.engine import (
    WRITE_OPTION,
    create_storage_engine,
    default_database_url,
    safe_url,
    sqlite_file,
    storage_error,
)
from hpo.storage.migrate import check_schema, upgrade_database
from hpo.storage.models import METRIC_KEY, ExperimentModel, TrialMetricModel, TrialModel
from hpo.storage.noise import late_noise_of
from hpo.storage.retry import Outage, call_with_retry, may_wait, replaying
from hpo.storage.sql_reads import TrialReads
from hpo.storage.statements import (
    _UNFINISHED,
    DEFINITION_KEYS,
    REQUEUE_REASON,
    _as_stored,
    _count_change,
    _experiment,
    _experiment_not_found,
    _experiment_record,
    _is_as,
    _metric_rows,
    _no_nan,
    _noise_records,
    _now,
    _require_experiment,
    _stale,
    _stamp_locked,
    _transition_error,
    _trial,
    _trial_record,
    _update_trial,
    _utc,
)
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState

__all__ = ["SqlStorage", "default_database_url"]


class SqlStorage(TrialReads, Storage):
    """The storage on an SQL database reached through SQLAlchemy (see the module docstring)."""

    def __init__(self, url: str | None = None, *, upgrade: bool = False, outage_s: float = 0.0,
                 read_only: bool = False, one_shot: bool = False, writes: bool = True,
                 deadlines: tuple[float, float] | None = None,
                 on_wait: Callable[[DatabaseUnavailableError, float], None] | None = None) -> None:  # fmt: skip
        self.url = url or default_database_url()
        self._trial_clock: Callable[[], datetime] = _now
        self.outage_s = outage_s  # how long a call waits for a database that is away (hpo.storage.retry)
        self._outage = Outage()
        self._rng = random.Random()  # jitter: differs between processes on purpose
        self._stop_waiting: Callable[[], str | None] = lambda: None
        # told before each pause for the database (a command that writes says it waits), until `wait_for_outages`
        self._on_wait = on_wait
        self._stamps = threading.local()  # the creation time a create's first try stamped, for its retries
        self._writes = threading.local()  # `count`: the write transactions this thread began (hpo.storage.retry)
        if upgrade:
            upgrade_database(self.url)
        # read_only: a SQLite file stays as it was; one_shot: a command's reads, over in moments (never a server's);
        # writes=False: a command that only reads (a SQLite file opened read-only)
        # deadlines: on a database server, a statement with no answer for that long fails, the first for a call that
        # may not wait (on an event loop, or in without_waiting()), the second for the others: the API's (see
        # hpo/storage/deadline.py)
        self._deadline = StatementDeadline(*deadlines, quick=lambda: not may_wait()) if deadlines else None
        self._read_only = read_only
        self._engine = create_storage_engine(self.url, read_only, one_shot, writes, self._deadline)
        # Both share the engine's connection pool. Writes take SQLite's write lock up front. Reads on PostgreSQL
        # skip BEGIN/COMMIT (two round trips): at READ COMMITTED every statement has its own snapshot anyway,
        # while SQLite's read transaction does give all statements of a method one snapshot, so it stays.
        self._write_engine = self._engine.execution_options(**{WRITE_OPTION: True})
        self._read_engine = self._engine
        self._directions: dict[int, Direction] = {}  # an experiment's direction never changes
        if self._engine.dialect.name != "sqlite":
            self._read_engine = self._engine.execution_options(isolation_level="AUTOCOMMIT")
        self._file = None  # (path, (device, inode)) of a SQLite file as opened: `replaced_file`
        if (path := sqlite_file(self.url)) is not None:
            with contextlib.suppress(OSError):
                opened = os.stat(path)
                if stat.S_ISREG(opened.st_mode):  # a folder there is refused as such below, not as a replaced file
                    self._file = (path, (opened.st_dev, opened.st_ino))
        try:
            self._retry(self._check_schema)
        except BaseException:
            # close(), not only the engine's disposal: a connection attempt that timed out started the deadline's
            # probe, which would otherwise try this storage nobody holds every second until the server answered
            self.close()
            raise

    def replaced_file(self) -> Path | None:
        if self._file is None:
            return None
        path, opened = self._file
        try:
            now = os.stat(path)
        except OSError:
            return path
        # a file of another inode, or no file (a folder put in its place may take the deleted file's inode number)
        return None if stat.S_ISREG(now.st_mode) and (now.st_dev, now.st_ino) == opened else path

    def _check_schema(self) -> None:
        if not self._read_only and (path := sqlite_file(self.url)) is not None and path.is_file():
            # An existing file is checked through a reader: a writer's first connection sets WAL mode in the file,
            # which a file refused here (another program's, an old or newer schema) must not keep.
            reader = create_storage_engine(self.url, read_only=True)
            try:
                with reader.connect() as connection:
                    check_schema(connection, self.url)
            except SQLAlchemyError as exc:  # a locked or vanished file: as any read's error (retried where it may)
                self.check_file()
                raise storage_error(exc, self.url) from exc
            finally:
                reader.dispose()
            return
        with self._session() as session:
            check_schema(session.connection(), self.url)

    def __repr__(self) -> str:
        return f"SqlStorage({safe_url(self.url)!r})"

    def close(self) -> None:
        if self._deadline is not None:
            self._deadline.close()
        self._engine.dispose()

    def use_trial_clock(self, clock: Callable[[], datetime]) -> None:
        self._trial_clock = clock

    def wait_for_outages(self, outage_s: float, stop: Callable[[], str | None] | None = None) -> None:
        self.outage_s = outage_s
        self._stop_waiting = stop or (lambda: None)
        self._on_wait = None  # the caller that sets the bound says how it waits (the controller's progress line)

    def unreachable_for(self) -> float | None:
        return self._outage.unreachable_for()

    def outage_state(self) -> str:
        return self._outage.state()

    def _stamp(self, created: tuple, clock: Callable[[], datetime]) -> datetime:
        """The creation time of what a create (its arguments: `created`) makes: `clock()` on a first try, the first
        try's time on a retry, so a retry knows its own first try's row by it from a twin made earlier."""
        kept = getattr(self._stamps, "kept", None)
        if replaying() and kept is not None and kept[0] == created:
            return kept[1]
        self._stamps.kept = (created, clock())
        return self._stamps.kept[1]

    def _retry(self, call: Callable[[], Any]) -> Any:
        """`call()` under the retry of hpo.storage.retry (this storage's bound, outage clock and stop); a try that
        began a write transaction counts as a write, one that only read as a read."""
        began = [0]

        def attempt() -> Any:
            began[0] = self._write_count()
            return call()

        return call_with_retry(attempt, self._outage, self.outage_s, self._rng, self._stop_waiting,
                               wrote=lambda: self._write_count() > began[0], waiting=self._on_wait)  # fmt: skip

    def _write_count(self) -> int:
        return getattr(self._writes, "count", 0)

    # -- the session helper --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _session(self, *, write: bool = False) -> Iterator[Session]:
        """One transaction: committed when the block succeeds, rolled back otherwise.

        Database errors leave as StorageError naming the database (password hidden); `write=True` takes
        SQLite's write lock when the block starts, waiting up to its busy timeout for it.
        """
        self._refuse_while_held()
        session = Session(self._write_engine if write else self._read_engine, expire_on_commit=False)
        if write:
            self._writes.count = self._write_count() + 1
        try:
            self._begin(session)
            yield session
            session.commit()
        except SQLAlchemyError as exc:
            self.check_file()  # a file deleted or replaced under it: said as such ("no such table" would not)
            raise storage_error(exc, self.url) from exc
        finally:
            # close() rolls back whatever was not committed; a dead connection must not mask the real error.
            with contextlib.suppress(SQLAlchemyError):
                session.close()

    def _refuse_while_held(self) -> None:
        """DatabaseUnavailableError while the database server has missed a statement deadline and not answered
        since (hpo/storage/deadline.py): another try would hold its caller (the API's event loop) for the deadline
        again, or for a connection attempt's timeout."""
        held = self._deadline.held() if self._deadline is not None else None
        if held:
            raise DatabaseUnavailableError(f"cannot use the database {safe_url(self.url)}: {held}.")

    @staticmethod
    def _begin(session: Session) -> None:
        # Starting the transaction here (not at the first statement) means the only place SQLite can report
        # "database is locked" is this call, which is safe to repeat: nothing has happened yet. It is tried once,
        # after SQLite's busy timeout: longer waits are the retry's (hpo/storage/retry.py), counted against
        # database.outage_s and shown on the progress line.
        session.connection()

    def _rows(self, statement: Select, params: dict[str, Any]) -> list:
        """The rows of one read-only statement, on a pooled connection without a Session: a Session's own set-up and
        teardown are most of the time of a one-row read (BENCHMARKS.md, "REST API under load"). One statement
        needs no transaction around it; database errors leave as StorageError, as from `_session`, and a database
        server that missed a deadline is not tried, as there."""
        self._refuse_while_held()
        try:
            with self._read_engine.connect() as connection:
                return connection.execute(statement, params).all()
        except SQLAlchemyError as exc:
            self.check_file()
            raise storage_error(exc, self.url) from exc

    # -- experiments ---------------------------------------------------------------------------------------

    def create_experiment(
        self, name: str, spec: Mapping[str, Any], direction: Direction | str, controller: tuple[str, int] | None = None
    ) -> int:
        experiment = ExperimentModel(
            name=name,
            direction=Direction(direction).value,
            status=ExperimentStatus.RUNNING.value,
            spec=dict(spec),
            stop_requested=False,
            created_at=self._stamp(("experiment", name, spec, direction), _now),
        )
        if replaying() and (earlier := self._created_experiment(name, experiment)) is not None:
            return earlier  # the first try's commit landed before the connection broke
        with self._session(write=True) as session:
            if controller is not None:
                experiment.controller_host, experiment.controller_pid = controller
                experiment.heartbeat_at = _controller_time(session)
            session.add(experiment)
            try:
                session.flush()
            except IntegrityError as exc:
                raise StorageError(
                    f"an experiment named {name!r} already exists in {safe_url(self.url)}: "
                    "choose another name, or resume that experiment"
                ) from exc
            return experiment.id

    def _created_experiment(self, name: str, wanted: ExperimentModel) -> int | None:
        """The id of the experiment `name` if it is the one `wanted` describes, just created (running, no trial)."""
        with self._session() as session:
            found = session.scalars(select(ExperimentModel).where(ExperimentModel.name == name)).first()
            if found is None or (found.direction, found.status) != (wanted.direction, wanted.status):
                return None
            if _utc(found.created_at) != _utc(wanted.created_at):
                return None  # another one of that name, made earlier
            if found.spec != _as_stored(wanted.spec) or session.scalar(
                select(TrialModel.id).where(TrialModel.experiment_id == found.id).limit(1)
            ):
                return None
            return found.id

    def get_experiment(self, experiment_id: int) -> ExperimentRecord:
        with self._session() as session:
            return _experiment_record(*_with_clock(session, _experiment(session, experiment_id)))

    def get_experiment_by_name(self, name: str) -> ExperimentRecord:
        with self._session() as session:
            experiment = session.scalars(select(ExperimentModel).where(ExperimentModel.name == name)).first()
            if experiment is None:
                raise NotFoundError(f"no experiment named {name!r} in {safe_url(self.url)}")
            return _experiment_record(*_with_clock(session, experiment))

    def list_experiments(self, status: ExperimentStatus | str | None = None) -> list[ExperimentRecord]:
        query = select(ExperimentModel).order_by(ExperimentModel.id)
        if status is not None:
            query = query.where(ExperimentModel.status == ExperimentStatus(status).value)
        with self._session() as session:
            experiments = list(session.scalars(query))
            running = any(e.status == ExperimentStatus.RUNNING.value for e in experiments)
            read_at = _controller_time(session) if running else None
            return [_experiment_record(experiment, read_at) for experiment in experiments]

    def set_experiment_status(self, experiment_id: int, status: ExperimentStatus | str) -> None:
        status = ExperimentStatus(status)
        with self._session(write=True) as session:
            experiment = _experiment(session, experiment_id)
            experiment.status = status.value
            if status is ExperimentStatus.RUNNING:
                experiment.stop_requested = False
                experiment.ended_at = None
            else:
                experiment.ended_at = _now()

    def annotate_experiment(self, experiment_id: int, key: str, value: Any) -> None:
        if key in DEFINITION_KEYS:
            raise ValueError(f"spec[{key!r}] is the experiment's definition; it stays as created")
        with self._session(write=True) as session:
            experiment = _experiment(session, experiment_id)
            experiment.spec = {**experiment.spec, key: value}  # a new mapping: the JSON column sees the change

    def delete_experiment(self, experiment_id: int) -> None:
        with self._session(write=True) as session:
            if replaying() and session.get(ExperimentModel, experiment_id) is None:
                return  # the first try's delete landed
            experiment = _experiment(session, experiment_id)
            trials = session.scalar(select(func.count()).where(TrialModel.experiment_id == experiment_id))
            if trials:
                raise StorageError(f"experiment {experiment.name!r} has {trials} trial(s); it is kept")
            session.delete(experiment)

    def purge_experiment(self, experiment_id: int, host: str, pid: int, stale_after_s: float) -> tuple[int, int] | None:
        with self._session(write=True) as session:
            if replaying() and session.get(ExperimentModel, experiment_id) is None:
                return None  # the first try's removal landed
            now = _controller_time(session)
            # Claimed first, in this transaction: a live controller keeps its experiment, and on PostgreSQL the
            # claim's row lock makes a controller claiming at the same moment wait, then find no experiment.
            if not self._claim(session, experiment_id, host, pid, now - timedelta(seconds=stale_after_s), now):
                raise self._busy(session, experiment_id, now)
            # Plain statements: the session keeps no object of these rows, so none is fetched to be synchronized.
            plain = {"synchronize_session": False}
            trials = select(TrialModel.id).where(TrialModel.experiment_id == experiment_id)
            if session.get_bind().dialect.name == "sqlite":
                # SQLite gathers the row ids a DELETE removes in memory first (about 25 bytes a row: 0.5 GB at
                # 100,000 trials' curves), so the curves go PURGE_CHUNK trials at a time (BENCHMARKS.md).
                ids = session.scalars(trials).all()
                starts = range(0, len(ids), PURGE_CHUNK)
                chunks = [TrialMetricModel.trial_id.in_(ids[i : i + PURGE_CHUNK]) for i in starts]
            else:  # PostgreSQL: one statement, faster there (BENCHMARKS.md)
                chunks = [TrialMetricModel.trial_id.in_(trials)]
            metrics = sum(session.execute(delete(TrialMetricModel).where(chunk), execution_options=plain).rowcount
                          for chunk in chunks)  # fmt: skip
            removed = session.execute(delete(TrialModel).where(TrialModel.experiment_id == experiment_id),
                                      execution_options=plain)  # fmt: skip
            session.execute(delete(ExperimentModel).where(ExperimentModel.id == experiment_id), execution_options=plain)
            return removed.rowcount, metrics

    def claim_controller(self, experiment_id: int, host: str, pid: int, stale_after_s: float) -> None:
        with self._session(write=True) as session:
            now = _controller_time(session)
            if self._claim(session, experiment_id, host, pid, now - timedelta(seconds=stale_after_s), now):
                return
            raise self._busy(session, experiment_id, now)

    @staticmethod
    def _busy(session: Session, experiment_id: int, now: datetime) -> ControllerBusyError:
        """The error of a claim that a live controller holds, naming it (NotFoundError: no such experiment)."""
        experiment = _experiment(session, experiment_id)
        age = max((now - _utc(experiment.heartbeat_at)).total_seconds(), 0.0)  # its clock may run a little ahead
        holder = f"host {experiment.controller_host}, pid {experiment.controller_pid}"
        return ControllerBusyError(
            f"experiment {experiment.name!r} is driven by a live controller ({holder}, last heartbeat {age:.0f} s "
            f"ago); stop it first (Ctrl-C there, or `POST /api/v1/experiments/{experiment.name}/stop`), or wait until "
            "it ends"
        )

    @staticmethod
    def _claim(session: Session, experiment_id: int, host: str, pid: int, stale: datetime, now: datetime) -> bool:
        """One conditional UPDATE: of two controllers claiming at once, exactly one wins."""
        free = or_(
            ExperimentModel.controller_pid.is_(None),
            ExperimentModel.heartbeat_at.is_(None),
            ExperimentModel.heartbeat_at < stale,
            (ExperimentModel.controller_host == host) & (ExperimentModel.controller_pid == pid),
        )
        claim = (
            update(ExperimentModel)
            .where(ExperimentModel.id == experiment_id, free)
            .values(controller_host=host, controller_pid=pid, heartbeat_at=now, controller_note=None)
            .execution_options(synchronize_session=False)
        )
        return session.execute(claim).rowcount == 1

    def heartbeat(self, experiment_id: int, host: str, pid: int, note: str | None = None) -> bool:
        with self._session(write=True) as session:
            beat = (
                update(ExperimentModel)
                .where(
                    ExperimentModel.id == experiment_id,
                    ExperimentModel.controller_host == host,
                    ExperimentModel.controller_pid == pid,
                )
                .values(heartbeat_at=_controller_time(session), controller_note=note)
                .execution_options(synchronize_session=False)
            )
            if session.execute(beat).rowcount == 1:
                return True
            _require_experiment(session, experiment_id)
            return False

    def release_controller(self, experiment_id: int, host: str, pid: int) -> None:
        release = (
            update(ExperimentModel)
            .where(
                ExperimentModel.id == experiment_id,
                ExperimentModel.controller_host == host,
                ExperimentModel.controller_pid == pid,
            )
            .values(controller_host=None, controller_pid=None, controller_note=None)
            .execution_options(synchronize_session=False)
        )
        with self._session(write=True) as session:
            _require_experiment(session, experiment_id)
            session.execute(release)

    def request_stop(self, experiment_id: int) -> None:
        with self._session(write=True) as session:
            _experiment(session, experiment_id).stop_requested = True

    def is_stop_requested(self, experiment_id: int) -> bool:
        with self._session() as session:
            stop = session.scalar(select(ExperimentModel.stop_requested).where(ExperimentModel.id == experiment_id))
            if stop is None:
                raise _experiment_not_found(experiment_id)
            return bool(stop)

    # -- trials --------------------------------------------------------------------------------------------

    def create_trial(
        self,
        experiment_id: int,
        spec: TrialSpec,
        *,
        told: Sequence[int] = (),
        worker: str | None = None,
        controller: tuple[str, int] | None = None,
    ) -> int:
        created_at = self._stamp(("trial", experiment_id, spec), self._trial_clock)
        if replaying() and (earlier := self._created_trial(experiment_id, spec, created_at)) is not None:
            return earlier  # the first try's commit landed before the connection broke
        with self._session(write=True) as session:
            # Lock the experiment row (PostgreSQL; SQLite's write transaction is already exclusive), so the next
            # number is computed by one creator at a time, and a claim taken over meanwhile is seen.
            locked = (
                select(ExperimentModel.controller_host, ExperimentModel.controller_pid)
                .where(ExperimentModel.id == experiment_id)
                .with_for_update()
            )
            holder = session.execute(locked).first()
            if holder is None:
                raise _experiment_not_found(experiment_id)
            if controller is not None and tuple(holder) != tuple(controller):
                raise ClaimLostError(f"experiment {experiment_id} is driven by another controller (pid "
                                     f"{holder.controller_pid} on {holder.controller_host}), which took it over: "
                                     f"this one (pid {controller[1]} on {controller[0]}) creates no trial")  # fmt: skip
            number = spec.number
            if number is None:
                highest = session.scalar(
                    select(func.max(TrialModel.number)).where(TrialModel.experiment_id == experiment_id)
                )
                number = 0 if highest is None else highest + 1
            trial = TrialModel(
                experiment_id=experiment_id,
                number=number,
                state=TrialState.QUEUED.value,
                params=dict(spec.params),
                arm=spec.arm,
                budget=spec.budget,
                gpus=list(spec.gpus),
                global_batch_size=spec.global_batch_size,
                metrics={},
                attempt=0,
                kind=TrialKind(spec.kind).value,
                seed=spec.seed,
                worker=worker,
                created_at=created_at,
            )
            session.add(trial)
            try:
                session.flush()
            except IntegrityError as exc:
                raise StorageError(
                    f"experiment {experiment_id} already has a trial number {number}: "
                    "pass number=None to take the next number"
                ) from exc
            if told:  # in the order they were told
                trials = TrialModel.__table__
                stamp = (
                    trials.update()
                    .where(trials.c.id == bindparam("told_id"), trials.c.experiment_id == experiment_id)
                    .values(told_before=number, told_order=bindparam("position"))
                )
                session.execute(stamp, [{"told_id": i, "position": p} for p, i in enumerate(told)])
            _count_change(session, experiment_id)
            return trial.id

    def _created_trial(self, experiment_id: int, spec: TrialSpec, created_at: datetime) -> int | None:
        """The id of the trial `spec` describes if a retried `create_trial` finds it just created: the trial with
        `spec.number`, or without one the experiment's newest trial, queued at attempt 0 with the same parameters,
        arm, budget, kind and seed, created at the first try's `created_at` (not a twin of an earlier create)."""
        query = select(TrialModel).where(TrialModel.experiment_id == experiment_id)
        if spec.number is None:
            query = query.order_by(TrialModel.number.desc()).limit(1)
        else:
            query = query.where(TrialModel.number == spec.number)
        with self._session() as session:
            found = session.scalars(query).first()
            if found is None or (found.state, found.attempt) != (TrialState.QUEUED.value, 0):
                return None
            if _utc(found.created_at) != _utc(created_at):
                return None
            wanted = (_as_stored(dict(spec.params)), spec.arm, spec.budget, TrialKind(spec.kind).value, spec.seed)
            return found.id if (found.params, found.arm, found.budget, found.kind, found.seed) == wanted else None

    def mark_trial_running(
        self,
        trial_id: int,
        gpus: Iterable[int] | None = None,
        *,
        pid: int | None = None,
        host: str | None = None,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> None:
        values: dict[str, Any] = {
            "state": TrialState.RUNNING.value,
            "started_at": self._trial_clock(),
            "pid": pid,
            "host": host,
            "worker": worker,
        }
        if gpus is not None:
            values["gpus"] = [int(gpu) for gpu in gpus]
        with self._session(write=True) as session:
            # One conditional UPDATE: of two workers claiming the same queued trial, exactly one wins.
            claimed = _update_trial(session, trial_id, [TrialState.QUEUED.value], values, attempt)
            if not claimed and not (replaying() and _is_as(session, trial_id, attempt, state=TrialState.RUNNING.value,
                                                           pid=pid, host=host, worker=worker)):  # fmt: skip
                raise _transition_error(session, trial_id, "start", "it is not queued", attempt)

    def finish_trial(self, trial_id: int, result: TrialResult, *, attempt: int | None = None) -> None:
        if not result.state.finished:
            raise ValueError(f"finish_trial needs a finished state, got {result.state.value!r} for trial {trial_id}")
        values = {
            "state": result.state.value,
            "reason": result.reason,
            "objective": _no_nan(result.objective),
            "samples_to_target": result.samples_to_target,
            "time_to_target_s": _no_nan(result.time_to_target_s),
            "best_mlm_accuracy": _no_nan(result.best_mlm_accuracy),
            "duration_s": _no_nan(result.duration_s),
            "metrics": dict(result.metrics),
        }
        outcome = {key: values[key] for key in ("state", "reason", "objective", "samples_to_target", "duration_s")}
        with self._session(write=True) as session:
            values["finished_at"] = _stamp_locked(session, trial_id, self._trial_clock)
            # read under the row lock: no record of this trial can be added after it, so the summary is final
            noise = late_noise_of(_noise_records(session, trial_id))
            values.update(late_noise_scale=noise.value, late_noise_undefined=noise.undefined)
            if _update_trial(session, trial_id, _UNFINISHED, values, attempt) or _is_as(
                session, trial_id, attempt, **outcome
            ):  # finished with this very result already: a repeated write leaves one
                return
            raise _transition_error(session, trial_id, "finish", "a finished trial is never changed", attempt)

    def interrupt_trial(self, trial_id: int, reason: str, *, attempt: int | None = None) -> None:
        values = {"state": TrialState.INTERRUPTED.value, "reason": reason}
        from_states = [TrialState.QUEUED.value, TrialState.RUNNING.value]
        with self._session(write=True) as session:
            values["finished_at"] = _stamp_locked(session, trial_id, self._trial_clock)
            if _update_trial(session, trial_id, from_states, values, attempt) or _is_as(
                session, trial_id, attempt, state=TrialState.INTERRUPTED.value, reason=reason
            ):  # interrupted for this very reason already: a repeated write leaves one
                return
            raise _transition_error(session, trial_id, "interrupt", "it is neither queued nor running", attempt)

    def requeue_trial(self, trial_id: int, attempt: int, reason: str) -> TrialRecord:
        values = {
            "state": TrialState.QUEUED.value,
            "reason": reason,
            "started_at": None,
            "finished_at": None,
            "pid": None,
            "host": None,
            "worker": None,
            "attempt": attempt + 1,
            "told_before": None,  # an unfinished trial has not been told
            "told_order": None,
        }
        from_states = [TrialState.QUEUED.value, TrialState.RUNNING.value, TrialState.INTERRUPTED.value]
        with self._session(write=True) as session:
            if not _update_trial(session, trial_id, from_states, values, attempt):
                if replaying() and _is_as(session, trial_id, attempt + 1, state=TrialState.QUEUED.value):
                    return _trial_record(_trial(session, trial_id))  # the first try's re-queue landed
                raise _transition_error(session, trial_id, "re-queue", "it has finished", attempt)
            session.execute(delete(TrialMetricModel).where(TrialMetricModel.trial_id == trial_id))
            return _trial_record(_trial(session, trial_id))

    def requeue_interrupted(self, experiment_id: int) -> list[TrialRecord]:
        interrupted = (TrialState.RUNNING.value, TrialState.INTERRUPTED.value)
        requeue = (
            update(TrialModel)
            .where(TrialModel.experiment_id == experiment_id, TrialModel.state.in_(interrupted))
            .values(
                state=TrialState.QUEUED.value,
                reason=REQUEUE_REASON,
                started_at=None,
                finished_at=None,
                pid=None,
                host=None,
                worker=None,
                attempt=TrialModel.attempt + 1,
                told_before=None,
                told_order=None,
            )
            .returning(TrialModel.id)
            .execution_options(synchronize_session=False)
        )
        with self._session(write=True) as session:
            _require_experiment(session, experiment_id)
            # One statement, so a trial finishing at this moment is either requeued or kept, never both.
            trial_ids = list(session.scalars(requeue))
            if not trial_ids:
                return []
            _count_change(session, experiment_id)
            session.execute(delete(TrialMetricModel).where(TrialMetricModel.trial_id.in_(trial_ids)))
            trials = session.scalars(select(TrialModel).where(TrialModel.id.in_(trial_ids)).order_by(TrialModel.number))
            return [_trial_record(trial) for trial in trials]

    # -- metrics -------------------------------------------------------------------------------------------

    def add_metrics(self, trial_id: int, points: Iterable[MetricPoint | tuple], *, attempt: int | None = None) -> int:
        points = list(points)
        # The trial's row is share-locked (PostgreSQL; SQLite's write lock covers it) until the rows are in, so a
        # concurrent finish or interrupt lands either before the check (nothing stored) or after the insert.
        current = select(TrialModel.state, TrialModel.attempt).where(TrialModel.id == trial_id)
        current = current.with_for_update(read=True)
        with self._session(write=True) as session:
            row = session.execute(current).first()
            if row is None:
                raise NotFoundError(f"trial {trial_id} does not exist")
            if attempt is not None and row.attempt != attempt:
                raise _stale(trial_id, attempt, row.attempt)
            if row.state not in (TrialState.QUEUED.value, TrialState.RUNNING.value):
                raise TrialClosedError(
                    f"trial {trial_id} is {row.state}: its record is closed and takes no more metrics "
                    "(the process writing them outlived its attempt)"
                )
            # stamped under the lock: never after a finish that follows
            rows = _metric_rows(trial_id, points, self._trial_clock())
            if rows:  # a value already stored (same trial, name, step and samples) stays as it is: no duplicate
                dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
                new_only = dialect.insert(TrialMetricModel).on_conflict_do_nothing(index_elements=METRIC_KEY)
                session.execute(new_only, rows)
        return len(rows)


def _with_clock(session: Session, experiment: ExperimentModel) -> tuple[ExperimentModel, datetime | None]:
    """The experiment and, while it runs, the clock its heartbeat is judged by (`ExperimentRecord.read_at`)."""
    running = experiment.status == ExperimentStatus.RUNNING.value
    return experiment, _controller_time(session) if running else None


PURGE_CHUNK = 1_000  # trials whose curves one statement of `purge_experiment` removes


def _controller_time(session: Session) -> datetime:
    """The time heartbeats are dated and judged by: a database server's own clock (controllers on several machines
    share it: one whose clock runs ahead would take a live controller's experiment over), this machine's for SQLite
    (used from one machine)."""
    if session.get_bind().dialect.name == "sqlite":
        return _now()
    return _utc(session.scalar(select(func.now())))


def _retried(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` under its storage's retry: run again, whole, while the database is away (hpo.storage.retry)."""

    @functools.wraps(method)
    def retried(self: SqlStorage, *args: Any, **kwargs: Any) -> Any:
        return self._retry(lambda: method(self, *args, **kwargs))

    return retried


# Every method of the interface waits out an unreachable database (see the module docstring); the trial clock, the
# file check (one stat, called inside the others' tries: a retry's success there would end their outage) and the
# helpers above are not database calls.
for _name in sorted(Storage.__abstractmethods__ - {"use_trial_clock", "replaced_file"}):
    setattr(SqlStorage, _name, _retried(getattr(SqlStorage, _name)))
