"""Everything a report shows, read from storage into plain numbers: no figure or page code reads the database.

Outcomes. Every trial has one outcome, from its stored state and result:

- `reached`: it ended normally and reached the target (it has samples to target);
- `missed`: it ended normally without reaching the target (its whole sample budget used up);
- `diverged`, `failed`, `timeout`: as stored; `bad data`: a failure on bad data, which says nothing about the
  hyperparameters (the tuner was not told, the verdict leaves it out);
- `unfinished`: queued, running or interrupted (its stored state, `TrialRow.state`, says which: the report counts
  and lists it by that state, as `hpo status` and `hpo trials` do).

Values. A trial's `value` is its stored objective when that objective is a measurement: for the "to target"
metrics only a run that reached the target has one (a miss's objective is a penalty, shown as a miss and never
drawn as a number); for the other metrics, every normally ended run. A failure never has a value.

Large experiments. What the page counts, compares or summarises (the verdict, the outcomes, the best trials, the
best-so-far bands, the noise-scale medians) reads every trial. A figure draws at most MAX_DRAWN trials per arm as
points (`drawn_positions`: the arm's BEST_DRAWN best and a fixed stride over the others, the same every time);
the page names the other subsets it uses (the trials it lists, the importance surrogate's trials).

The noise scale of a trial is the median of its reported B_simple over the second half of its training samples:
the estimate is smoothed over steps and lags, and is noisiest at the start (see trainer/noise_scale.py). The storage
keeps it on each trial when the trial finishes (hpo/storage/noise.py), so a report reads two numbers per trial, not
every noise-scale record; only trials finished before the storage kept it are read from their records.

Rungs. Under a multi-fidelity tuner (smac_hyperband) tuning trials run at several budgets (fractions of
budget.max_samples): a rung is one budget, and a configuration promoted to the next rung is a new trial with the
same parameters and a larger budget, continuing from the same configuration's checkpoint. `promotion_rungs` groups
the trials into rungs and promotion chains (one configuration's trials at increasing budgets).

When the noise scale is only a lower bound. Checked against a closed form, the estimate comes within 10 % while
the true noise scale is at most about 4x the estimator's big batch (B_big: the global batch without gradient
accumulation, one rank's accumulated batch with it). Far above that the smoothed |G|^2 is the small difference
of two noisy numbers: the estimate is heavy-tailed, its median came out at 0.34 to 0.5x the truth, and 20 to 45 %
of the steps gave no estimate at all (smoothed |G|^2 not positive), so the median of the positive estimates is
biased low. A trial's value is therefore flagged as a lower bound, not a value, when it exceeds
NOISE_CHECKED_RATIO x its big batch, or when at least NOISE_UNDEFINED_SHARE of its measured late steps gave no
estimate (the lowest share seen in that regime). On simulated gradients with a known answer (the trainer's own
estimator, tests/hpo/report/test_report_edges.py) the rule flags no run at 1x the big batch and 0 to 2 % at 2x, and 92
to 100 % of the runs at 16x, where the median run reads 0.5x the truth; the runs it misses there read so low,
with so few empty steps, that nothing in the record tells them apart.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from hpo.engine.settle import seen_status
from hpo.evidence.confirmations import at_look, round_line, stored_curves
from hpo.evidence.verdict import ArmRuns, ArmSummary, Verdict, arm_runs, decide, unselected
from hpo.experiment import spec_from_stored
from hpo.experiment.arms import arm_label, arms, declared_batch_sizes, params_key
from hpo.mlperf import imported
from hpo.objective import NOT_HYPERPARAMETER_ERRORS
from hpo.simulation.cost import simulated_line
from hpo.storage.base import Direction, ExperimentStatus, MetricRecord, Storage, TrialRecord, curve_point
from hpo.storage.noise import NOISE_METRICS, LateNoise, late_noise_of
from hpo.trials import TrialKind, TrialState
from search_spaces.space import trainer_key
from trainer.config import config_from_dict

TO_TARGET_METRICS = ("samples_to_target", "time_to_target_s")
OUTCOMES = ("reached", "missed", "diverged", "failed", "timeout", "bad data", "unfinished")
NOISE_CHECKED_RATIO = 4.0  # the estimate was checked within 10 % up to this multiple of the big batch
NOISE_UNDEFINED_SHARE = 0.2  # far above it, 20 to 45 % of the steps had no estimate
TOP_TRIALS = 3  # learning curves and noise-scale curves drawn per arm
MAX_DRAWN = 1000  # trials per arm drawn as points in a figure (see `drawn_positions`)
BEST_DRAWN = 100  # of them, the arm's best; the rest a fixed stride over its other trials
NO_ARM = "all"  # the arm label of an experiment that compares nothing


@dataclass(frozen=True)
class TrialRow:
    """One trial as the report sees it."""

    number: int
    arm: str
    kind: str  # "tuning" or "confirmation"
    seed: int | None
    outcome: str  # one of OUTCOMES
    objective: float | None  # as stored (a penalty for a miss of a "to target" metric)
    value: float | None  # the objective when it is a measurement (see the module docstring)
    samples_to_target: int | None
    best_mlm_accuracy: float | None
    samples: int | None  # training samples it used (its final record; None without one)
    duration_s: float | None
    gpus: int
    global_batch_size: int | None
    params: dict[str, Any]
    reason: str | None
    noise_scale: float | None = None  # the median over its second half (None: not measured)
    noise_big_batch: int | None = None  # the estimator's big batch B_big (see the module docstring)
    noise_undefined: float = 0.0  # the share of its measured late steps that gave no estimate
    unselected: bool = False  # nothing picked it on its outcome (an imported configuration alone in its arm): evidence
    state: str = "completed"  # its stored state (TrialState's value): what `hpo status` counts it as

    @property
    def noise_lower_bound(self) -> str | None:
        """Why its noise scale is only a lower bound (see the module docstring); None when it is a value."""
        return lower_bound_reason(self.noise_scale, self.noise_big_batch, self.noise_undefined)


@dataclass(frozen=True)
class Curve:
    """A trial's learning curve (evaluations) and its noise-scale record (progress reports)."""

    number: int
    arm: str
    eval_samples: tuple[float, ...]
    eval_time_s: tuple[float, ...]
    mlm_accuracy: tuple[float, ...]
    noise_samples: tuple[float, ...]
    noise_scale: tuple[float, ...]


