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
import json
import random
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    bindparam,
    cast,
    delete,
    extract,
    func,
    literal,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from hpo.errors import ControllerBusyError, NotFoundError, StaleAttemptError, StorageError, TrialClosedError
from hpo.storage.base import (
    Direction,
    ExperimentRecord,
    ExperimentStatus,
    MetricPoint,
    MetricRecord,
    Storage,
    TrialRecord,
    TrialSpan,
    TrialTally,
    TrialVersion,
)
from hpo.storage.engine import (
    WRITE_OPTION,
    create_storage_engine,
    default_database_url,
    dumps_json,
    is_locked_error,
    safe_url,
    storage_error,
)
from hpo.storage.migrate import check_schema, upgrade_database
from hpo.storage.models import METRIC_KEY, ExperimentModel, TrialMetricModel, TrialModel
from hpo.storage.noise import NOISE_METRICS, late_noise_of
from hpo.storage.retry import Outage, call_with_retry, replaying
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState

__all__ = ["SqlStorage", "default_database_url"]

# SQLite already waits up to its busy timeout for the write lock; these retries cover the rare case where a
# writer holds it longer (e.g. a checkpoint of a large WAL file on a slow disk).
LOCK_RETRIES = 4
LOCK_BACKOFF_S = 0.2
_STATES = {state.value: state for state in TrialState}  # a dict lookup; TrialState(value) costs 10x more
REQUEUE_REASON = "interrupted: the controller stopped while the trial ran; re-queued on resume"
DEFINITION_KEYS = ("experiment", "run_dir")  # what `annotate_experiment` never changes
_UNFINISHED = (TrialState.QUEUED.value, TrialState.RUNNING.value, TrialState.INTERRUPTED.value)


