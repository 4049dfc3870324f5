"""The storage interface: what every backend promises, and the records it hands out.

Records are small frozen dataclasses (metric records: named tuples), never ORM objects, so callers (controller, CLI,
server) cannot touch the database behind the storage's back and never see a detached-instance error.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from hpo.errors import StorageError
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState


class Direction(str, Enum):
    """Whether the best trial has the lowest or the highest `objective`."""

    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


class ExperimentStatus(str, Enum):
    RUNNING = "running"  # created, or resumed; a controller is (or should be) driving it
    FINISHED = "finished"  # the budget is spent
    STOPPED = "stopped"  # a user asked it to stop
    FAILED = "failed"  # the controller itself gave up


@dataclass(frozen=True)
class ExperimentRecord:
    id: int
    name: str
    direction: Direction
    status: ExperimentStatus
    spec: dict[str, Any]  # the validated experiment file, as a JSON-able dict
    stop_requested: bool
    created_at: datetime  # timezone-aware, UTC
    ended_at: datetime | None  # when the status last left RUNNING
    controller_host: str | None = None  # the controller driving it (None when none holds it)
    controller_pid: int | None = None
    heartbeat_at: datetime | None = None  # the controller's last heartbeat
    controller_note: str | None = None  # what the controller last said: progress and why trials wait
    trials_version: int = 0  # see Storage.trials_version
    # The clock heartbeats are judged by (a database server's) when this was read; not part of what was read
    read_at: datetime | None = field(default=None, compare=False)

    @property
    def nni_webui(self) -> list[dict[str, Any]]:
        """Where the NNI web UI of each of its NNI experiments was last served (engine: nni, stored by the engine
        with `annotate_experiment`): [{"arm": label or None, "nni_experiment": NNI id, "url": address}]."""
        return [dict(link) for link in self.spec.get(NNI_WEBUI_KEY) or []]


NNI_WEBUI_KEY = "nni_webui"  # the spec key of `ExperimentRecord.nni_webui`


@dataclass(frozen=True)
class TrialRecord:
    id: int  # unique across experiments
    experiment_id: int
    number: int  # 0, 1, 2, ... within the experiment
    state: TrialState
    params: dict[str, Any]
    arm: str | None
    budget: float
    gpus: tuple[int, ...]  # the allocation it ran on (or was planned for while queued)
    global_batch_size: int | None
    reason: str | None
    objective: float | None
    samples_to_target: int | None
    time_to_target_s: float | None
    best_mlm_accuracy: float | None
    duration_s: float | None
    metrics: dict[str, Any]  # the trainer's final record
    host: str | None
    pid: int | None  # the process group of the trial on `host`
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None = None  # where the runner ran it (a Dask worker address, a CPU/GPU slot)
    attempt: int = 0  # how many times it was re-queued (a lost worker, a dead controller)
    kind: TrialKind = TrialKind.TUNING
    seed: int | None = None  # the training seed when it differs from the config's
    # Its late-training noise scale (hpo/storage/noise.py), kept when it finished; the share of its late steps
    # without an estimate is None while it is unfinished, and for a trial finished before the storage kept it
    late_noise_scale: float | None = None
    late_noise_undefined: float | None = None
    # The number of the first trial created after the controller told this one's result to its tuner; None when it
    # was told after the newest trial, or not (yet) told (`Storage.create_trial`'s `told`); and its place among the
    # tells before that trial (None for an experiment stored before it was kept: the trials' finishing order)
    told_before: int | None = None
    told_order: int | None = None

    @property
    def spec(self) -> TrialSpec:
        """What was asked to run, in the shared vocabulary."""
        return TrialSpec(self.number, self.params, self.arm, self.budget, self.gpus, self.global_batch_size,
                         self.kind, self.seed)  # fmt: skip

    @property
    def result(self) -> TrialResult | None:
        """How it ended, or None while it is queued or running."""
        if not self.state.finished:
            return None
        return TrialResult(
            self.state,
            self.reason,
            self.objective,
            self.samples_to_target,
            self.time_to_target_s,
            self.best_mlm_accuracy,
            self.duration_s,
            self.metrics,
        )


class TrialVersion(NamedTuple):
    """What says whether a trial changed: a trial with the same state and attempt is the same record once
    finished (a finished trial is written once; a re-queue raises the attempt). The API keeps the responses of
    finished trials by it."""

    id: int
    number: int
    state: TrialState
    attempt: int


class TrialTally(NamedTuple):
    """How many of an experiment's trials have one kind, state and arm, and how many of those reached the target
    (have samples to target). An experiment has a few of these whatever its number of trials."""

    kind: TrialKind
    state: TrialState
    arm: str | None
    trials: int
    reached: int


class TrialSpan(NamedTuple):
    """The trials that started and ended (a start and a finish time): how many, their time from start to finish
    added up (exact to the microsecond), the first creation time among them and the last finish time."""

    ended: int
    busy_s: float
    first_created: datetime | None
    last_finished: datetime | None


class MetricPoint(NamedTuple):
    """One intermediate report of a trial: several named values measured at the same step.

    A plain tuple `(step, samples, {"loss": 2.1, "mlm_accuracy": 0.41})` is accepted wherever a MetricPoint is.
    """

    step: int
    samples: int | None
    values: Mapping[str, float]
    at: datetime | None = None  # when it was measured (a simulated trial's records); None: when it is stored


class MetricRecord(NamedTuple):
    """One stored value: a point with three values is stored, and read back, as three records. A named tuple, not a
    dataclass: a 10,000-trial report reads 240,000 of them, and a tuple is built five times faster."""

    trial_id: int
    step: int
    samples: int | None
    name: str
    value: float  # NaN is stored as NULL and read back as NaN (SQLite cannot store NaN)
    created_at: datetime | None  # None only from get_experiment_metrics(..., times=False)


def curve_point(record: MetricRecord) -> tuple[int, int]:
    """The point of a trial's curve a record belongs to: its step and sample count (a simulated trial stored before
    its points had steps has them all at step 0, told apart by their samples; -1 for no sample count)."""
    return record.step, -1 if record.samples is None else record.samples


class Storage(abc.ABC):
    """Where experiments, their trials and the trials' learning curves live. The contract every backend keeps:

    - Every method that writes is one transaction: it happens completely or not at all. Every method is safe
      to call from several processes and threads against one database at the same time.
    - Missing experiments or trials raise `NotFoundError` naming the id or name, from every method that takes
      one (so `list_trials` of a missing experiment raises, it does not return []).
    - Everything the database refuses (duplicate names or trial numbers, lost connections, a schema older than
      the code) raises a `StorageError` subclass whose message says what to do; database-library exceptions
      never escape. Invalid argument values (an unknown direction, a negative limit) raise ValueError.
    - Trial states only move forward: QUEUED -> RUNNING -> a finished state (COMPLETED, DIVERGED, FAILED,
      TIMEOUT). A finished trial is never changed again: finishing it twice raises StorageError, so a resumed
      controller cannot overwrite a result by accident. The only ways back are `requeue_interrupted` (trials
      a dead controller left RUNNING) and `requeue_trial` (a trial whose worker was lost); both add one to the
      trial's `attempt`.
    - Attempts fence stale writers: the methods that take `attempt=` (start, finish, add metrics) refuse with
      StaleAttemptError when the trial has moved on to another attempt, so a process left over from a lost
      worker can never overwrite the result or the curve of the run that replaced it.
    - A closed record is never written again: `add_metrics` on a finished or INTERRUPTED trial raises
      TrialClosedError and stores nothing (checked in the same transaction as the insert), so a process that
      outlives its attempt cannot add to its curve after `finished_at`.
    - `interrupt_trial` (a controller stopped while the trial ran) moves a QUEUED or RUNNING trial to
      INTERRUPTED with its reason and `finished_at` (the moment its attempt ended); a resume re-queues it.
    - Every change of a trial record (created, started, finished, interrupted, re-queued) adds one to its
      experiment's `trials_version` in the same transaction, so an unchanged version means unchanged trial
      records (metric rows are not part of a record).
    - Trial numbers are assigned atomically when a TrialSpec has `number=None`: concurrent creators (several
      controllers, NNI trial processes) never collide.
    - One live controller per experiment: `claim_controller` succeeds for a free experiment, for one whose
      holder stopped heartbeating, or for the holder itself; `heartbeat` keeps the claim.
    - `objective` is stored as reported. The best trial is the COMPLETED trial with the lowest objective in a
      "minimize" experiment, the highest in a "maximize" one; ties go to the lowest trial number, except that a
      short rung of a multi-fidelity tuner yields to its configuration's trial at the largest budget with the same
      objective (a promotion continues the run of its lower rung, and ties it where it did not improve). Trials
      without an objective, trials that diverged, failed or timed out, and confirmation trials (re-runs of a
      best configuration with other seeds) are never the best.
    - `finish_trial` keeps the trial's late-training noise scale (`hpo.storage.noise.late_noise` of its stored
      records) on the record, in the same transaction: the records of a finished trial never change.
    - NaN is not a value a database can store everywhere: NaN objectives and accuracies are stored as None,
      NaN/inf inside JSON (params, metrics, spec) as null.
    - Timestamps are timezone-aware UTC. Records are frozen snapshots, not live views.
    - A database that is away for now (its server down or restarting, the connection lost, an SQLite file locked)
      raises DatabaseUnavailableError, a StorageError. After `wait_for_outages(s)` a method that meets one runs
      again, whole, until the database has been away for s seconds (hpo/storage/retry.py), and only then raises.
    - Writing twice leaves one, so a write retried after its first commit landed (the connection broke before
      the answer) does no harm: a metric value is identified by (trial, name, step, samples) and one already
      stored is not stored again (a value without samples is not identified); finishing or interrupting a trial
      again with the very outcome it has changes nothing; heartbeats, claims and status changes are plain updates.
      A retried `create_experiment`, `create_trial`, `mark_trial_running`, `requeue_trial` or
      `delete_experiment` finds the work of its first try and returns as if it had done it.
    """

    # -- experiments ---------------------------------------------------------------------------------------

    @abc.abstractmethod
    def create_experiment(
        self, name: str, spec: Mapping[str, Any], direction: Direction | str, controller: tuple[str, int] | None = None
    ) -> int:
        """Record a new RUNNING experiment and return its id; a name already taken raises StorageError.
        `controller` (host, pid): the process that drives it, claimed with a heartbeat now, in the same write, so
        that no reader sees the experiment without its controller (as if it had died)."""

    @abc.abstractmethod
    def get_experiment(self, experiment_id: int) -> ExperimentRecord:
        """The experiment with this id."""

    @abc.abstractmethod
    def get_experiment_by_name(self, name: str) -> ExperimentRecord:
        """The experiment with this name."""

    @abc.abstractmethod
    def list_experiments(self, status: ExperimentStatus | str | None = None) -> list[ExperimentRecord]:
        """All experiments (or those with this status), oldest first."""

    @abc.abstractmethod
    def set_experiment_status(self, experiment_id: int, status: ExperimentStatus | str) -> None:
        """Change the experiment's status. Setting RUNNING again (a resume) clears a pending stop request."""

    @abc.abstractmethod
    def annotate_experiment(self, experiment_id: int, key: str, value: Any) -> None:
        """Store `value` (JSON-able) under `key` of the experiment's `spec`: what its engine learns while it runs
        (`nni_webui`: the addresses of the NNI web UI). The definition (`experiment`, `run_dir`) stays as
        created: those keys raise ValueError."""

    @abc.abstractmethod
    def delete_experiment(self, experiment_id: int) -> None:
        """Remove an experiment that has no trials (an engine that could not start leaves nothing that blocks
        the next `hpo run` of its file). One with trials raises StorageError and stays: its trials are data."""

    @abc.abstractmethod
    def purge_experiment(self, experiment_id: int, host: str, pid: int, stale_after_s: float) -> tuple[int, int] | None:
        """Remove the experiment with its trials and their metrics, in one transaction (`hpo delete`, run as (host,
        pid)); returns how many trials and metric values went, or None where a retry finds that its first try's
        removal landed. It claims the experiment first, as `claim_controller`: a controller whose heartbeat is
        younger than `stale_after_s` keeps it (ControllerBusyError naming its host and pid, nothing removed). Its
        id is never given to another experiment."""

    @abc.abstractmethod
    def claim_controller(self, experiment_id: int, host: str, pid: int, stale_after_s: float) -> None:
        """Become the experiment's controller (and heartbeat now); raises ControllerBusyError naming the host
        and pid of a holder whose last heartbeat is younger than `stale_after_s`."""

    @abc.abstractmethod
    def heartbeat(self, experiment_id: int, host: str, pid: int, note: str | None = None) -> bool:
        """Record that this controller is alive (with what it sees); False when another controller holds it."""

    @abc.abstractmethod
    def release_controller(self, experiment_id: int, host: str, pid: int) -> None:
        """Give the experiment up (the controller ends normally); no-op when another one holds it."""

    @abc.abstractmethod
    def request_stop(self, experiment_id: int) -> None:
        """Ask the experiment's controller to stop (the server's "stop" action); the controller polls it."""

    @abc.abstractmethod
    def is_stop_requested(self, experiment_id: int) -> bool:
        """Whether `request_stop` was called since the experiment last became RUNNING."""

    @abc.abstractmethod
    def replaced_file(self) -> Path | None:
        """The database's file where it was deleted or replaced since the storage opened it (one stat), else None
        (and always for a database server)."""

    def check_file(self) -> None:
        """StorageError where the database's file was deleted or replaced since the storage opened it: a controller
        would go on writing into the deleted file, which nobody reads."""
        if (path := self.replaced_file()) is not None:
            raise StorageError(
                f"the SQLite database {path} was deleted or replaced while this command used it: what it wrote since "
                "went into the deleted file. Put the file back where it was (from a backup) and `hpo resume` the "
                "experiment, or run it again afresh"
            )

    # -- trials --------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def create_trial(
        self,
        experiment_id: int,
        spec: TrialSpec,
        *,
        told: Sequence[int] = (),
        worker: str | None = None,
        controller: tuple[str, int] | None = None,
    ) -> int:
        """Record a QUEUED trial and return its id. `spec.number=None` takes the next number atomically; a
        number already used in the experiment raises StorageError. `controller`: the (host, pid) of the controller
        that creates it, which must hold the experiment's claim (else ClaimLostError, nothing written: a controller
        paused while another took over would add trials nobody drives). `worker`: who will run it, recorded with the
        row (an NNI trial creates its own row: a process killed before it starts the trial leaves a row its
        engine finds by the worker). `told`: the experiment's trials whose results
        the controller told its tuners since it created the previous trial, in that order; the same write stamps
        them with this trial's number and their place in `told` (`TrialRecord.told_before`, `told_order`), which is
        how a resume replays asks and tells in their order."""

    @abc.abstractmethod
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
        """Move a QUEUED trial to RUNNING on these GPUs (None keeps the planned ones); any other state raises.
        With `attempt`, only that attempt may start (StaleAttemptError otherwise)."""

    @abc.abstractmethod
    def finish_trial(self, trial_id: int, result: TrialResult, *, attempt: int | None = None) -> None:
        """Record how a queued or running trial ended; `result.state` must be a finished state.

        Finishing an already finished trial raises StorageError and changes nothing, unless it ended with this
        very result (state, reason, objective, samples to target, duration): then the call is a repeat and does
        nothing. With `attempt`, a trial that has moved on to another attempt raises StaleAttemptError.
        """

    @abc.abstractmethod
    def interrupt_trial(self, trial_id: int, reason: str, *, attempt: int | None = None) -> None:
        """Record that a QUEUED or RUNNING trial's attempt was ended by a stop of its controller (INTERRUPTED, with
        `reason` and `finished_at`); a finished trial raises StorageError and is not changed, and with `attempt`,
        a trial that has moved on to another attempt raises StaleAttemptError."""

    @abc.abstractmethod
    def requeue_trial(self, trial_id: int, attempt: int, reason: str) -> TrialRecord:
        """Put a QUEUED, RUNNING or INTERRUPTED trial at `attempt` back to QUEUED as attempt + 1 (its worker was
        lost): pid, host, worker, start and finish times cleared, the attempt's metric rows deleted, `reason`
        recorded."""

    @abc.abstractmethod
    def get_trial(self, trial_id: int) -> TrialRecord:
        """The trial with this id."""

    @abc.abstractmethod
    def get_trial_by_number(self, experiment_id: int, number: int) -> TrialRecord:
        """The trial with this number in the experiment."""

    @abc.abstractmethod
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
        """The experiment's trials, filtered by state(s) and arm, one page of them: in number order, or with
        `order_by="objective"` best objective first (ties by number), trials without an objective last.

        `after` pages by key: only trials numbered above it, in number order (`offset` then skips within those).
        A page costs the same however deep it is and however few trials match the filters, and trials created
        between pages are neither skipped nor repeated (numbers only grow). `after` with `order_by="objective"`
        raises ValueError, as do negatives."""

    @abc.abstractmethod
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
        """The page `list_trials` with the same arguments returns, as each trial's id, number, state and attempt (no
        parameters, results or times to decode: the API's trial list reads these first and the rest only for the
        trials it has not kept)."""

    @abc.abstractmethod
    def get_trials(self, trial_ids: Collection[int]) -> list[TrialRecord]:
        """The trials with these ids, in that order (NotFoundError naming a missing id)."""

    @abc.abstractmethod
    def count_trials(
        self, experiment_id: int, *, state: TrialState | Collection[TrialState] | None = None, arm: str | None = None
    ) -> int:
        """How many trials `list_trials` with the same filters returns without paging."""

    @abc.abstractmethod
    def count_trials_by_state(self, experiment_id: int) -> dict[TrialState, int]:
        """Trial counts for every state (zeros included)."""

    @abc.abstractmethod
    def tally_trials(self, experiment_id: int) -> list[TrialTally]:
        """The experiment's trials counted by kind, state and arm, with how many reached the target (one
        aggregate: progress lines, status and the verdict read counts without listing trials)."""

    @abc.abstractmethod
    def list_confirmations(self, experiment_id: int) -> list[TrialRecord]:
        """The experiment's confirmation trials in number order (the verdict's evidence), without reading its
        tuning trials."""

    @abc.abstractmethod
    def trial_span(self, experiment_id: int) -> TrialSpan:
        """The span of the experiment's trials that started and ended (one aggregate: what a simulated experiment
        cost, hpo.simulation.cost)."""

    @abc.abstractmethod
    def trials_version(self, experiment_id: int) -> int:
        """How many times one of the experiment's trial records changed (see the class docstring); it only grows.
        One primary-key read: a reader that keeps an answer with the version it read *before* computing it knows
        from this read alone whether the answer still holds (the API's best configs and counts)."""

    @abc.abstractmethod
    def requeue_interrupted(self, experiment_id: int) -> list[TrialRecord]:
        """Put trials a dead controller left RUNNING (or INTERRUPTED) back to QUEUED, and return them.

        For a resume: their reason says "interrupted"; pid, host, start and finish times are cleared (the GPUs stay
        until the next `mark_trial_running`); the metric rows of the interrupted attempt are deleted because the re-run
        reports its curve again. Finished trials are untouched.
        """

    # -- metrics -------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def add_metrics(self, trial_id: int, points: Iterable[MetricPoint | tuple], *, attempt: int | None = None) -> int:
        """Append a batch of intermediate reports in one transaction; returns how many values the batch holds (a
        value already stored, same trial, name, step and samples, is kept as it is and not stored again).
        A finished or INTERRUPTED trial raises TrialClosedError; with `attempt`, a trial that has moved on to
        another attempt raises StaleAttemptError. Either way nothing is stored."""

    @abc.abstractmethod
    def get_metrics(self, trial_id: int, name: str | None = None) -> list[MetricRecord]:
        """The trial's stored values (or only those called `name`), ordered by step, then name."""

    @abc.abstractmethod
    def get_experiment_metrics(
        self, experiment_id: int, names: Collection[str], *, times: bool = True
    ) -> dict[int, list[MetricRecord]]:
        """The stored values called one of `names` of all the experiment's trials in one read: trial id -> its
        values in `get_metrics` order (by step, then name); a trial without such a value is absent. For readers
        of every trial (the report): a read per trial costs a round trip each. `times=False` leaves `created_at`
        None: decoding 240,000 timestamps is half the read of a 10,000-trial report's noise scale."""

    # -- best trials ---------------------------------------------------------------------------------------

    @abc.abstractmethod
    def best_trial(
        self, experiment_id: int, *, arm: str | None = None, global_batch_size: int | None = None
    ) -> TrialRecord | None:
        """The best COMPLETED trial (see the class docstring), optionally within one arm / batch size."""

    @abc.abstractmethod
    def best_trial_id(
        self, experiment_id: int, *, arm: str | None = None, global_batch_size: int | None = None
    ) -> int | None:
        """The id of `best_trial`'s trial, or None: one small query, for callers that keep trials by id (the API
        answers every best-config request from it)."""

    @abc.abstractmethod
    def best_per_arm(self, experiment_id: int) -> dict[str, TrialRecord]:
        """The best trial of every arm that has one, keyed by arm."""

    # -- lifecycle -----------------------------------------------------------------------------------------

    @abc.abstractmethod
    def use_trial_clock(self, clock: Callable[[], datetime]) -> None:
        """Stamp trial events (created, started, finished, metrics) with `clock()` (timezone-aware UTC) instead of
        the wall clock: a simulated experiment's trials carry simulated times. Experiment and controller times
        (heartbeats) stay on the wall clock."""

    def wait_for_outages(self, outage_s: float, stop: Callable[[], str | None] | None = None) -> None:  # noqa: B027
        """From now on wait up to `outage_s` seconds for a database that is away before a method raises
        DatabaseUnavailableError (0, the default: raise at once); `stop()` returning a reason gives up earlier (a
        controller asked to stop). Backends that are never away need not override it."""

    def unreachable_for(self) -> float | None:
        """For how many seconds the database has been unreachable, or None when it answered every kind of call last
        (a read's answer does not end an outage of writes: hpo.storage.retry.Outage): what a progress line says while
        the controller waits."""
        return None

    def outage_state(self) -> str:
        """While `unreachable_for()` counts: what holds the database up, in a few words for the progress line
        ("database <state> for 42 s"), as the latest failure said it: unreachable, locked by another writer, out
        of disk space, short of a resource, closed to connections."""
        return "unreachable"

    def close(self) -> None:  # noqa: B027 - optional hook, backends without resources need not override it
        """Release connections; the storage must not be used afterwards."""

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