@dataclass(frozen=True)
class ArmData:
    label: str
    trials: tuple[TrialRow, ...]  # every trial of the arm, in number order
    best: TrialRow | None  # the storage's best tuning trial (what `hpo export --arm` exports)
    evidence: ArmSummary | None  # the verdict's numbers for this arm
    optimizer: str | None = None  # the optimizer of its best trial (of its first trial when none is best)

    @cached_property
    def tuning(self) -> tuple[TrialRow, ...]:
        """The tuning trials, in number order (read by every table and figure: kept after the first read)."""
        return tuple(t for t in self.trials if t.kind == TrialKind.TUNING.value)

    def counts(self, kind: str | None = TrialKind.TUNING.value) -> dict[str, int]:
        """Trials per outcome (of one kind, or all with kind=None), every outcome present."""
        counts = dict.fromkeys(OUTCOMES, 0)
        for trial in self.trials:
            if kind is None or trial.kind == kind:
                counts[trial.outcome] += 1
        return counts

    @property
    def global_batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({t.global_batch_size for t in self.trials if t.global_batch_size}))


@dataclass(frozen=True)
class Dimension:
    """One tuned hyperparameter: its name, kind ("float", "int", "choice"), log scale and choices."""

    name: str
    kind: str
    log: bool
    choices: tuple[Any, ...] = ()


