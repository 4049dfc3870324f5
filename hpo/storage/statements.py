"""The SQL that `SqlStorage` composes: row lookups that raise the contract's errors, conditional updates,
prebuilt statements of the hottest reads, query builders, and the conversion of rows to records."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Collection, Iterable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    bindparam,
    cast,
    extract,
    func,
    select,
    union_all,
    update,
)
from sqlalchemy.orm import Session

from hpo.errors import NotFoundError, StaleAttemptError, StorageError, TrialStateError
from hpo.storage.base import (
    Direction,
    ExperimentRecord,
    ExperimentStatus,
    MetricPoint,
    MetricRecord,
    TrialRecord,
)
from hpo.storage.engine import (
    dumps_json,
)
from hpo.storage.models import ExperimentModel, TrialMetricModel, TrialModel
from hpo.storage.noise import NOISE_METRICS
from hpo.trials import TrialKind, TrialState

_STATES = {state.value: state for state in TrialState}  # a dict lookup; TrialState(value) costs 10x more
REQUEUE_REASON = "interrupted: the controller stopped while the trial ran; re-queued on resume"
DEFINITION_KEYS = ("experiment", "run_dir")  # what `annotate_experiment` never changes
_UNFINISHED = (TrialState.QUEUED.value, TrialState.RUNNING.value, TrialState.INTERRUPTED.value)


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
    return TrialStateError(f"cannot {action} trial {trial_id}: it is {row.state} ({why})")


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
        # Confirmation runs re-run a best config; they are not rivals. Written as an expression (kind is never null)
        # so that no index can serve it: PostgreSQL without statistics (right after a bulk load) would otherwise take
        # the index on (experiment, kind, state, ...), which matches more equalities, read every completed trial
        # and sort them (70 ms at 100,000 trials against 0.05); the objective index then checks kind per row.
        func.coalesce(TrialModel.kind, TrialKind.TUNING.value) == TrialKind.TUNING.value,
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
    it selects only the trial's id and budget (no row to build into an object)."""
    conditions = [TrialModel.experiment_id == bindparam("experiment_id")]
    if by_arm:
        conditions.append(TrialModel.arm == bindparam("arm"))
    if by_batch:
        conditions.append(TrialModel.global_batch_size == bindparam("global_batch_size"))
    query = _best_trial_query(direction, conditions)
    return query.with_only_columns(TrialModel.id, TrialModel.budget) if id_only else query


# The completed tuning trials of an experiment and arm with a given objective at a larger budget than a given
# one (bound parameters `experiment_id`, `arm`, `objective`, `budget`), the largest budget first: where a
# multi-fidelity tuner's best trial ran a short rung, its configuration's promotions with the same objective are
# among them (`TrialReads._further`).
_SAME_OBJECTIVE_FURTHER = (
    select(TrialModel)
    .where(
        TrialModel.experiment_id == bindparam("experiment_id"),
        TrialModel.state == TrialState.COMPLETED.value,
        TrialModel.objective == bindparam("objective"),
        TrialModel.arm.is_not_distinct_from(bindparam("arm")),
        TrialModel.budget > bindparam("budget"),
        func.coalesce(TrialModel.kind, TrialKind.TUNING.value) == TrialKind.TUNING.value,
    )
    .order_by(TrialModel.budget.desc(), TrialModel.number)
)


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


def _experiment_record(experiment: ExperimentModel, read_at: datetime | None = None) -> ExperimentRecord:
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
        read_at=read_at,
    )


def _trial_record(trial: TrialModel) -> TrialRecord:
    """The record of one trial, an ORM object or a row with TrialModel's column names."""
    return _trial_records([tuple(getattr(trial, column.key) for column in TRIAL_RECORD_COLUMNS)])[0]


_KINDS = {kind.value: kind for kind in TrialKind}
# The columns `_trial_records` reads, in the order it unpacks them (a select of these, not of the whole table: a
# column a migration adds does not move them)
TRIAL_RECORD_COLUMNS = (
    TrialModel.id, TrialModel.experiment_id, TrialModel.number, TrialModel.state, TrialModel.params, TrialModel.arm,
    TrialModel.budget, TrialModel.gpus, TrialModel.global_batch_size, TrialModel.reason, TrialModel.objective,
    TrialModel.samples_to_target, TrialModel.time_to_target_s, TrialModel.best_mlm_accuracy, TrialModel.duration_s,
    TrialModel.metrics, TrialModel.host, TrialModel.pid, TrialModel.created_at, TrialModel.started_at,
    TrialModel.finished_at, TrialModel.worker, TrialModel.attempt, TrialModel.kind, TrialModel.seed,
    TrialModel.late_noise_scale, TrialModel.late_noise_undefined, TrialModel.told_before, TrialModel.told_order,
)  # fmt: skip


def _trial_records(rows: Iterable[tuple]) -> list[TrialRecord]:
    """The records of rows of TRIAL_RECORD_COLUMNS, unpacked by position with a dict lookup per enum: a report lists
    100,000 trials, and reading each row's columns by name cost it more than fetching them."""
    states, kinds, tuning = _STATES, _KINDS, TrialKind.TUNING
    return [
        TrialRecord(id, experiment_id, number, states[state], dict(params or {}), arm, budget, tuple(gpus or ()),
                    global_batch_size, reason, objective, samples_to_target, time_to_target_s, best_mlm_accuracy,
                    duration_s, dict(metrics or {}), host, pid, _utc(created_at), _utc(started_at), _utc(finished_at),
                    worker, attempt or 0, kinds[kind] if kind else tuning, seed, late_noise_scale, late_noise_undefined,
                    told_before, told_order)
        for (id, experiment_id, number, state, params, arm, budget, gpus, global_batch_size, reason, objective,
             samples_to_target, time_to_target_s, best_mlm_accuracy, duration_s, metrics, host, pid, created_at,
             started_at, finished_at, worker, attempt, kind, seed, late_noise_scale, late_noise_undefined,
             told_before, told_order) in rows
    ]  # fmt: skip


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