class SqlStorage(Storage):
    """The storage on an SQL database reached through SQLAlchemy (see the module docstring)."""

    def __init__(self, url: str | None = None, *, upgrade: bool = False, outage_s: float = 0.0) -> None:
        self.url = url or default_database_url()
        self._trial_clock: Callable[[], datetime] = _now
        self.outage_s = outage_s  # how long a call waits for a database that is away (hpo.storage.retry)
        self._outage = Outage()
        self._rng = random.Random()  # jitter: differs between processes on purpose
        self._stop_waiting: Callable[[], str | None] = lambda: None
        if upgrade:
            upgrade_database(self.url)
        self._engine = create_storage_engine(self.url)
        # Both share the engine's connection pool. Writes take SQLite's write lock up front. Reads on PostgreSQL
        # skip BEGIN/COMMIT (two round trips): at READ COMMITTED every statement has its own snapshot anyway,
        # while SQLite's read transaction does give all statements of a method one snapshot, so it stays.
        self._write_engine = self._engine.execution_options(**{WRITE_OPTION: True})
        self._read_engine = self._engine
        self._directions: dict[int, Direction] = {}  # an experiment's direction never changes
        if self._engine.dialect.name != "sqlite":
            self._read_engine = self._engine.execution_options(isolation_level="AUTOCOMMIT")
        try:
            self._retry(self._check_schema)
        except BaseException:
            self._engine.dispose()
            raise

    def _check_schema(self) -> None:
        with self._session() as session:
            check_schema(session.connection(), self.url)

    def __repr__(self) -> str:
        return f"SqlStorage({safe_url(self.url)!r})"

    def close(self) -> None:
        self._engine.dispose()

    def use_trial_clock(self, clock: Callable[[], datetime]) -> None:
        self._trial_clock = clock

    def wait_for_outages(self, outage_s: float, stop: Callable[[], str | None] | None = None) -> None:
        self.outage_s = outage_s
        self._stop_waiting = stop or (lambda: None)

    def unreachable_for(self) -> float | None:
        return self._outage.unreachable_for()

    def _retry(self, call: Callable[[], Any]) -> Any:
        """`call()` under the retry of hpo.storage.retry (this storage's bound, outage clock and stop)."""
        return call_with_retry(call, self._outage, self.outage_s, self._rng, self._stop_waiting)

    # -- the session helper --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _session(self, *, write: bool = False) -> Iterator[Session]:
        """One transaction: committed when the block succeeds, rolled back otherwise.

        Database errors leave as StorageError naming the database (password hidden); `write=True` takes
        SQLite's write lock when the block starts, retrying with backoff while the database is locked.
        """
        session = Session(self._write_engine if write else self._read_engine, expire_on_commit=False)
        try:
            self._begin(session)
            yield session
            session.commit()
        except SQLAlchemyError as exc:
            raise storage_error(exc, self.url) from exc
        finally:
            # close() rolls back whatever was not committed; a dead connection must not mask the real error.
            with contextlib.suppress(SQLAlchemyError):
                session.close()

    @staticmethod
    def _begin(session: Session) -> None:
        # Starting the transaction here (not at the first statement) means the only place SQLite can report
        # "database is locked" is this call, which is safe to repeat: nothing has happened yet.
        for attempt in range(LOCK_RETRIES):
            try:
                session.connection()
                return
            except OperationalError as exc:
                if not is_locked_error(exc) or attempt == LOCK_RETRIES - 1:
                    raise
                session.close()
                time.sleep(LOCK_BACKOFF_S * 2**attempt)

    def _rows(self, statement: Select, params: dict[str, Any]) -> list:
        """The rows of one read-only statement, on a pooled connection without a Session: a Session's own set-up and
        teardown are most of the time of a one-row read (BENCHMARKS.md, "REST API under load"). One statement
        needs no transaction around it; database errors leave as StorageError, as from `_session`."""
        try:
            with self._read_engine.connect() as connection:
                return connection.execute(statement, params).all()
        except SQLAlchemyError as exc:
            raise storage_error(exc, self.url) from exc

    # -- experiments ---------------------------------------------------------------------------------------

    def create_experiment(self, name: str, spec: Mapping[str, Any], direction: Direction | str) -> int:
        experiment = ExperimentModel(
            name=name,
            direction=Direction(direction).value,
            status=ExperimentStatus.RUNNING.value,
            spec=dict(spec),
            stop_requested=False,
            created_at=_now(),
        )
        if replaying() and (earlier := self._created_experiment(name, experiment)) is not None:
            return earlier  # the first try's commit landed before the connection broke
        with self._session(write=True) as session:
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
            if found.spec != _as_stored(wanted.spec) or session.scalar(
                select(TrialModel.id).where(TrialModel.experiment_id == found.id).limit(1)
            ):
                return None
            return found.id

    def get_experiment(self, experiment_id: int) -> ExperimentRecord:
        with self._session() as session:
            return _experiment_record(_experiment(session, experiment_id))

    def get_experiment_by_name(self, name: str) -> ExperimentRecord:
        with self._session() as session:
            experiment = session.scalars(select(ExperimentModel).where(ExperimentModel.name == name)).first()
            if experiment is None:
                raise NotFoundError(f"no experiment named {name!r} in {safe_url(self.url)}")
            return _experiment_record(experiment)

    def list_experiments(self, status: ExperimentStatus | str | None = None) -> list[ExperimentRecord]:
        query = select(ExperimentModel).order_by(ExperimentModel.id)
        if status is not None:
            query = query.where(ExperimentModel.status == ExperimentStatus(status).value)
        with self._session() as session:
            return [_experiment_record(experiment) for experiment in session.scalars(query)]

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

    def claim_controller(self, experiment_id: int, host: str, pid: int, stale_after_s: float) -> None:
        now = _now()
        free = or_(
            ExperimentModel.controller_pid.is_(None),
            ExperimentModel.heartbeat_at.is_(None),
            ExperimentModel.heartbeat_at < now - timedelta(seconds=stale_after_s),
            (ExperimentModel.controller_host == host) & (ExperimentModel.controller_pid == pid),
        )
        claim = (
            update(ExperimentModel)
            .where(ExperimentModel.id == experiment_id, free)
            .values(controller_host=host, controller_pid=pid, heartbeat_at=now, controller_note=None)
            .execution_options(synchronize_session=False)
        )
        with self._session(write=True) as session:
            # One conditional UPDATE: of two controllers claiming at once, exactly one wins.
            if session.execute(claim).rowcount == 1:
                return
            experiment = _experiment(session, experiment_id)
            age = (now - _utc(experiment.heartbeat_at)).total_seconds()
            holder = f"host {experiment.controller_host}, pid {experiment.controller_pid}"
        raise ControllerBusyError(
            f"experiment {experiment.name!r} is driven by a live controller ({holder}, last heartbeat {age:.0f} s "
            "ago); stop it first (Ctrl-C there, or `POST /api/v1/experiments/NAME/stop`), or wait until it ends"
        )

    def heartbeat(self, experiment_id: int, host: str, pid: int, note: str | None = None) -> bool:
        beat = (
            update(ExperimentModel)
            .where(
                ExperimentModel.id == experiment_id,
                ExperimentModel.controller_host == host,
                ExperimentModel.controller_pid == pid,
            )
            .values(heartbeat_at=_now(), controller_note=note)
            .execution_options(synchronize_session=False)
        )
        with self._session(write=True) as session:
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

    def create_trial(self, experiment_id: int, spec: TrialSpec) -> int:
        if replaying() and (earlier := self._created_trial(experiment_id, spec)) is not None:
            return earlier  # the first try's commit landed before the connection broke
        with self._session(write=True) as session:
            # Lock the experiment row (PostgreSQL; SQLite's write transaction is already exclusive), so the next
            # number is computed by one creator at a time.
            locked = select(ExperimentModel.id).where(ExperimentModel.id == experiment_id).with_for_update()
            if session.scalar(locked) is None:
                raise _experiment_not_found(experiment_id)
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
                created_at=self._trial_clock(),
            )
            session.add(trial)
            try:
                session.flush()
            except IntegrityError as exc:
                raise StorageError(
                    f"experiment {experiment_id} already has a trial number {number}: "
                    "number new trials from next_trial_number(), or pass number=None"
                ) from exc
            _count_change(session, experiment_id)
            return trial.id

    def _created_trial(self, experiment_id: int, spec: TrialSpec) -> int | None:
        """The id of the trial `spec` describes if a retried `create_trial` finds it just created: the trial with
        `spec.number`, or without one the experiment's newest trial, queued at attempt 0 with the same parameters,
        arm, budget, kind and seed."""
        query = select(TrialModel).where(TrialModel.experiment_id == experiment_id)
        if spec.number is None:
            query = query.order_by(TrialModel.number.desc()).limit(1)
        else:
            query = query.where(TrialModel.number == spec.number)
        with self._session() as session:
            found = session.scalars(query).first()
            if found is None or (found.state, found.attempt) != (TrialState.QUEUED.value, 0):
                return None
            wanted = (_as_stored(dict(spec.params)), spec.arm, spec.budget, TrialKind(spec.kind).value, spec.seed)
            return found.id if (found.params, found.arm, found.budget, found.kind, found.seed) == wanted else None

    def next_trial_number(self, experiment_id: int) -> int:
        with self._session() as session:
            _require_experiment(session, experiment_id)
            highest = session.scalar(
                select(func.max(TrialModel.number)).where(TrialModel.experiment_id == experiment_id)
            )
            return 0 if highest is None else highest + 1

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
        }
        from_states = [TrialState.QUEUED.value, TrialState.RUNNING.value, TrialState.INTERRUPTED.value]
        with self._session(write=True) as session:
            if not _update_trial(session, trial_id, from_states, values, attempt):
                if replaying() and _is_as(session, trial_id, attempt + 1, state=TrialState.QUEUED.value):
                    return _trial_record(_trial(session, trial_id))  # the first try's re-queue landed
                raise _transition_error(session, trial_id, "re-queue", "it has finished", attempt)
            session.execute(delete(TrialMetricModel).where(TrialMetricModel.trial_id == trial_id))
            return _trial_record(_trial(session, trial_id))

    def get_trial(self, trial_id: int) -> TrialRecord:
        with self._session() as session:
            return _trial_record(_trial(session, trial_id))

    def get_trial_by_number(self, experiment_id: int, number: int) -> TrialRecord:
        query = select(TrialModel).where(TrialModel.experiment_id == experiment_id, TrialModel.number == number)
        with self._session() as session:
            trial = session.scalars(query).first()
            if trial is None:
                _require_experiment(session, experiment_id)
                raise NotFoundError(f"experiment {experiment_id} has no trial number {number}")
            return _trial_record(trial)

    def list_trials(
        self,
        experiment_id: int,
        *,
        state: TrialState | Collection[TrialState] | None = None,
        arm: str | None = None,
        offset: int = 0,
        limit: int | None = None,
        order_by: str = "number",
        after: int | None = None,
    ) -> list[TrialRecord]:
        # Rows, not ORM objects: a trial record reads the same attributes from either, three times faster (a
        # 10,000-trial report lists every trial).
        read = lambda result: [_trial_record(row) for row in result]  # noqa: E731
        return self._paged(
            select(TrialModel.__table__), read, experiment_id, state, arm, offset, limit, order_by, after
        )

    def list_trial_versions(
        self,
        experiment_id: int,
        *,
        state: TrialState | Collection[TrialState] | None = None,
        arm: str | None = None,
        offset: int = 0,
        limit: int | None = None,
        order_by: str = "number",
        after: int | None = None,
    ) -> list[TrialVersion]:
        read = lambda result: [TrialVersion(id, number, _STATES[state], attempt or 0)  # noqa: E731
                               for id, number, state, attempt in result]  # fmt: skip
        states = _state_values(state) or []  # [] for none, or an empty filter (which the general path answers)
        simple = order_by == "number" and not offset and (after or 0) >= 0 and (limit or 0) >= 0
        if simple and (state is None or len(states) == 1 or (len(states) > 1 and limit is not None)):
            # A key page, the API's deep page (BENCHMARKS.md "REST API under load"): its prebuilt statement
            # skips building and hashing a new one on every request (about a quarter of its time on PostgreSQL).
            params = {"experiment_id": experiment_id, "arm": arm, "after": after, "limit": limit}
            params.update((f"state_{i}", value) for i, value in enumerate(states))
            statement = _versions_statement(arm is not None, len(states), after is not None, limit is not None)
            rows = read(self._rows(statement, {k: v for k, v in params.items() if v is not None}))
            if not rows:  # only an empty page needs to tell a missing experiment from one without such trials
                with self._session() as session:
                    _require_experiment(session, experiment_id)
            return rows
        columns = select(TrialModel.id, TrialModel.number, TrialModel.state, TrialModel.attempt)
        return self._paged(columns, read, experiment_id, state, arm, offset, limit, order_by, after)

    def get_trials(self, trial_ids: Collection[int]) -> list[TrialRecord]:
        if not trial_ids:
            return []
        query = select(TrialModel).where(TrialModel.id.in_(list(trial_ids)))
        with self._session() as session:
            found = {trial.id: _trial_record(trial) for trial in session.scalars(query)}
        missing = [i for i in trial_ids if i not in found]
        if missing:
            raise NotFoundError(f"no trial with id {missing[0]}")
        return [found[i] for i in trial_ids]

    def _paged(self, what: Select, read: Callable, experiment_id: int, *page) -> list:
        """`read` of the result of `what` (trials, or some of their columns) paged as `list_trials` says."""
        with self._session() as session:
            rows = read(session.execute(self._page(session, what, experiment_id, *page)))
            if not rows:  # only an empty page needs to tell a missing experiment from one without such trials
                _require_experiment(session, experiment_id)
            return rows

    def _page(self, session: Session, query: Select, experiment_id: int, state, arm: str | None, offset: int,
              limit: int | None, order_by: str, after: int | None) -> Select:  # fmt: skip
        """`query` (trials, or some of their columns) filtered, ordered and paged as `list_trials` says."""
        if offset < 0 or (limit is not None and limit < 0) or (after is not None and after < 0):
            raise ValueError(
                f"offset, limit and after must not be negative, got offset={offset}, limit={limit}, after={after}"
            )
        if order_by not in ("number", "objective"):
            raise ValueError(f"order_by must be 'number' or 'objective', got {order_by!r}")
        if after is not None and order_by != "number":
            raise ValueError("after pages in number order; page order_by='objective' with offset")
        states = _state_values(state)
        if order_by == "number" and limit is not None and states and len(states) > 1:
            return _merged_page(query, experiment_id, states, arm, offset, limit, after)
        query = query.where(*_trial_filters(experiment_id, state, arm))
        if after is not None:
            query = query.where(TrialModel.number > after)  # a range of an (experiment, [arm,] [state,] number) index
        if order_by == "objective":
            best_first = TrialModel.objective.asc()
            if self._direction(session, experiment_id) is Direction.MAXIMIZE:
                best_first = TrialModel.objective.desc()
            query = query.order_by(TrialModel.objective.is_(None), best_first, TrialModel.number)
        else:
            query = query.order_by(TrialModel.number)
        return query.offset(offset).limit(limit)

    def count_trials(
        self, experiment_id: int, *, state: TrialState | Collection[TrialState] | None = None, arm: str | None = None
    ) -> int:
        query = select(func.count()).select_from(TrialModel).where(*_trial_filters(experiment_id, state, arm))
        with self._session() as session:
            _require_experiment(session, experiment_id)
            return session.scalar(query) or 0

    def count_trials_by_state(self, experiment_id: int) -> dict[TrialState, int]:
        query = (
            select(TrialModel.state, func.count())
            .where(TrialModel.experiment_id == experiment_id)
            .group_by(TrialModel.state)
        )
        with self._session() as session:
            _require_experiment(session, experiment_id)
            counts = {TrialState(state): count for state, count in session.execute(query)}
        return {state: counts.get(state, 0) for state in TrialState}

    def tally_trials(self, experiment_id: int) -> list[TrialTally]:
        query = (
            select(
                TrialModel.kind,
                TrialModel.state,
                TrialModel.arm,
                func.count(),
                func.count(TrialModel.samples_to_target),
            )
            .where(TrialModel.experiment_id == experiment_id)
            .group_by(TrialModel.kind, TrialModel.state, TrialModel.arm)
        )
        with self._session() as session:
            _require_experiment(session, experiment_id)
            rows = session.execute(query).all()
        tallies = [TrialTally(TrialKind(kind or TrialKind.TUNING.value), TrialState(state), arm, trials, reached)
                   for kind, state, arm, trials, reached in rows]  # fmt: skip
        # the same order on every backend (they sort NULL arms differently)
        return sorted(tallies, key=lambda t: (t.kind.value, t.state.value, t.arm is not None, t.arm or ""))

    def list_confirmations(self, experiment_id: int) -> list[TrialRecord]:
        query = select(TrialModel.__table__).where(TrialModel.experiment_id == experiment_id,
                                                   TrialModel.kind == TrialKind.CONFIRMATION.value)  # fmt: skip
        with self._session() as session:
            # sorted here: ORDER BY number would have SQLite walk every trial in number order instead of the
            # kind index
            trials = sorted((_trial_record(row) for row in session.execute(query)), key=lambda t: t.number)
            if not trials:
                _require_experiment(session, experiment_id)
            return trials

    def trial_span(self, experiment_id: int) -> TrialSpan:
        ended = [TrialModel.experiment_id == experiment_id, TrialModel.started_at.is_not(None),
                 TrialModel.finished_at.is_not(None)]  # fmt: skip
        with self._session() as session:
            _require_experiment(session, experiment_id)
            busy = _microseconds(session, TrialModel.finished_at) - _microseconds(session, TrialModel.started_at)
            query = select(
                func.count(), func.sum(busy), func.min(TrialModel.created_at), func.max(TrialModel.finished_at)
            )
            count, busy_us, first, last = session.execute(query.where(*ended)).one()
        return TrialSpan(count, int(busy_us or 0) / 1e6, _utc(first), _utc(last))

    def trials_version(self, experiment_id: int) -> int:
        rows = self._rows(_VERSION, {"experiment_id": experiment_id})
        if not rows:
            raise _experiment_not_found(experiment_id)
        return rows[0][0]

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

    def get_metrics(self, trial_id: int, name: str | None = None) -> list[MetricRecord]:
        query = select(TrialMetricModel).where(TrialMetricModel.trial_id == trial_id)
        if name is not None:
            query = query.where(TrialMetricModel.name == name)
        query = query.order_by(TrialMetricModel.step, TrialMetricModel.name, TrialMetricModel.id)
        with self._session() as session:
            _require_trial(session, trial_id)
            return [_metric_record(row) for row in session.scalars(query)]

    def get_experiment_metrics(
        self, experiment_id: int, names: Collection[str], *, times: bool = True
    ) -> dict[int, list[MetricRecord]]:
        metric = TrialMetricModel
        when = metric.created_at if times else literal(None)
        query = (select(metric.trial_id, metric.step, metric.samples, metric.name, metric.value, when)
                 .join(TrialModel, TrialModel.id == metric.trial_id)
                 .where(TrialModel.experiment_id == experiment_id, metric.name.in_(list(names)))
                 .order_by(metric.trial_id, metric.step, metric.name, metric.id))  # fmt: skip
        by_trial: dict[int, list[MetricRecord]] = {}
        nan = float("nan")
        with self._session() as session:
            _require_experiment(session, experiment_id)
            for trial_id, step, samples, name, value, created_at in session.execute(query):
                by_trial.setdefault(trial_id, []).append(MetricRecord(
                    trial_id, step, samples, name, nan if value is None else value,
                    _utc(created_at) if times else None))  # fmt: skip
        return by_trial

    # -- best trials ---------------------------------------------------------------------------------------

    def best_trial(
        self, experiment_id: int, *, arm: str | None = None, global_batch_size: int | None = None
    ) -> TrialRecord | None:
        with self._session() as session:
            best = session.scalars(*self._best(session, experiment_id, arm, global_batch_size, id_only=False)).first()
            return None if best is None else _trial_record(best)

    def best_trial_id(
        self, experiment_id: int, *, arm: str | None = None, global_batch_size: int | None = None
    ) -> int | None:
        with self._session() as session:
            return session.execute(*self._best(session, experiment_id, arm, global_batch_size, id_only=True)).scalar()

    def _best(
        self, session: Session, experiment_id: int, arm: str | None, global_batch_size: int | None, *, id_only: bool
    ) -> tuple[Select, dict[str, Any]]:
        """The best-trial statement for these filters and its parameters. The API asks it on every request: the
        statement is prebuilt, which skips building and hashing a new one."""
        statement = _best_trial_statement(self._direction(session, experiment_id), arm is not None,
                                          global_batch_size is not None, id_only)  # fmt: skip
        params = {"experiment_id": experiment_id, "arm": arm, "global_batch_size": global_batch_size}
        return statement, {k: v for k, v in params.items() if v is not None}

    def _direction(self, session: Session, experiment_id: int) -> Direction:
        direction = self._directions.get(experiment_id)
        if direction is None:
            direction = self._directions[experiment_id] = _direction(session, experiment_id)
        return direction

    def best_per_arm(self, experiment_id: int) -> dict[str, TrialRecord]:
        with self._session() as session:
            direction = _direction(session, experiment_id)
            arms = _arms(session, experiment_id)
            if not arms:
                return {}
            # One statement for all arms: the id of each arm's best trial is a scalar subquery.
            best_ids = [
                _best_trial_query(direction, [TrialModel.experiment_id == experiment_id, TrialModel.arm == arm])
                .with_only_columns(TrialModel.id)
                .scalar_subquery()
                for arm in arms
            ]
            trials = session.scalars(select(TrialModel).where(TrialModel.id.in_(best_ids)).order_by(TrialModel.arm))
            return {trial.arm: _trial_record(trial) for trial in trials}