@dataclass(frozen=True)
class ExperimentData:
    name: str
    description: str
    liveness: str  # live, interrupted, unresponsive, finished, stopped, failed
    metric: str
    direction: str
    target_mlm_accuracy: float
    max_samples: int
    tuner: str
    trials_budget: int
    confirm_seeds: int | str  # a number, or "auto" (rounds until the verdict decides)
    planned_confirmations: int  # confirmation runs planned over all arms (the cap with auto)
    compare: tuple[str, ...]
    dimensions: tuple[Dimension, ...]
    arms: tuple[ArmData, ...]
    verdict: Verdict | None  # None without compare arms
    curves: dict[int, Curve] = field(default_factory=dict)  # trial number -> curve (the top trials of each arm)
    simulated: str | None = None  # a simulated experiment's cost line (hpo.simulation.cost); None for a real one
    nni_webui: tuple[dict[str, Any], ...] = ()  # engine: nni: where each NNI experiment's web UI was last served
    engine: str = "local"  # spec.engine
    rungs: dict[str, ArmRungs] = field(default_factory=dict)  # arm -> its rungs; empty unless multi-fidelity
    confirmation_plan: str = ""  # budget.confirm_seeds in words (Budget.confirmation_plan)
    confirmation_round: str = ""  # where the confirmation rounds stand (hpo.evidence.confirmations.round_line)
    imported: dict[str, Any] | None = None  # an imported experiment's origin (hpo.mlperf.imported); None: ran here
    # arm label -> the samples to target of its best configuration's confirmation runs, as the verdict counts them
    # (hpo.evidence.verdict.arm_runs; None for a miss): what `scaling.confirmation_runs` reads, from the same read
    confirmation_runs: dict[str, tuple[float | None, ...]] = field(default_factory=dict)
    # arm label -> the samples between evaluations of those runs where one was read at an evaluation, else 0: the
    # verdict's floor of their spread (hpo.evidence.verdict.ArmRuns.resolution)
    confirmation_resolution: dict[str, float] = field(default_factory=dict)
    # arm label -> its evidence as the verdict reads it at the current look (the runs of the rounds up to it, its
    # pick and whether its tuning found the target: hpo.evidence.confirmations.at_look); the verdict at each batch
    # size reads it
    verdict_runs: dict[str, ArmRuns] = field(default_factory=dict)
    # a batch-size study's batch sizes with two or more optimizers declared, over which the verdicts at each batch
    # size share the error (hpo.experiment.arms.declared_batch_sizes); () for another experiment
    declared_batch_sizes: tuple[int, ...] = ()

    @property
    def to_target(self) -> bool:
        return self.metric in TO_TARGET_METRICS

    @cached_property
    def trials(self) -> list[TrialRow]:
        """Every trial in number order (sorted once: pages ask for it many times)."""
        return sorted((t for arm in self.arms for t in arm.trials), key=lambda t: t.number)

    def top(self, arm: ArmData, k: int = TOP_TRIALS) -> list[TrialRow]:
        """The arm's k best tuning trials: measured values best first, then the misses closest to the target."""
        return top_trials(arm.tuning, self.direction, k)


