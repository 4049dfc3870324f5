"""The simulated runner: a cluster of `budget.max_parallel` slots whose trials read their curves from a table.

No process runs. A submitted attempt is claimed (host `simulated`, worker `sim-slot-K`), its trainer config is
built exactly as the trial entry builds it (`hpo.trial.entry.trial_trainer_config`), and the surrogate
(`hpo.simulation.surrogate`) gives the curve of that configuration and training seed. The attempt's evaluations
are those the trainer would make (every `eval.every_samples`, stopping at the target unless
`eval.stop_at_target` is off, or where the run diverges); its records (each evaluation's accuracy, the loss and
noise scale, then the final result through `hpo.objective.trial_result`) are written to the database as the
trial would write them, stamped at simulated times.

Time: a slot trains `simulation.gpu_samples_per_s x resources.gpus_per_trial` BERT-large samples per second, and
one table sample stands for `simulation.sample_scale` BERT-large samples (at a batch size of
`simulation.batch_sample_scale`, its own), so an attempt that trains n new table samples takes n x scale /
throughput simulated seconds. Under smac_hyperband and asha a configuration continues
from its checkpoint (the real trials do too): a higher budget trains, and is charged, only the samples beyond what
the same configuration and seed already trained. `poll` moves the simulated clock to the next end of an
attempt, so an experiment of thousands of trials runs in seconds.

Time limits hold in simulated time as they hold in real time: the trainer's `budget.max_time_s` stops a run at the
first step at or past it (counted over the runs a checkpoint continues, as the trainer counts it), evaluated there
and recorded as out of budget; an attempt that would outlast `budget.trial_timeout_s` ends at that moment without
a result, its evaluations until then recorded, and the study records it as it records a real trial it killed
(timed out, scored by the best accuracy it reported). A configuration continues only from a run that finished.

Before anything is written, `check_table_covers` checks every trial the experiment can propose against the table:
its grid points, learning rates and sample budget (against the budget of the trial's batch size, for a table with
one per batch size, where an experiment sets budget.max_samples and eval.every_samples per batch size in its
space), and the runs it reads, so a partial table is refused with the runs it still lacks.
"""

from __future__ import annotations

import heapq
import itertools
import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from hpo.errors import DatabaseUnavailableError, HpoError
from hpo.experiment.arms import arm_plans, continues_from_checkpoint, params_key, trial_config
from hpo.objective import missed_objective, trial_result
from hpo.runners.base import Runner, TrialExit, TrialLaunch, classify_exit
from hpo.simulation.clock import SimulatedClock
from hpo.simulation.surrogate import Config, Curve, Surrogate
from hpo.simulation.table import DIMENSIONS, RUN_LENGTH, load_table, point_label
from hpo.storage.base import MetricPoint, Storage
from hpo.trial.entry import trial_trainer_config
from hpo.trials import TrialResult, TrialState
from search_spaces.space import CategoricalParam, trainer_key
from trainer.config import config_from_dict, get_dotted
from trainer.result import TrainResult, TrainStatus

HOST = "simulated"  # the host recorded on every simulated attempt


@dataclass(frozen=True)
class _Attempt:
    """An attempt in flight: what it will record when the clock reaches its end."""

    trial_id: int
    attempt: int
    slot: int
    started: datetime  # simulated
    duration_s: float
    points: tuple[tuple[float, MetricPoint], ...]  # (seconds after start, point) to record
    result: TrialResult | None  # None: killed at budget.trial_timeout_s (the study records it)
    returncode: int


SECONDS_A_YEAR = 365.25 * 24 * 3600
MAX_TRIAL_YEARS = 10  # one simulated trial at most: a real one lasts hours to days