def _retried(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` under its storage's retry: run again, whole, while the database is away (hpo.storage.retry)."""

    @functools.wraps(method)
    def retried(self: SqlStorage, *args: Any, **kwargs: Any) -> Any:
        return self._retry(lambda: method(self, *args, **kwargs))

    return retried


# -- queries ---------------------------------------------------------------------------------------------------


def _experiment(session: Session, experiment_id: int) -> ExperimentModel:
    experiment = session.get(ExperimentModel, experiment_id)
    if experiment is None:
        raise _experiment_not_found(experiment_id)
    return experiment


def _require_experiment(session: Session, experiment_id: int) -> None:
    if session.scalar(select(ExperimentModel.id).where(ExperimentModel.id == experiment_id)) is None:
        raise _experiment_not_found(experiment_id)


def _direction(session: Session, experiment_id: int) -> Direction:
    direction = session.scalar(select(ExperimentModel.direction).where(ExperimentModel.id == experiment_id))
    if direction is None:
        raise _experiment_not_found(experiment_id)
    return Direction(direction)


def _trial(session: Session, trial_id: int) -> TrialModel:
    trial = session.get(TrialModel, trial_id)
    if trial is None:
        raise NotFoundError(f"trial {trial_id} does not exist")
    return trial


def _require_trial(session: Session, trial_id: int) -> None:
    if session.scalar(select(TrialModel.id).where(TrialModel.id == trial_id)) is None:
        raise NotFoundError(f"trial {trial_id} does not exist")


def _experiment_not_found(experiment_id: int) -> NotFoundError:
    return NotFoundError(f"experiment {experiment_id} does not exist")


def _update_trial(
    session: Session, trial_id: int, from_states: Collection[str], values: dict[str, Any], attempt: int | None = None
) -> bool:
    """Apply `values` if the trial is in one of `from_states` (and at `attempt`, when given), counting the change in
    its experiment's `trials_version` in the same transaction; whether it was applied."""
    conditions = [TrialModel.id == trial_id, TrialModel.state.in_(from_states)]
    if attempt is not None:
        conditions.append(TrialModel.attempt == attempt)
    statement = (update(TrialModel).where(*conditions).values(**values).returning(TrialModel.experiment_id)
                 .execution_options(synchronize_session=False))  # fmt: skip
    experiment_id = session.execute(statement).scalar()
    if experiment_id is None:
        return False
    _count_change(session, experiment_id)
    return True


def _count_change(session: Session, experiment_id: int) -> None:
    """One more in the experiment's `trials_version`. A change of an existing trial locks the experiment's row
    after the trial's (PostgreSQL), and `create_trial`, which locks it first, waits on no trial's row: two such
    transactions never wait on each other in a cycle."""
    session.execute(_COUNT_CHANGE, {"experiment_id": experiment_id})


_VERSION = select(ExperimentModel.trials_version).where(ExperimentModel.id == bindparam("experiment_id"))
_COUNT_CHANGE = (
    update(ExperimentModel)
    .where(ExperimentModel.id == bindparam("experiment_id"))
    .values(trials_version=ExperimentModel.trials_version + 1)
    .execution_options(synchronize_session=False)
)


def _transition_error(
    session: Session, trial_id: int, action: str, why: str, attempt: int | None = None
) -> StorageError:
    row = session.execute(select(TrialModel.state, TrialModel.attempt).where(TrialModel.id == trial_id)).first()
    if row is None:
        return NotFoundError(f"trial {trial_id} does not exist")
    if attempt is not None and row.attempt != attempt:
        return _stale(trial_id, attempt, row.attempt)
    return StorageError(f"cannot {action} trial {trial_id}: it is {row.state} ({why})")


def _is_as(session: Session, trial_id: int, attempt: int | None, **wanted: Any) -> bool:
    """Whether the trial (at `attempt`, when given) has these column values: the state a write would leave, found
    already there when the write is repeated."""
    conditions = [TrialModel.id == trial_id, *(getattr(TrialModel, key) == value for key, value in wanted.items()
                                               if value is not None)]  # fmt: skip
    conditions += [getattr(TrialModel, key).is_(None) for key, value in wanted.items() if value is None]
    if attempt is not None:
        conditions.append(TrialModel.attempt == attempt)
    return session.scalar(select(TrialModel.id).where(*conditions)) is not None


def _as_stored(value: Any) -> Any:
    """`value` as a JSON column hands it back (NaN as None, tuples as lists, numpy scalars as numbers)."""
    return json.loads(dumps_json(value))


def _stale(trial_id: int, attempt: int, current: int) -> StaleAttemptError:
    return StaleAttemptError(
        f"trial {trial_id} is at attempt {current}, not {attempt}: this process belongs to a replaced attempt "
        "(its worker was lost and the trial re-queued); its results are not recorded"
    )


def _trial_filters(
    experiment_id: int, state: TrialState | Collection[TrialState] | None, arm: str | None
) -> list[ColumnElement[bool]]:
    conditions = [TrialModel.experiment_id == experiment_id]
    if isinstance(state, TrialState):
        conditions.append(TrialModel.state == state.value)
    elif state is not None:
        conditions.append(TrialModel.state.in_([TrialState(s).value for s in state]))
    if arm is not None:
        conditions.append(TrialModel.arm == arm)
    return conditions


def _best_trial_query(direction: Direction, conditions: list[ColumnElement[bool]]) -> Select[tuple[TrialModel]]:
    """The lowest-numbered trial with the best objective among COMPLETED trials meeting `conditions`."""
    completed = [
        *conditions,
        TrialModel.state == TrialState.COMPLETED.value,
        TrialModel.objective.is_not(None),
        TrialModel.kind == TrialKind.TUNING.value,  # confirmation runs re-run a best config; they are not rivals
    ]
    best_first = TrialModel.objective.asc() if direction is Direction.MINIMIZE else TrialModel.objective.desc()
    # Two index lookups: the best objective value, then the first trial that has it (ties -> earliest).
    # ORDER BY ... LIMIT 1 rather than MIN/MAX: PostgreSQL without fresh statistics (right after a bulk load)
    # plans MIN/MAX as a scan of every matching index entry; the ordered index scan it never gets wrong.
    best_objective = select(TrialModel.objective).where(*completed).order_by(best_first).limit(1).scalar_subquery()
    query = select(TrialModel).where(*completed, TrialModel.objective == best_objective)
    return query.order_by(TrialModel.number).limit(1)


@functools.cache
def _best_trial_statement(direction: Direction, by_arm: bool, by_batch: bool, id_only: bool = False) -> Select:
    """`_best_trial_query` with bound parameters `experiment_id` (and `arm`, `global_batch_size`); with `id_only`
    it selects only the trial's id (no row to build into an object)."""
    conditions = [TrialModel.experiment_id == bindparam("experiment_id")]
    if by_arm:
        conditions.append(TrialModel.arm == bindparam("arm"))
    if by_batch:
        conditions.append(TrialModel.global_batch_size == bindparam("global_batch_size"))
    query = _best_trial_query(direction, conditions)
    return query.with_only_columns(TrialModel.id) if id_only else query


def _state_values(state: TrialState | Collection[TrialState] | None) -> list[str] | None:
    """The distinct values a state filter allows, sorted; None without a state filter."""
    if state is None:
        return None
    return sorted({TrialState(state).value} if isinstance(state, str) else {TrialState(s).value for s in state})


def _merged_page(query: Select, experiment_id: int, states: list[str], arm: str | None, offset: int, limit: int,
                 after: int | None) -> Select:  # fmt: skip
    """`query` paged in number order among trials in any of several `states`: the first `offset + limit` of each
    state from its own index range (experiment, [arm,] state, number), merged. `state IN (...) ORDER BY number`
    would read and sort every matching trial of the experiment."""
    branches = []
    for state in states:
        branch = select(TrialModel.id, TrialModel.number).where(*_trial_filters(experiment_id, TrialState(state), arm))
        if after is not None:
            branch = branch.where(TrialModel.number > after)
        first = branch.order_by(TrialModel.number).limit(offset + limit).subquery()
        branches.append(select(first.c.id, first.c.number))  # SQLite takes no LIMIT inside a UNION member itself
    merged = union_all(*branches).subquery("merged")
    return query.join(merged, TrialModel.id == merged.c.id).order_by(merged.c.number).offset(offset).limit(limit)


@functools.cache
def _versions_statement(by_arm: bool, states: int, by_after: bool, limited: bool) -> Select:
    """The trial versions (id, number, state, attempt) of an experiment in number order, with bound parameters
    `experiment_id` (and `arm`, `state_0` ... for `states` states, `after`: numbers above it, `limit`, which
    several states need): `_page` of the same filters, prebuilt (several states merged as `_merged_page` does)."""

    def conditions(state: str | None) -> list[ColumnElement[bool]]:
        where = [TrialModel.experiment_id == bindparam("experiment_id")]
        where += [TrialModel.arm == bindparam("arm")] if by_arm else []
        where += [TrialModel.state == bindparam(state)] if state else []
        return where + ([TrialModel.number > bindparam("after")] if by_after else [])

    columns = (TrialModel.id, TrialModel.number, TrialModel.state, TrialModel.attempt)
    if states < 2:
        query = select(*columns).where(*conditions("state_0" if states else None)).order_by(TrialModel.number)
        return query.limit(bindparam("limit")) if limited else query
    firsts = [select(TrialModel.id, TrialModel.number).where(*conditions(f"state_{i}")).order_by(TrialModel.number)
              .limit(bindparam("limit")).subquery() for i in range(states)]  # fmt: skip
    merged = union_all(*(select(first.c.id, first.c.number) for first in firsts)).subquery("merged")
    query = select(*columns).join(merged, TrialModel.id == merged.c.id).order_by(merged.c.number)
    return query.limit(bindparam("limit"))


def _noise_records(session: Session, trial_id: int) -> list[MetricRecord]:
    """The trial's records of NOISE_METRICS (hpo/storage/noise.py), without times; NaN for NULL."""
    metric = TrialMetricModel
    query = select(metric.step, metric.samples, metric.name, metric.value).where(
        metric.trial_id == trial_id, metric.name.in_(NOISE_METRICS)
    )
    nan = float("nan")
    return [MetricRecord(trial_id, step, samples, name, nan if value is None else value, None)
            for step, samples, name, value in session.execute(query)]  # fmt: skip


def _microseconds(session: Session, moment) -> ColumnElement[int]:
    """A stored time as whole microseconds since 1970 (differences of two are exact): SQLite keeps times as text
    `YYYY-MM-DD HH:MM:SS.ffffff` (its own date functions keep only milliseconds), PostgreSQL's epoch is exact."""
    if session.get_bind().dialect.name == "sqlite":
        seconds = cast(func.strftime("%s", moment), BigInteger)
        return seconds * 1_000_000 + cast(func.substr(moment, 21, 6), BigInteger)
    return cast(extract("epoch", moment) * 1_000_000, BigInteger)


def _arms(session: Session, experiment_id: int) -> list[str]:
    """The experiment's distinct arms in one statement: a recursive "loose index scan", one index lookup per arm
    (SELECT DISTINCT would read an index entry per trial)."""
    in_experiment = TrialModel.experiment_id == experiment_id
    arms = select(func.min(TrialModel.arm).label("arm")).where(in_experiment).cte("arms", recursive=True)
    next_arm = select(func.min(TrialModel.arm)).where(in_experiment, TrialModel.arm > arms.c.arm).scalar_subquery()
    arms = arms.union_all(select(next_arm).where(arms.c.arm.is_not(None)))
    return list(session.scalars(select(arms.c.arm).where(arms.c.arm.is_not(None))))


# -- records ---------------------------------------------------------------------------------------------------


def _experiment_record(experiment: ExperimentModel) -> ExperimentRecord:
    return ExperimentRecord(
        id=experiment.id,
        name=experiment.name,
        direction=Direction(experiment.direction),
        status=ExperimentStatus(experiment.status),
        spec=dict(experiment.spec or {}),
        stop_requested=bool(experiment.stop_requested),
        created_at=_utc(experiment.created_at),
        ended_at=_utc(experiment.ended_at),
        controller_host=experiment.controller_host,
        controller_pid=experiment.controller_pid,
        heartbeat_at=_utc(experiment.heartbeat_at),
        controller_note=experiment.controller_note,
        trials_version=experiment.trials_version or 0,
    )


def _trial_record(trial: TrialModel) -> TrialRecord:
    return TrialRecord(
        id=trial.id,
        experiment_id=trial.experiment_id,
        number=trial.number,
        state=TrialState(trial.state),
        params=dict(trial.params or {}),
        arm=trial.arm,
        budget=trial.budget,
        gpus=tuple(trial.gpus or ()),
        global_batch_size=trial.global_batch_size,
        reason=trial.reason,
        objective=trial.objective,
        samples_to_target=trial.samples_to_target,
        time_to_target_s=trial.time_to_target_s,
        best_mlm_accuracy=trial.best_mlm_accuracy,
        duration_s=trial.duration_s,
        metrics=dict(trial.metrics or {}),
        host=trial.host,
        pid=trial.pid,
        created_at=_utc(trial.created_at),
        started_at=_utc(trial.started_at),
        finished_at=_utc(trial.finished_at),
        worker=trial.worker,
        attempt=trial.attempt or 0,
        kind=TrialKind(trial.kind or TrialKind.TUNING.value),
        seed=trial.seed,
        late_noise_scale=trial.late_noise_scale,
        late_noise_undefined=trial.late_noise_undefined,
    )


def _metric_record(row: TrialMetricModel) -> MetricRecord:
    value = float("nan") if row.value is None else row.value
    return MetricRecord(row.trial_id, row.step, row.samples, row.name, value, _utc(row.created_at))


def _metric_rows(trial_id: int, points: Iterable[MetricPoint | tuple], now: datetime) -> list[dict[str, Any]]:
    """Long-format rows, one per named value of every point, stamped with the point's own time or `now`."""
    rows = []
    for point in points:
        step, samples, values, *measured = point
        at = measured[0] if measured and measured[0] is not None else now
        for name, value in values.items():
            rows.append(
                {
                    "trial_id": trial_id,
                    "step": int(step),
                    "samples": None if samples is None else int(samples),
                    "name": str(name),
                    "value": _no_nan(float(value)),
                    "created_at": at,
                }
            )
    return rows


# -- values ----------------------------------------------------------------------------------------------------


def _stamp_locked(session: Session, trial_id: int, clock: Callable[[], datetime]) -> datetime:
    """The time a trial's record closes, read once the trial's row is locked (PostgreSQL; SQLite's write lock is
    held from the transaction's start): a metric batch stamped under its share lock (`add_metrics`) is then never
    dated after the close it came before."""
    session.execute(select(TrialModel.id).where(TrialModel.id == trial_id).with_for_update())
    return clock()


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _utc(moment: datetime | None) -> datetime | None:
    """Timezone-aware UTC; SQLite hands back naive datetimes (it stores no offset), which are UTC here."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def _no_nan(value: float | None) -> float | None:
    """None for NaN: SQLite turns NaN into NULL anyway, and PostgreSQL would sort it above every number."""
    return None if value is None or value != value else value


# Every method of the interface waits out an unreachable database (see the module docstring); the trial clock and
# the helpers above are not database calls.
for _name in sorted(Storage.__abstractmethods__ - {"use_trial_clock"}):
    setattr(SqlStorage, _name, _retried(getattr(SqlStorage, _name)))