def load_experiment(storage: Storage, name: str, *, with_noise: bool = True) -> ExperimentData:
    """Read one experiment: its spec, trials, the verdict, and the curves of each arm's top trials. The trials are
    listed once, with the noise scale the storage kept on each (the records of trials finished before it kept it are
    one bulk read)."""
    record = storage.get_experiment_by_name(name)
    spec = spec_from_stored(record)
    records = storage.list_trials(record.id)
    best = storage.best_per_arm(record.id) if spec.compare else {None: storage.best_trial(record.id)}
    curves = stored_curves(storage, records, best.values())
    at_look_runs, at, looks = at_look(spec, best, records, curves)
    verdict = decide(at_look_runs, spec.verdict.margin, at, looks)
    confirmed = arm_runs(spec, best, records, curves)  # every finished run, whatever the look (the batch-size fits)
    noise = _noise_by_trial(storage, record.id, records) if with_noise else {}
    labels = [arm_label(fixed) if fixed else None for fixed in arms(spec)]
    metric = spec.objective.metric
    base = spec.resolved_base()
    cfg = config_from_dict(base)
    micro_names = [name for name in spec.space.params if trainer_key(name) == "batch.micro_batch_size"]
    arm_data = []
    for label in labels:
        mine = [t for t in records if t.arm == label]
        rows = tuple(_row(t, metric, noise.get(t.id), _big_batch(spec, cfg.batch.micro_batch_size, t, micro_names),
                          spec.space.as_read_now(t.params)) for t in mine)  # fmt: skip
        top = best.get(label)
        evidence = _evidence(verdict, label or NO_ARM)
        optimizer = _optimizer(spec, base, top.params if top else rows[0].params if rows else {})
        arm_data.append(ArmData(label or NO_ARM, rows, _find(rows, top), evidence, optimizer))
    data = ExperimentData(
        name=record.name,
        description=spec.description,
        liveness=seen_status(record),
        metric=metric,
        direction=record.direction.value,
        target_mlm_accuracy=float(cfg.eval.target_mlm_accuracy),
        max_samples=int(cfg.budget.max_samples),
        tuner=spec.tuner.name,
        trials_budget=spec.budget.trials,
        confirm_seeds=spec.budget.confirm_seeds,
        planned_confirmations=_planned_confirmations(record, spec, len(labels), records),
        compare=tuple(spec.compare),
        dimensions=_dimensions(spec),
        arms=tuple(arm_data),
        verdict=verdict if spec.compare else None,
        simulated=simulated_line(spec, records),
        nni_webui=tuple(record.nni_webui),
        engine=spec.engine,
        rungs=promotion_rungs(records, int(cfg.budget.max_samples), metric),
        confirmation_plan=spec.budget.confirmation_plan(),
        confirmation_round=round_line(spec, records, best) if spec.compare else "",
        imported=imported(record),
        confirmation_runs={arm.label: arm.samples_to_target for arm in confirmed},
        confirmation_resolution={arm.label: arm.resolution for arm in confirmed},
        verdict_runs={arm.label: arm for arm in at_look_runs} if spec.compare else {},
        declared_batch_sizes=() if imported(record) else declared_batch_sizes(spec),  # an import's runs are all there
    )
    _load_curves(storage, records, data)
    return data


def _optimizer(spec, base: dict[str, Any], params: dict[str, Any]) -> str | None:
    """The optimizer a configuration trains with: its own `optimizer.name`, else the base config's."""
    return spec.space.trainer_values(params).get("optimizer.name", base.get("optimizer", {}).get("name"))


def _evidence(verdict: Verdict, label: str) -> ArmSummary | None:
    return next((a for a in verdict.arms if a.label == label), None)


def _find(rows: Sequence[TrialRow], trial: TrialRecord | None) -> TrialRow | None:
    return None if trial is None else next(r for r in rows if r.number == trial.number)


def outcome(trial: TrialRecord) -> str:
    """The trial's outcome (see the module docstring)."""
    if not trial.state.finished:
        return "unfinished"
    if (trial.metrics or {}).get("error") in NOT_HYPERPARAMETER_ERRORS:
        return "bad data"
    if trial.state is TrialState.COMPLETED:
        return "reached" if trial.samples_to_target is not None else "missed"
    return trial.state.value


def measured_value(trial: TrialRecord, metric: str) -> float | None:
    """The trial's objective when it is a measurement, else None (see the module docstring)."""
    if trial.state is not TrialState.COMPLETED or trial.objective is None or not math.isfinite(trial.objective):
        return None
    if metric in TO_TARGET_METRICS and trial.samples_to_target is None:
        return None
    return trial.objective


