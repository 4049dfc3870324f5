"""The reading half of `SqlStorage`: trials, pages of trials, counts, aggregates, metrics and best trials. A mixin
of `hpo.storage.sql.SqlStorage`, which owns the engine, the sessions and the retry these methods run in."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from sqlalchemy import (
    Select,
    func,
    literal,
    select,
)
from sqlalchemy.orm import Session

from hpo.errors import NotFoundError
from hpo.storage.base import (
    Direction,
    MetricRecord,
    TrialRecord,
    TrialSpan,
    TrialTally,
    TrialVersion,
)
from hpo.storage.models import TrialMetricModel, TrialModel
from hpo.storage.statements import (
    _SAME_OBJECTIVE_FURTHER,
    _STATES,
    _VERSION,
    TRIAL_RECORD_COLUMNS,
    _arms,
    _best_trial_query,
    _best_trial_statement,
    _direction,
    _experiment_not_found,
    _merged_page,
    _metric_record,
    _microseconds,
    _require_experiment,
    _require_trial,
    _state_values,
    _trial,
    _trial_filters,
    _trial_record,
    _trial_records,
    _utc,
    _versions_statement,
)
from hpo.trials import TrialKind, TrialState


class TrialReads:
    """Reads of trials and their metrics (the `Storage` contract's, documented there)."""

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
        # Rows, not ORM objects, unpacked by position (a 100,000-trial report lists every trial)
        return self._paged(
            select(*TRIAL_RECORD_COLUMNS), _trial_records, experiment_id, state, arm, offset, limit, order_by, after
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
        query = select(*TRIAL_RECORD_COLUMNS).where(TrialModel.experiment_id == experiment_id,
                                                    TrialModel.kind == TrialKind.CONFIRMATION.value)  # fmt: skip
        with self._session() as session:
            # sorted here: ORDER BY number would have SQLite walk every trial in number order instead of the
            # kind index
            trials = sorted(_trial_records(session.execute(query)), key=lambda t: t.number)
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
            return None if best is None else _trial_record(self._further(session, best))

    def best_trial_id(
        self, experiment_id: int, *, arm: str | None = None, global_batch_size: int | None = None
    ) -> int | None:
        with self._session() as session:
            best = session.execute(*self._best(session, experiment_id, arm, global_batch_size, id_only=True)).first()
            if best is None or best.budget >= 1:  # a full-budget trial: the answer without reading its row
                return None if best is None else best.id
            return self._further(session, session.get(TrialModel, best.id)).id

    @staticmethod
    def _further(session: Session, best: TrialModel) -> TrialModel:
        """`best`, or where it ran a short rung of a multi-fidelity tuner, its configuration's trial at the largest
        budget with the same objective: a promotion continues the run of its lower rung, and one that did not
        improve on it ties; the tie goes to the run that trained the most of the budget, not to the short one."""
        if best.budget >= 1:
            return best
        further = session.scalars(
            _SAME_OBJECTIVE_FURTHER,
            {"experiment_id": best.experiment_id, "arm": best.arm, "objective": best.objective, "budget": best.budget},
        )
        return next((t for t in further if t.params == best.params), best)

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
            return {trial.arm: _trial_record(self._further(session, trial)) for trial in trials.all()}