class SimulatedRunner(Runner):
    def __init__(self, spec, slots: int):
        """Reads and checks the table now: a table that cannot serve the experiment's space raises HpoError
        before anything is written."""
        simulation = spec.runner.simulation
        self.spec = spec
        try:
            self.table = load_table(simulation.table)
        except HpoError as e:  # the file and the field that named the table, before what is wrong with it
            raise HpoError(f"{spec.source}: runner.simulation.table: {e}") from None
        handicaps = {name: (h.curves_of, h.delay_samples) for name, h in simulation.handicaps.items()}
        self.surrogate = Surrogate(self.table, handicaps)
        self.clock = SimulatedClock()
        self.slots = slots
        self.slot_samples_per_s = simulation.gpu_samples_per_s * spec.resources.gpus_per_trial
        self.sample_scale = simulation.sample_scale
        self.batch_scale = dict(simulation.batch_sample_scale)  # batch size -> its own scale (hpo plan's)
        self.continues = continues_from_checkpoint(spec)  # as the trial entry: checkpoints under Hyperband, ASHA
        self.storage: Storage | None = None
        self.trained: dict[tuple[str, int], int] = {}  # (configuration, seed) -> samples its checkpoint holds
        self.free = list(range(slots))
        self.running: list[tuple[Any, int, _Attempt]] = []  # a heap by end time
        self._order = itertools.count()
        check_table_covers(spec, self.table)
        self._check_trial_length()

    def _check_trial_length(self) -> None:
        """Refuse a throughput or scale that makes one full-budget trial last past MAX_TRIAL_YEARS of simulated time
        (a typo in samples_per_s or sample_scale): the simulated clock would run past its calendar mid-experiment."""
        budgets = {b: self.table.max_samples_for(b) for b in self.table.batch_sizes()} or {0: self.table.max_samples}
        years = max(self._seconds(n, b) for b, n in budgets.items()) / SECONDS_A_YEAR
        if years > MAX_TRIAL_YEARS:
            sim = self.spec.runner.simulation
            raise HpoError(f"{self.spec.source}: runner.simulation: at {self.slot_samples_per_s:.4g} samples/s a slot "
                           f"(samples_per_s x resources.gpus_per_trial) and 1 table sample = {sim.sample_scale:.4g} "
                           f"samples (sample_scale), one trial of the table's {max(budgets.values()):,} samples would "
                           "take "
                           f"{years:.3g} simulated years, more than {MAX_TRIAL_YEARS}; check samples_per_s and "
                           "sample_scale")  # fmt: skip

    def describe(self) -> str:
        sim = self.spec.runner.simulation
        return (f"simulated runner, {self.slots} slot(s) of {self.spec.resources.gpus_per_trial} {sim.gpu.upper()} "
                f"GPU(s) ({self.slot_samples_per_s:,.0f} samples/s a slot, 1 table sample = {sim.sample_scale:g} "
                f"samples), curves from {self.table.path}{self._repeats_note()}")  # fmt: skip

    def _repeats_note(self) -> str:
        """Where an arm's confirmation runs outnumber the table's recorded seeds, they repeat curves: said at the
        start, as the verdict counts each as a run of its own."""
        seeds, runs = len(self.table.seeds()), self.spec.budget.most_confirm_seeds if self.spec.compare else 0
        if not seeds or runs < seeds:
            return ""
        return (f"; note: the table records {seeds} training seed(s) (seeds s and s + {seeds} read one), so an arm's "
                f"confirmation runs from the {_ordinal(seeds)} on read curves that its tuning run or earlier runs "
                f"read; the verdict counts each as a run, so its intervals are narrower than {runs} real runs an arm "
                "would give")  # fmt: skip

    def attach(self, storage: Storage, experiment_id: int) -> None:
        """Stamp the experiment's trial records with the simulated clock, starting after its last recorded event
        (a resumed experiment goes on from where it stopped); rebuild which samples each checkpoint holds."""
        self.storage = storage
        records = storage.list_trials(experiment_id)
        moments = [m for r in records for m in (r.created_at, r.started_at, r.finished_at) if m is not None]
        self.clock.start_after(max(moments, default=None))
        storage.use_trial_clock(self.clock.now)
        for record in records:
            samples = (record.metrics or {}).get("samples")
            if self.continues and record.state in (TrialState.COMPLETED, TrialState.DIVERGED) and samples:
                key = (params_key(record.params), trial_trainer_config(self.spec, record, Path("."), None).seed)
                self.trained[key] = max(self.trained.get(key, 0), int(samples))

    def free_slots(self) -> int:
        return len(self.free)

    def why_waiting(self) -> str:
        return "" if self.free else f"all {self.slots} simulated slot(s) busy"

    def wait(self, timeout_s: float) -> None:
        """Nothing to wait for: `poll` moves the clock to the next end."""

    def submit(self, launch: TrialLaunch) -> None:
        if self.storage is None:
            raise RuntimeError("attach() the simulated runner to the experiment's storage before submitting")
        if not self.free:
            raise RuntimeError("submit() without a free slot")
        slot = self.free.pop(0)
        storage = self.storage
        storage.mark_trial_running(launch.trial_id, pid=None, host=HOST, worker=f"sim-slot-{slot}",
                                   attempt=launch.attempt)  # fmt: skip
        attempt = self._simulate(launch, slot, storage.get_trial(launch.trial_id))
        heapq.heappush(self.running, (self.clock.after(attempt.duration_s), next(self._order), attempt))

    def poll(self) -> list[TrialExit]:
        """The attempts that end next (moving the simulated clock to their end), recorded."""
        if not self.running:
            return []
        end = self.running[0][0]
        self.clock.advance_to(end)
        ended = []
        while self.running and self.running[0][0] == end:
            ended.append(heapq.heappop(self.running)[2])
        return [self._record(attempt) for attempt in ended]

    def cancel_all(self) -> list[TrialExit]:
        """The attempts in flight end now, without a result (the study records them as interrupted)."""
        now = self.clock.now()
        exits = [TrialExit(a.trial_id, a.attempt, -signal.SIGTERM, worker=f"sim-slot-{a.slot}",
                           duration_s=(now - a.started).total_seconds()) for _, _, a in self.running]  # fmt: skip
        self.free.extend(a.slot for _, _, a in self.running)
        self.running.clear()
        return exits

    # -- one attempt -------------------------------------------------------------------------------------

    def _simulate(self, launch: TrialLaunch, slot: int, record) -> _Attempt:
        """What the attempt trains, records and costs."""
        started = self.clock.now()
        try:  # as the trial entry builds it (no checkpoint is written: `trained` keeps what one would hold)
            cfg = trial_trainer_config(self.spec, record, launch.workdir, None)
            seed = cfg.seed
            curve = self.surrogate.curve(Config(cfg.optimizer.name, cfg.optimizer.lr, cfg.schedule.warmup_steps,
                                                cfg.batch.global_batch_size, seed))  # fmt: skip
        except (HpoError, ValueError) as e:  # a configuration the table cannot serve: a failed trial, as the real
            failed = TrialResult(TrialState.FAILED, f"invalid trial config: {e}", metrics={"error": "config"})
            return _Attempt(launch.trial_id, launch.attempt, slot, started, 0.0, (), failed, 2)
        key = (params_key(record.params), seed)
        already = self.trained.get(key, 0) if self.continues else 0
        train = trained_run(curve, cfg, already, self._time_capped(cfg))
        batch = cfg.batch.global_batch_size
        seconds = self._seconds(train.samples - already, batch)
        points = tuple(
            (self._seconds(s - already, batch), p)
            for s, p in _points(curve, train.evals, already, train.samples, cfg.batch.global_batch_size)
        )
        if launch.timeout_s is not None and seconds > launch.timeout_s:  # killed then, as a real trial is
            points = tuple((offset, p) for offset, p in points if offset <= launch.timeout_s)
            return _Attempt(launch.trial_id, launch.attempt, slot, started, launch.timeout_s, points, None,
                            -signal.SIGKILL)  # fmt: skip
        if self.continues:
            self.trained[key] = max(already, train.samples)
        result = trial_result(self.spec, self._result(curve, cfg, train, already), cfg, seconds)
        code = {TrialState.COMPLETED: 0, TrialState.DIVERGED: 3}.get(result.state, 1)
        return _Attempt(launch.trial_id, launch.attempt, slot, started, seconds, points, result, code)

    def full_runs(
        self, params: dict[str, Any], seeds: Sequence[int]
    ) -> list[tuple[TrialResult, tuple[tuple[int, float], ...], Any]]:
        """(the stored result, the evaluations, the trainer config) of a trial of `params` at full budget trained
        with each of `seeds`, as an attempt of it would record them (the truth of a plan, `hpo.plan.truth`); the
        trial's config is validated once for all the seeds. Raises HpoError where the table cannot serve it."""
        config = trial_config(self.spec, params)
        return [self._full_run(config.model_copy(update={"seed": seed})) for seed in seeds]

    def _full_run(self, cfg) -> tuple[TrialResult, tuple[tuple[int, float], ...], Any]:
        curve = self.surrogate.curve(Config(cfg.optimizer.name, cfg.optimizer.lr, cfg.schedule.warmup_steps,
                                            cfg.batch.global_batch_size, cfg.seed))  # fmt: skip
        train = trained_run(curve, cfg, 0, self._time_capped(cfg))
        batch = cfg.batch.global_batch_size
        seconds, timeout = self._seconds(train.samples, batch), self.spec.budget.trial_timeout_s
        if timeout is not None and seconds > timeout:  # killed then: scored by the best accuracy it reported
            evals = tuple((s, a) for s, a in train.evals if self._seconds(s, batch) <= timeout)
            objective = missed_objective(self.spec, cfg, max((a for _, a in evals), default=None))
            state, reason = classify_exit(TrialExit(0, 0, -signal.SIGKILL, timed_out=True))
            return TrialResult(state, reason, objective, duration_s=timeout), evals, cfg
        result = trial_result(self.spec, self._result(curve, cfg, train, 0), cfg, seconds)
        return result, train.evals, cfg

    def _result(self, curve: Curve, cfg, train: TrainedRun, already: int) -> TrainResult:
        target = cfg.eval.target_mlm_accuracy
        hit = next((s for s, a in train.evals if a >= target), None)
        accuracies = [a for _, a in train.evals]
        status = (TrainStatus.DIVERGED if train.diverged else
                  TrainStatus.REACHED_TARGET if hit is not None else TrainStatus.BUDGET_EXHAUSTED)  # fmt: skip
        batch = cfg.batch.global_batch_size
        samples_per_s = self.slot_samples_per_s / self._scale(batch)  # in table samples
        return TrainResult(
            status, "loss became NaN or inf" if train.diverged else None, train.samples,
            train.samples // batch, hit,
            None if hit is None else self._seconds(hit, batch), max(accuracies, default=None),
            accuracies[-1] if accuracies else None, self._seconds(train.samples, batch), samples_per_s, 0.0,
            self.spec.resources.gpus_per_trial, cfg.batch.global_batch_size,
            micro_batch_size=micro if isinstance(micro := cfg.batch.micro_batch_size, int) else None,
            target_mlm_accuracy=target,
        )  # fmt: skip

    def _record(self, attempt: _Attempt) -> TrialExit:
        storage = self.storage
        try:
            start = attempt.started
            points = [point._replace(at=start + timedelta(seconds=offset)) for offset, point in attempt.points]
            if points:  # one transaction, each point stamped at its own simulated time
                storage.add_metrics(attempt.trial_id, points, attempt=attempt.attempt)
            if attempt.result is not None:
                storage.finish_trial(attempt.trial_id, attempt.result, attempt=attempt.attempt)
        except DatabaseUnavailableError:
            raise  # away for longer than the bound: the study stops, and a resume runs the attempt again
        except HpoError:
            pass  # its record was closed under it (a stop): it records nothing more
        self.free.append(attempt.slot)
        self.free.sort()
        return TrialExit(attempt.trial_id, attempt.attempt, attempt.returncode, timed_out=attempt.result is None,
                         worker=f"sim-slot-{attempt.slot}", duration_s=attempt.duration_s)  # fmt: skip

    def _scale(self, batch: int) -> float:
        """The samples one table sample stands for at global batch size `batch` (table units)."""
        return self.batch_scale.get(batch, self.sample_scale)

    def _seconds(self, samples: float, batch: int) -> float:
        return max(samples, 0) * self._scale(batch) / self.slot_samples_per_s

    def _time_capped(self, cfg) -> int | None:
        """Where the trainer's budget.max_time_s stops a run of `cfg`, in table samples: the end of the first step
        at or past it (None: no such cap)."""
        if cfg.budget.max_time_s is None:
            return None
        batch = cfg.batch.global_batch_size
        steps = math.ceil(cfg.budget.max_time_s * self.slot_samples_per_s / self._scale(batch) / batch - 1e-9)
        return max(steps, 1) * batch