def _big_batch(spec, base_micro: int | str, trial: TrialRecord, micro_names: Sequence[str]) -> int | None:
    """The big batch of the trial's noise-scale estimator, from its configuration and ranks (`micro_names`: the
    space's parameters that set batch.micro_batch_size, found once for all trials)."""
    micro = (trial.metrics or {}).get("micro_batch_size")  # the trainer's, `auto` resolved (older results lack it)
    if micro is None:
        micro = next((trial.params[name] for name in micro_names if name in trial.params), base_micro)
    if micro == "auto":
        return None
    ranks = len(trial.gpus) or spec.resources.cpu_ranks_per_trial
    return big_batch(trial.global_batch_size, int(micro), ranks)


def _row(trial: TrialRecord, metric: str, noise: LateNoise | None, noise_big_batch: int | None = None,
         params: dict[str, Any] | None = None) -> TrialRow:  # fmt: skip
    """`params`: the trial's parameters as the space reads them now (`SearchSpace.as_read_now`)."""
    final = trial.metrics or {}
    samples = final.get("samples")
    return TrialRow(
        number=trial.number,
        arm=trial.arm or NO_ARM,
        kind=trial.kind.value,
        seed=trial.seed,
        outcome=outcome(trial),
        state=trial.state.value,
        objective=trial.objective,
        value=measured_value(trial, metric),
        samples_to_target=trial.samples_to_target,
        best_mlm_accuracy=trial.best_mlm_accuracy,
        samples=int(samples) if isinstance(samples, int | float) else None,
        duration_s=trial.duration_s,
        gpus=len(trial.gpus),
        global_batch_size=trial.global_batch_size,
        params=dict(trial.params if params is None else params),
        reason=trial.reason,
        noise_scale=noise.value if noise else None,
        noise_big_batch=noise_big_batch,
        noise_undefined=noise.undefined if noise else 0.0,
        unselected=unselected(trial),
    )


def top_trials(rows: Sequence[TrialRow], direction: str, k: int) -> list[TrialRow]:
    """The k best rows: measured values best first (ties by number), then the rest by best accuracy."""
    sign = -1.0 if direction == Direction.MAXIMIZE.value else 1.0
    # the k smallest in one pass each (numbers are unique, so the order is total: the same as sorting all rows)
    measured = heapq.nsmallest(k, (r for r in rows if r.value is not None), key=lambda r: (sign * r.value, r.number))
    if len(measured) >= k:
        return measured
    others = heapq.nsmallest(k - len(measured), (r for r in rows if r.value is None and r.outcome != "unfinished"),
                             key=lambda r: (-(r.best_mlm_accuracy or 0.0), r.number))  # fmt: skip
    return measured + others


def drawn_positions(rows: Sequence[TrialRow], direction: str, most: int = MAX_DRAWN) -> list[int]:
    """The positions in `rows` of the trials a figure draws as points, ascending: all of them up to `most`; above,
    the BEST_DRAWN best (`top_trials`) and a fixed stride over the others, `most` in all. The same rows give the
    same choice every time, and the verdict, counts, bands and medians never read it."""
    if len(rows) <= most:
        return list(range(len(rows)))
    best = {r.number for r in top_trials(rows, direction, BEST_DRAWN)}
    chosen = {i for i, r in enumerate(rows) if r.number in best}
    others = [i for i in range(len(rows)) if i not in chosen]
    spare = most - len(chosen)
    chosen.update(others[j * len(others) // spare] for j in range(spare))
    return sorted(chosen)


def _dimensions(spec) -> tuple[Dimension, ...]:
    dims = []
    for name in spec.space.names:
        param = spec.space[name]
        if hasattr(param, "choices"):
            dims.append(Dimension(name, "choice", False, tuple(param.choices)))
        else:
            kind = "int" if type(param).__name__ == "IntParam" else "float"
            dims.append(Dimension(name, kind, bool(param.log)))
    return tuple(dims)


# --------------------------------------------------------------------------- rungs (multi-fidelity)


@dataclass(frozen=True)
class Rung:
    """One budget of a multi-fidelity arm."""

    budget: float  # the fraction of budget.max_samples
    samples: int  # round(budget x budget.max_samples)
    trials: int  # tuning trials run at this budget
    promoted: int  # of them, continued at a larger budget (the same configuration's next trial)


@dataclass(frozen=True)
class RungStep:
    """One trial of a promotion chain."""

    number: int
    budget: float
    samples: int
    outcome: str  # one of OUTCOMES
    value: float | None  # the measured objective (None for a miss or a failure; see the module docstring)


@dataclass(frozen=True)
class ArmRungs:
    arm: str
    rungs: tuple[Rung, ...]  # smallest budget first
    chains: tuple[tuple[RungStep, ...], ...]  # each promoted configuration's trials, budget by budget


def promotion_rungs(records: Sequence[TrialRecord], max_samples: int, metric: str) -> dict[str, ArmRungs]:
    """Per arm (in the order of their first trial), the rungs of its tuning trials and the chains of promoted
    configurations; empty for a single-fidelity experiment (every tuning trial at one budget).

    A configuration is a set of parameters; its trials, in number order, form a chain while each one's budget
    is larger than the one before (a promotion); a trial at a budget not above the previous one starts a new
    chain (the configuration sampled again). Only chains of two or more trials are listed, those that reached
    the largest budget first, then by their first trial."""
    tuning = sorted((t for t in records if t.kind is TrialKind.TUNING), key=lambda t: t.number)
    if len({t.budget for t in tuning}) < 2:
        return {}
    by_arm: dict[str, list[TrialRecord]] = {}
    for trial in tuning:
        by_arm.setdefault(trial.arm or NO_ARM, []).append(trial)
    return {arm: _arm_rungs(arm, trials, max_samples, metric) for arm, trials in by_arm.items()}


def _arm_rungs(arm: str, trials: Sequence[TrialRecord], max_samples: int, metric: str) -> ArmRungs:
    chains: dict[str, list[list[TrialRecord]]] = {}
    for trial in trials:
        mine = chains.setdefault(params_key(trial.params), [])
        if mine and mine[-1][-1].budget < trial.budget:
            mine[-1].append(trial)
        else:
            mine.append([trial])
    every = [chain for configuration in chains.values() for chain in configuration]
    promoted = [trial.budget for chain in every for trial in chain[:-1]]
    budgets = sorted({t.budget for t in trials})
    rungs = tuple(Rung(b, _samples(b, max_samples), sum(t.budget == b for t in trials), promoted.count(b))
                  for b in budgets)  # fmt: skip
    listed = sorted((c for c in every if len(c) > 1), key=lambda c: (-c[-1].budget, c[0].number))
    steps = tuple(tuple(RungStep(t.number, t.budget, _samples(t.budget, max_samples), outcome(t),
                                 measured_value(t, metric)) for t in chain) for chain in listed)  # fmt: skip
    return ArmRungs(arm, rungs, steps)


def _samples(budget: float, max_samples: int) -> int:
    """The samples of a trial at `budget`, as its trainer config gets them (hpo.experiment.arms.trial_config)."""
    return max(1, round(max_samples * budget))


# --------------------------------------------------------------------------- metrics


def _noise_by_trial(storage: Storage, experiment_id: int, records: Sequence[TrialRecord]) -> dict[int, LateNoise]:
    """The late-training noise scale of every finished trial: as the storage kept it, else from its records."""
    finished = [t for t in records if t.state.finished]
    kept = {t.id: LateNoise(t.late_noise_scale, t.late_noise_undefined)
            for t in finished if t.late_noise_undefined is not None}  # fmt: skip
    older = [t for t in finished if t.id not in kept]
    metrics = _noise_metrics(storage, experiment_id, older) if older else {}
    return kept | {t.id: late_noise_of(metrics.get(t.id, ())) for t in older}


def _noise_metrics(storage: Storage, experiment_id: int, trials: Sequence[TrialRecord]) -> dict[int, list]:
    """Trial id -> its NOISE_METRICS records, in one read for the whole experiment (a read per trial costs about
    a millisecond: 10 s at 10,000 trials). Trials not in `trials` are left out."""
    wanted = {t.id for t in trials}
    read = storage.get_experiment_metrics(experiment_id, NOISE_METRICS, times=False)
    return {k: v for k, v in read.items() if k in wanted}


def lower_bound_reason(value: float | None, big_batch: int | None, undefined: float) -> str | None:
    """Why a noise-scale estimate is only a lower bound (see the module docstring), or None for a value."""
    if value is None:
        return None
    reasons = []
    if big_batch and value > NOISE_CHECKED_RATIO * big_batch:
        reasons.append(f"{value / big_batch:.1f}x its big batch of {big_batch:,}, where the estimate is checked only "
                       f"up to {NOISE_CHECKED_RATIO:g}x and reads low")  # fmt: skip
    if undefined >= NOISE_UNDEFINED_SHARE:
        reasons.append(f"{undefined:.0%} of its late steps gave no estimate")
    return "; ".join(reasons) or None


def big_batch(global_batch_size: int | None, micro_batch_size: int, ranks: int) -> int | None:
    """The noise-scale estimator's big batch: one rank's accumulated batch under gradient accumulation, else the
    global batch (the all-reduced gradient of all ranks); see trainer/noise_scale.py."""
    if not global_batch_size:
        return None
    accumulation = global_batch_size // max(1, micro_batch_size * ranks)
    return global_batch_size // ranks if accumulation > 1 else global_batch_size


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _load_curves(storage: Storage, records: Sequence[TrialRecord], data: ExperimentData) -> None:
    """The learning curves and noise-scale curves of each arm's top trials (only those are drawn)."""
    ids = {t.number: t.id for t in records}
    for arm in data.arms:
        for row in data.top(arm):
            data.curves[row.number] = curve_of(row.number, arm.label, storage.get_metrics(ids[row.number]))


def curve_of(number: int, arm: str, records: Sequence[MetricRecord]) -> Curve:
    """Evaluations (mlm_accuracy with the samples and time of the same step) and noise-scale points."""
    by_step: dict[tuple[int, int], dict[str, float]] = {}
    samples_at: dict[tuple[int, int], float] = {}
    for r in records:
        step = curve_point(r)
        by_step.setdefault(step, {})[r.name] = r.value
        if r.samples is not None:
            samples_at[step] = float(r.samples)
    evals = [(samples_at.get(step), v.get("time_s"), v["mlm_accuracy"]) for step, v in sorted(by_step.items())
             if "mlm_accuracy" in v and math.isfinite(v["mlm_accuracy"])]  # fmt: skip
    evals = [(s, t if t is not None else math.nan, a) for s, t, a in evals if s is not None]
    noise = [(samples_at[step], v["noise_scale"]) for step, v in sorted(by_step.items())
             if step in samples_at and _positive(v.get("noise_scale"))]  # fmt: skip
    return Curve(
        number,
        arm,
        tuple(s for s, _, _ in evals),
        tuple(t for _, t, _ in evals),
        tuple(a for _, _, a in evals),
        tuple(s for s, _ in noise),
        tuple(v for _, v in noise),
    )


def _planned_confirmations(record, spec, arm_count: int, records: Sequence[TrialRecord]) -> int:
    """The confirmation runs an experiment plans over all its arms: confirm_seeds per arm (with auto, the cap); once
    it has finished, those it made (auto confirmations end when the verdict decides, before the cap), as
    `hpo status` counts them."""
    if record.status is ExperimentStatus.FINISHED:
        return sum(1 for t in records if t.kind is not TrialKind.TUNING)
    return spec.budget.most_confirm_seeds * arm_count