@dataclass(frozen=True)
class TrainedRun:
    """What a simulated run trains."""

    evals: tuple[tuple[int, float], ...]  # every evaluation of the run so far (earlier budgets included)
    samples: int  # where this attempt stops
    diverged: bool


def trained_run(curve: Curve, cfg, already: int = 0, time_capped: int | None = None) -> TrainedRun:
    """Where a run of `cfg` on `curve` stops: at the first evaluation at or above the target (when it stops at
    the target), where it diverges, or at its budget: budget.max_samples, or `time_capped` samples where its
    budget.max_time_s ends it sooner. The peers of bench/cost_at_scale/ train by it too."""
    budget = cfg.budget.max_samples if time_capped is None else min(cfg.budget.max_samples, time_capped)
    evals = curve.evaluations(cfg.eval.every_samples, budget)
    if cfg.eval.stop_at_target:
        hit = next((i for i, (s, a) in enumerate(evals) if a >= cfg.eval.target_mlm_accuracy), None)
        if hit is not None:
            return TrainedRun(evals[: hit + 1], max(evals[hit][0], already), False)
    if curve.diverged and curve.end <= budget:
        return TrainedRun(evals, curve.end, True)
    return TrainedRun(evals, min(budget, curve.end), False)


def _points(curve: Curve, evals, already: int, until: int, batch: int):
    """(samples, MetricPoint) the attempt records, in order: progress (loss, noise scale) and evaluations after
    `already` (the checkpoint it continued from) up to `until`, each at the optimizer step of its sample count (of
    global batch `batch`), as a trainer records it."""
    points: list[tuple[int, int, MetricPoint]] = []
    for samples, loss in curve.loss:
        if already < samples <= until:
            points.append((samples, 0, MetricPoint(samples // batch, samples, {"loss": loss})))
    for samples, scale in curve.noise_scale:
        if already < samples <= until:
            points.append((samples, 1, MetricPoint(samples // batch, samples, {"noise_scale": scale})))
    for samples, accuracy in evals:
        if already < samples <= until:
            points.append((samples, 2, MetricPoint(samples // batch, samples, {"mlm_accuracy": accuracy})))
    return [(s, p) for s, _, p in sorted(points, key=lambda x: (x[0], x[1]))]


def check_table_covers(spec, table) -> None:
    """Every trial the experiment can propose is in the table, and the table has recorded the runs it reads.
    Raises HpoError naming the field, or the arm, grid point and runs missing (see `table_gaps`)."""
    gaps = table_gaps(spec, table)
    if gaps:
        listed = "\n  ".join(gaps)
        raise HpoError(f"{spec.source}: the curve table {table.path} lacks runs this experiment needs "
                       f"({table.resume_hint()}; or narrow the space to what it has):\n  {listed}")  # fmt: skip


def table_gaps(spec, table) -> list[str]:
    """The runs the experiment needs that the table has not recorded yet (a table still being generated), one
    line per grid point: `<point>: seeds 1, 2 at lr 0.01, 0.0178`; [] when it has them all. Raises HpoError for
    what the table's grid cannot serve at all: a combination of optimizer, warmup and global batch size of an arm
    that is no point of the grid, a learning rate (tuned or fixed) outside the grid's range at that point, or a
    sample budget beyond the table's at that batch size (a table may have one per batch size)."""
    handicaps = spec.runner.simulation.handicaps if spec.runner.simulation else {}
    gaps: list[str] = []
    for arm, point in _arm_points(spec):
        optimizer, _ = point["optimizer.name"]
        optimizer = handicaps[optimizer].curves_of if optimizer in handicaps else optimizer
        for warmup, batch in itertools.product(_ints(point["schedule.warmup_steps"][0]),
                                               _ints(point["batch.global_batch_size"][0])):  # fmt: skip
            outside = table.outside(optimizer, warmup, batch)
            if outside:
                raise HpoError(f"{spec.source}: {arm}: {outside}")
            low, high = _bounds(point["optimizer.lr"][0])
            lrs = table.learning_rates(optimizer, warmup, batch)
            if not lrs:  # a point of a product grid whose meta record lists no learning rates, not generated yet
                gaps.append(f"{point_label(optimizer, warmup, batch)}: every run")
                continue
            if not lrs[0] * (1 - 1e-9) <= low <= high <= lrs[-1] * (1 + 1e-9):
                raise HpoError(f"{spec.source}: {point['optimizer.lr'][1]}: optimizer.lr [{low:g}, {high:g}] is "
                               f"outside the curve table's range [{lrs[0]:g}, {lrs[-1]:g}] at "
                               f"{point_label(optimizer, warmup, batch)} ({arm}; {table.path})")  # fmt: skip
            budget, budget_field = point["budget.max_samples"]
            if _bounds(budget)[1] > table.max_samples_for(batch):
                raise HpoError(f"{spec.source}: {budget_field}: budget.max_samples {_bounds(budget)[1]} is beyond the "
                               f"curve table's {table.max_samples_for(batch)} samples at batch.global_batch_size="
                               f"{batch} ({arm}; {table.path})")  # fmt: skip
            every, every_field = point["eval.every_samples"]
            table_every = table.eval_every_for(batch)
            if isinstance(every, _Range) or every % table_every:
                raise HpoError(f"{spec.source}: {every_field}: eval.every_samples {every} is not a multiple of the "
                               f"curve table's evaluation interval, {table_every} samples at batch.global_batch_size="
                               f"{batch}: the evaluations between the table's would be made up; use {table_every} "
                               f"or a multiple of it ({arm}; {table.path})")  # fmt: skip
            gap = table.gaps(optimizer, warmup, batch, low, high)
            line = f"{point_label(optimizer, warmup, batch)}: {gap}"
            if gap and line not in gaps:
                gaps.append(line)
    return gaps


def batch_budgets(spec) -> dict[int, int]:
    """The global batch sizes a trial of the experiment may run, each with the largest sample budget a trial trains
    there (a budget may be set per batch size, as a one-value choice conditioned on it)."""
    budgets: dict[int, int] = {}
    for _, point in _arm_points(spec):
        budget = int(_bounds(point["budget.max_samples"][0])[1])
        for batch in _ints(point["batch.global_batch_size"][0]):
            budgets[batch] = max(budgets.get(batch, 0), budget)
    return dict(sorted(budgets.items()))


READ = (*DIMENSIONS, *RUN_LENGTH)  # the keys of a trial's config that must fit the table


@dataclass(frozen=True)
class _Range:
    """A tuned number's range."""

    low: float
    high: float


def _arm_points(spec):
    """(arm, setting) for every combination of the choices a trial of each arm can make, where a setting maps each
    key of `READ` to (its value or tuned `_Range`, the field it comes from)."""
    base = config_from_dict(spec.resolved_base())
    for plan in arm_plans(spec):
        arm, space = (f"arm {plan.label}" if plan.label else "the space"), plan.space
        choices = [name for name in space.names if isinstance(space[name], CategoricalParam)]
        seen: list[dict[str, tuple[Any, str]]] = []
        for combo in itertools.product(*(space[name].choices for name in choices)):
            picked = dict(zip(choices, combo, strict=True))
            setting = {key: (get_dotted(base, key), "base config + overrides") for key in READ}
            setting |= {trainer_key(k): (v, f"compare {k}") for k, v in plan.fixed.items()}
            for name in space.names:
                if not space.is_active(name, picked):
                    continue
                param = space[name]
                value = picked[name] if name in picked else _Range(param.low, param.high)
                setting[trainer_key(name)] = (value, f"space.{name}")
            if setting not in seen:
                seen.append(setting)
                yield arm, setting


def _ints(value) -> list[int]:
    return list(range(int(value.low), int(value.high) + 1)) if isinstance(value, _Range) else [value]


def _bounds(value) -> tuple[float, float]:
    return (value.low, value.high) if isinstance(value, _Range) else (value, value)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
