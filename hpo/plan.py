"""`hpo plan`: what an experiment will cost and how likely it ends with an answer, before it spends anything.

    plan = prepare_plan("search_spaces/presets/adam_vs_lamb_simulated.yaml", PlanOptions(repetitions=20))
    repetitions = run_plan(plan)                       # R simulated experiments, each in a temporary database
    print("\\n".join(forecast_lines(plan, repetitions)))
    evidence = stated_evidence(arm_labels(plan.spec), cv=0.05, difference=0.10)   # or pilot_evidence(storage, ...)
    print("\\n".join(chances_forecast(plan.spec, evidence, power=0.8)))   # the verdict's chances, the advice

The experiment file runs R times on the simulated runner (`hpo.runners.simulated`: trials read their learning
curves from a recorded table, at simulated times): the same study loop, tuner, confirmation runs
(`confirm_seeds: auto` included) and verdict as `hpo run`. Each repetition has its own SQLite database in a
temporary directory, deleted when the plan ends; the user's database (`--db`, HPO_DATABASE_URL) is never opened
there (only `--like` reads a pilot from it).

Repetition r (0-based) under `--seed S`: tuner seed = the file's + S + r, training seed = the file's +
SEED_STRIDE x (S + r) (the confirmation runs take the seeds after it; the stride keeps the repetitions' seeds
apart). Repetition 0 of seed 0 is `hpo run FILE` itself.

A real experiment (runner local or dask, or engine nni) is planned on the simulated runner over DEFAULT_TABLE when
the table covers its space (the output says so); otherwise `PlanError` says what a plannable file needs. Durations
are the simulated runner's model (runner.simulation: the GPU's samples per second x GPUs per slot, one table
sample = `sample_scale` BERT-large samples): a conversion, not a measurement; `--gpu` and `--samples-per-s` change it.

Figures of one repetition, from its stored trials:
- first target-reaching configuration (`first_hit`): the first trial, in simulated finishing time, that reached
  the target; wall-clock from the first trial's creation to its end, GPU-hours the busy slot-time of every trial
  up to that moment x GPUs per slot;
- the verdict: the end of the experiment (its last trial): GPU-hours, wall-clock and the idle share of the
  slot-time (`hpo.simulation.cost`);
- the outcome: the verdict's winner, equivalent, or not yet (`hpo.verdict`).

Summaries over the R repetitions: the median and the 2.5th to 97.5th percentile (linear interpolation, numpy's
default), the range 95 % of such experiments fall in (a repetition without a hit counts as never); each outcome's
share with its 95 % Wilson interval (scipy).

Speed: the repetitions read a copy of the table without its training-loss and noise-scale series
(`without_progress_series`): the runner writes every point of them as a record, most of its time, and they change
no duration, objective or decision.

The verdict's chances from a spread (`--cv C --difference D`, or `--like PILOT`; `chances_forecast`): how many
confirmation runs per arm an answer needs, from evidence rather than the curve table. Each arm's confirmation runs
are drawn: ln samples to target ~ Normal(log_mean, log_sd), a miss (censored at the budget) with probability
1 - hit rate. A stated spread is log-normal at CV C in every arm (sigma² = ln(1 + C²)), the file's first arm at
(1 - D) x the others' geometric mean, every run a hit (as bench/verdict_power.py part 2 draws it). A pilot
(`pilot_evidence`, an experiment in the user's database, only read) gives each arm the mean and standard deviation
of ln samples to target of its best configuration's confirmation runs (plus its best tuning run when it has fewer
than 2), interpolated between evaluations as the verdict reads them, at least the verdict's floor of one evaluation
interval; its hit rate; and its difference, taken as the truth (its own 95 % interval is printed beside it).
The runs are independent across arms (the service gives both arms the same seeds; on the seeds table that makes
answers a little likelier than drawn here). Every drawn experiment is asked of `hpo.verdict.decide` itself as the
service asks it: a fixed k at one look, or auto's rounds, look j of J, stopping at an answer or where more runs
would not decide (`confirmation_verdict`). It is judged as bench/verdict_power.py judges: right (the truly better
arm named; "equivalent" where every pair's true ratio lies within the margin), wrong winner, equivalent, not yet.
Each confirmation budget has its own generator seeded by (--seed, fixed or auto, its most runs per arm): the same
command prints the same numbers. `--power P` (`advise`) searches fixed k from 2 upwards to the first whose chance
of a right answer reaches P (at most 12), and auto at caps 6, 9 and 12, with each one's mean runs per arm.
"""

from __future__ import annotations

import copy
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest

from hpo.arms import arm_labels, trial_config
from hpo.confirmations import stored_curves, stored_verdict
from hpo.errors import HpoError
from hpo.experiment import Budget, experiment_from_dict, load_experiment, spec_from_stored, stored_form
from hpo.runners import build_runner
from hpo.simulation.cost import experiment_cost
from hpo.simulation.table import DIMENSIONS, load_table
from hpo.storage import SqlStorage
from hpo.study import Study
from hpo.trials import TrialKind, TrialState
from hpo.verdict import (
    ALPHA,
    ArmRuns,
    Outcome,
    Verdict,
    arm_runs,
    compare,
    decide,
    samples_between_evaluations,
    t_quantile,
)
from trainer.config import config_from_dict

DEFAULT_TABLE = Path(__file__).resolve().parents[1] / "bench" / "curves" / "curves.jsonl"
SEED_STRIDE = 1000  # training seeds between repetitions: more than any arm's confirmation runs
LEVEL = 0.95


class PlanError(HpoError):
    """An experiment file `hpo plan` cannot forecast (a real experiment whose space the default table cannot serve)."""


@dataclass(frozen=True)
class PlanOptions:
    """The command line's choices; None keeps the file's."""

    repetitions: int = 20
    seed: int = 0
    slots: int | None = None  # budget.max_parallel: the simulated cluster's slots
    gpus_per_slot: int | None = None  # resources.gpus_per_trial
    gpu: str | None = None  # runner.simulation.gpu (a100, h100): its samples per second
    samples_per_s: float | None = None  # runner.simulation.samples_per_s: one GPU's samples per second


@dataclass(frozen=True)
class Plan:
    """A checked experiment, ready to repeat on the simulated runner."""

    source: str  # the experiment file
    data: dict[str, Any]  # its self-contained form on the simulated runner, with the options applied
    spec: Any  # repetition 0's validated spec (hpo.experiment.ExperimentSpec)
    table: Path  # the learning-curve table the trials read
    moved: str | None  # a real experiment's runner and engine, planned on the simulated runner; None: it is simulated
    options: PlanOptions
    file_seeds: tuple[int, int]  # the file's tuner seed and training seed

    def seeds(self, index: int) -> tuple[int, int]:
        """(tuner seed, training seed) of repetition `index`."""
        return repetition_seeds(self.file_seeds, self.options.seed + index)


def repetition_seeds(file_seeds: tuple[int, int], seed: int) -> tuple[int, int]:
    """(tuner seed, training seed) of repetition `seed` (--seed + r) of a file with these (tuner, training) seeds."""
    return file_seeds[0] + seed, file_seeds[1] + SEED_STRIDE * seed


@dataclass(frozen=True)
class Repetition:
    """One simulated run of the experiment: its cost and its outcome (hours are simulated)."""

    index: int
    tuner_seed: int
    training_seed: int
    first_hit_gpu_h: float | None  # None: no trial reached the target
    first_hit_wall_h: float | None
    answer_gpu_h: float
    answer_wall_h: float
    idle_fraction: float
    outcome: str  # "winner", "equivalent", "not yet"; "" without compare arms
    winner: str | None
    tuning_trials: int
    confirmation_runs: int


# ------------------------------------------------------------------------------------------------ the file
def prepare_plan(path: str, options: PlanOptions) -> Plan:
    """The experiment file on the simulated runner, checked as `hpo run` checks it (the same errors for a bad file,
    and the table must serve every trial); nothing is written."""
    spec = load_experiment(path)  # a bad file: the errors `hpo run` gives
    data = spec.self_contained()
    moved = None if spec.runner.name == "simulated" else f"runner {spec.runner.name}, engine {spec.engine}"
    if moved:
        data.update(engine="local", runner={"name": "simulated", "simulation": {"table": str(DEFAULT_TABLE)}})
        data["resources"] = {**data["resources"], "machines": []}
    data = _with_options(data, options)
    seeds = (spec.tuner.seed, config_from_dict(spec.resolved_base()).seed)
    try:
        first = _repetition_spec(data, path, repetition_seeds(seeds, options.seed))
        build_runner(first).close()  # reads the table and checks that it covers every trial the file can propose
    except HpoError as e:
        if not moved:
            raise
        raise PlanError(_not_plannable(path, moved, e)) from None
    table = Path(first.runner.simulation.table)
    return Plan(path, data, first, table, moved, options, seeds)


def _with_options(data: dict[str, Any], options: PlanOptions) -> dict[str, Any]:
    data = copy.deepcopy(data)
    simulation = data["runner"]["simulation"]
    if options.slots is not None:
        data["budget"]["max_parallel"] = options.slots
    if options.gpus_per_slot is not None:
        data["resources"]["gpus_per_trial"] = options.gpus_per_slot
    if options.gpu is not None:
        simulation.update(gpu=options.gpu, samples_per_s=None)
    if options.samples_per_s is not None:
        simulation["samples_per_s"] = options.samples_per_s
    return data


def _not_plannable(path: str, moved: str, error: HpoError) -> str:
    reason = str(error).removeprefix(f"{path}: ")
    return (f"{path}: cannot be planned: it is a real experiment ({moved}), and `hpo plan` runs it on the simulated "
            f"runner over the learning-curve table {DEFAULT_TABLE}, which cannot serve it: {reason}\nA plannable file "
            f"tunes only what a table varies ({', '.join(DIMENSIONS)}) within the table's grid, with its budget and "
            "evaluations (see the table's meta line); or copy the file with `runner: {name: simulated, simulation: "
            "{table: YOUR_TABLE}}` (search_spaces/presets/adam_vs_lamb_simulated.yaml is one)")  # fmt: skip


def _repetition_spec(data: dict[str, Any], source: str, seeds: tuple[int, int], table: Path | None = None):
    """The validated spec of a repetition with these (tuner, training) seeds (table: the copy its trials read,
    else the data's)."""
    tuner_seed, training_seed = seeds
    data = copy.deepcopy(data)
    data["tuner"]["seed"] = tuner_seed
    data["overrides"] = {"seed": training_seed}
    if table is not None:
        data["runner"]["simulation"]["table"] = str(table)
    return experiment_from_dict(data, source)


# ------------------------------------------------------------------------------------------------ the runs
def run_plan(plan: Plan, progress: Callable[[int, float], None] | None = None) -> list[Repetition]:
    """The plan's repetitions, one after another, each in a temporary database deleted when it ends; `progress`
    is called with (repetitions done, seconds elapsed) after each."""
    started = time.perf_counter()
    scratch = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # SQLite's syncs cost nothing in memory
    repetitions = []
    with tempfile.TemporaryDirectory(prefix="hpo-plan-", dir=scratch) as tmp:
        directory = Path(tmp)
        table = without_progress_series(plan.table, directory / "curves.jsonl")
        for r in range(plan.options.repetitions):
            repetitions.append(run_repetition(plan, r, directory, table))
            if progress:
                progress(r + 1, time.perf_counter() - started)
    return repetitions


def run_repetition(plan: Plan, index: int, directory: Path, table: Path) -> Repetition:
    """Repetition `index` through the study loop on the simulated runner, in its own database under `directory`
    (deleted afterwards); its figures."""
    spec = _repetition_spec(plan.data, plan.source, plan.seeds(index), table)
    database = directory / f"repetition-{index}.db"
    url, run_dir = f"sqlite:///{database}", directory / f"repetition-{index}"
    runner, storage = build_runner(spec), SqlStorage(url, upgrade=True)
    try:
        experiment_id = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
        runner.attach(storage, experiment_id)  # as `hpo run` drives it (hpo.local_engine.drive), without a display
        Study(spec, storage, experiment_id, run_dir, runner, url).run()
        trials = storage.list_trials(experiment_id)
        verdict = _verdict(storage, experiment_id, spec)
    finally:
        runner.close()
        storage.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{database}{suffix}").unlink(missing_ok=True)
    return repetition_figures(index, plan.seeds(index), trials, spec, verdict)


def _verdict(storage, experiment_id: int, spec):
    return stored_verdict(storage, experiment_id, spec) if spec.compare else None


def repetition_figures(index: int, seeds: tuple[int, int], trials, spec, verdict) -> Repetition:
    """A repetition's figures from its stored trials (see the module docstring)."""
    gpus = spec.resources.gpus_per_trial
    hit = first_hit(trials, gpus)
    cost = experiment_cost(trials, spec.budget.max_parallel, gpus)
    if cost is None:
        raise HpoError(f"{spec.source}: repetition {index} ended without a finished trial; `hpo run` it to see why")
    return Repetition(
        index, *seeds, hit[0] if hit else None, hit[1] if hit else None, cost.gpu_hours, cost.wall_hours,
        cost.idle_fraction, verdict.outcome.value if verdict else "", verdict.winner if verdict else None,
        sum(t.kind is TrialKind.TUNING for t in trials), sum(t.kind is TrialKind.CONFIRMATION for t in trials),
    )  # fmt: skip


def first_hit(trials, gpus_per_slot: int) -> tuple[float, float] | None:
    """(GPU-hours, wall-clock hours) until the first trial that reached the target ended; None: none did."""
    started = [t for t in trials if t.started_at is not None]
    hits = [t.finished_at for t in started if t.samples_to_target is not None and t.finished_at is not None]
    if not hits:
        return None
    moment, start = min(hits), min(t.created_at for t in started)
    busy_s = sum(max((min(t.finished_at or moment, moment) - t.started_at).total_seconds(), 0.0) for t in started)
    return busy_s * gpus_per_slot / 3600, (moment - start).total_seconds() / 3600


def without_progress_series(table: Path, out: Path) -> Path:
    """A copy of the table whose runs have no training-loss and noise-scale series (see the module docstring)."""
    lines = []
    for text in Path(table).read_text().splitlines():
        if text.strip():
            record = json.loads(text)
            if record.get("kind") == "run":
                record["loss"], record["noise_scale"] = [], []
            lines.append(json.dumps(record))
    out.write_text("\n".join(lines) + "\n")
    return out


# ------------------------------------------------------------------------------------------------ the summary
def percentile_range(values: Sequence[float | None], level: float = LEVEL) -> tuple[float, float, float]:
    """(median, low, high): the median and the central `level` range of `values` (the (1 - level) / 2 and
    (1 + level) / 2 quantiles, interpolated linearly as numpy's default); None counts as never (infinite)."""
    ordered = sorted(math.inf if v is None else v for v in values)
    if not ordered:
        raise ValueError("no values")
    tail = (1 - level) / 2
    return _quantile(ordered, 0.5), _quantile(ordered, tail), _quantile(ordered, 1 - tail)


def _quantile(ordered: list[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    low, high = ordered[below], ordered[min(below + 1, len(ordered) - 1)]
    fraction = position - below
    if fraction == 0 or low == high:
        return low
    return math.inf if math.isinf(high) else low + (high - low) * fraction


def share_interval(count: int, total: int, level: float = LEVEL) -> tuple[float, float]:
    """The Wilson score interval of the share count / total (scipy's binomtest)."""
    interval = binomtest(count, total).proportion_ci(confidence_level=level, method="wilson")
    return float(interval.low), float(interval.high)


def outcome_counts(plan: Plan, repetitions: Sequence[Repetition]) -> dict[str, int]:
    """How many repetitions ended in each outcome: `winner ARM` for every arm, `equivalent`, `not yet`."""
    counts = {f"winner {arm}": 0 for arm in arm_labels(plan.spec)} | {"equivalent": 0, "not yet": 0}
    for r in repetitions:
        counts[f"winner {r.winner}" if r.outcome == "winner" else r.outcome] += 1
    return counts


def forecast_lines(plan: Plan, repetitions: Sequence[Repetition], seconds: float | None = None,
                   pilot: str | None = None) -> list[str]:  # fmt: skip
    """What `hpo plan` prints: the set-up, the cost figures with their ranges, the outcomes with their intervals
    (`pilot`: the experiment --like read from the user's database)."""
    spec, n = plan.spec, len(repetitions)
    lines = _setup_lines(plan, n, pilot)
    lines += ["", f"{'':<{WIDTH}}{'median':>10}   range of 95 % of the repetitions (2.5th to 97.5th percentile)"]
    end = "to the verdict (the experiment's end)" if spec.compare else "to the experiment's end"
    rows = [
        ("to the first target-reaching configuration", None, ""),
        ("  GPU-hours", [r.first_hit_gpu_h for r in repetitions], "{:,.1f}"),
        ("  wall-clock", [r.first_hit_wall_h for r in repetitions], "{:,.2f} h"),
        (end, None, ""),
        ("  GPU-hours", [r.answer_gpu_h for r in repetitions], "{:,.1f}"),
        ("  wall-clock", [r.answer_wall_h for r in repetitions], "{:,.2f} h"),
        ("idle slot-time (of slots x wall-clock)", [r.idle_fraction for r in repetitions], "{:.1%}"),
        ("confirmation runs", [r.confirmation_runs for r in repetitions], "{:,.0f}"),
    ]
    lines += [label if values is None else _figure_line(label, values, fmt) for label, values, fmt in rows]
    misses = sum(r.first_hit_wall_h is None for r in repetitions)
    if misses:
        lines.append(f"({misses} of {n} repetitions had no trial that reached the target: counted as never)")
    if spec.compare:
        lines += ["", f"outcome (of {_repetitions(n)}; 95 % Wilson interval of the share)"]
        for outcome, count in outcome_counts(plan, repetitions).items():
            low, high = share_interval(count, n)
            lines.append(f"  {outcome:<{WIDTH - 2}}{count:>4} {count / n:>6.0%}   {low:.0%} to {high:.0%}")
    else:
        lines += ["", "no compare arms: no verdict, only the cost"]
    if seconds is not None:
        lines += ["", f"planned in {seconds:,.0f} s ({seconds / max(n, 1):,.1f} s a repetition on this machine)"]
    return lines


WIDTH = 44  # the label column of the summary


def _figure_line(label: str, values: Sequence[float | None], fmt: str) -> str:
    median, low, high = percentile_range(values)

    def shown(v: float) -> str:
        return "never" if math.isinf(v) else fmt.format(v)

    return f"{label:<{WIDTH}}{shown(median):>10}   {shown(low)} to {shown(high)}"


def _setup_lines(plan: Plan, n: int, pilot: str | None = None) -> list[str]:
    spec = plan.spec
    simulation, slots, gpus = spec.runner.simulation, spec.budget.max_parallel, spec.resources.gpus_per_trial
    rate = (f"{simulation.samples_per_s:,.0f} samples/s a GPU (samples_per_s)" if simulation.samples_per_s else
            f"{simulation.gpu.upper()}, {simulation.gpu_samples_per_s:,.0f} samples/s a GPU")  # fmt: skip
    tuner_seed, training_seed = plan.seeds(0)
    confirm = spec.budget.confirm_seeds
    confirm = f"auto (at most {spec.budget.most_confirm_seeds} per arm)" if confirm == "auto" else confirm
    lines = [
        f"plan of {spec.name} ({plan.source}): {_repetitions(n)} on the simulated runner; no training happens, every "
        "figure is simulated",
        f"  cluster: {slots} slot(s) of {gpus} GPU(s), {rate}; 1 table sample = {simulation.sample_scale:g} "
        "samples (the simulated runner's duration model: a conversion, not a measurement)",
        f"  learning curves: {plan.table}" + _table_data(plan.table),
        f"  each: {spec.budget.trials} trials, tuner {spec.tuner.name}, confirm_seeds {confirm}; repetition r: "
        f"tuner seed {tuner_seed} + r, training seed {training_seed} + {SEED_STRIDE} r",
        "  each repetition ran in a temporary database, deleted after; your database was "
        + (f"only read (the pilot {pilot}, below)" if pilot else "not opened"),
    ]
    if plan.moved:
        lines.insert(1, f"  {plan.source} is a real experiment ({plan.moved}): planned on the simulated runner over "
                        "the default learning-curve table, which covers its space")  # fmt: skip
    return lines


def _table_data(table: Path) -> str:

    digest = load_table(table).meta.get("data_sha256")
    return f" (data sha256 {str(digest)[:12]})" if digest else ""


def _repetitions(n: int) -> str:
    return f"{n} repetition" + ("" if n == 1 else "s")


# ------------------------------------------------------------------------------------------------ the verdict's chances
@dataclass(frozen=True)
class ArmSpread:
    """How one arm's confirmation runs are drawn: ln samples to target ~ Normal(log_mean, log_sd), each run a miss
    (censored at max_samples, as the verdict counts one) with probability 1 - hit_rate."""

    label: str
    log_mean: float
    log_sd: float
    hit_rate: float = 1.0
    max_samples: int | None = None  # a miss's sample budget (None: every run reaches the target)
    resolution: float = 0.0  # the verdict's spread floor for such runs (hpo.verdict.ArmRuns.resolution)

    @property
    def cv(self) -> float:
        """The coefficient of variation of samples to target under this log-normal law."""
        return math.sqrt(math.expm1(self.log_sd**2))


@dataclass(frozen=True)
class Evidence:
    """Every arm's spread, taken as the truth, and where it came from."""

    arms: tuple[ArmSpread, ...]
    source: tuple[str, ...]  # the lines that say so

    @property
    def better(self) -> str | None:
        """The truly better arm: the lowest geometric mean samples to target (None: all arms tie exactly)."""
        best = min(self.arms, key=lambda a: a.log_mean)
        return None if all(a.log_mean == best.log_mean for a in self.arms) else best.label

    def within(self, margin: float) -> bool:
        """The truth is "equivalent within ±margin": every pair's true ratio, in the verdict's order, lies inside."""
        return all(1 - margin < math.exp(a.log_mean - b.log_mean) < 1 + margin
                   for i, a in enumerate(self.arms) for b in self.arms[i + 1 :])  # fmt: skip


@dataclass(frozen=True)
class Confirmations:
    """A confirmation budget: a fixed k (one look), or auto with a cap (a look after each round)."""

    k: int | None  # confirm_seeds: k; None: auto
    cap: int | None = None  # auto's max_confirm_seeds

    @property
    def rounds(self) -> tuple[int, ...]:
        budget = Budget(trials=2, confirm_seeds=self.k if self.k is not None else "auto", max_confirm_seeds=self.cap)
        return budget.confirmation_rounds

    def __str__(self) -> str:
        if self.k is not None:
            return f"confirm_seeds: {self.k}"
        return f"confirm_seeds: auto, max_confirm_seeds: {self.cap}"


@dataclass(frozen=True)
class Chances:
    """The verdict's outcomes over drawn experiments with one confirmation budget."""

    choice: Confirmations
    draws: int
    right_winner: int  # the truly better arm named
    wrong_winner: int  # another arm named (at a true tie: any arm)
    equivalent: int
    not_yet: int
    runs: int  # confirmation runs per arm used, summed over the draws
    within: bool  # the truth is within the margin: "equivalent" is a right answer

    @property
    def right(self) -> int:
        return self.right_winner + (self.equivalent if self.within else 0)

    @property
    def power(self) -> float:
        """The chance of a right answer."""
        return self.right / self.draws

    @property
    def wrong(self) -> int:
        """Wrong answers: another arm named, or "equivalent" where the truth is not within the margin."""
        return self.wrong_winner + (0 if self.within else self.equivalent)

    @property
    def runs_per_arm(self) -> float:
        return self.runs / self.draws


def file_confirmations(spec) -> Confirmations | None:
    """The file's confirmation budget (None: confirm_seeds 0, no verdict)."""
    budget = spec.budget
    if budget.sequential:
        return Confirmations(None, budget.most_confirm_seeds)
    return Confirmations(budget.confirm_seeds) if budget.confirm_seeds else None


def stated_evidence(labels: Sequence[str], cv: float, difference: float) -> Evidence:
    """Every arm log-normal at this coefficient of variation, the first arm's samples (1 - difference) x the others'
    (the ratio of geometric means, as bench/verdict_power.py states it), every run a hit."""
    if len(labels) < 2:
        raise PlanError("a stated spread needs an experiment with compare arms: the verdict compares arms")
    sigma = math.sqrt(math.log1p(cv * cv))
    base = math.log(STATED_SAMPLES) - sigma * sigma / 2
    arms = tuple(ArmSpread(label, base + (math.log1p(-difference) if i == 0 else 0.0), sigma)
                 for i, label in enumerate(labels))  # fmt: skip
    truth = ("the tie: every arm needs the same samples" if difference == 0 else
             f"{labels[0]} needs {difference:.1%} fewer samples than {' and '.join(labels[1:])}")  # fmt: skip
    return Evidence(arms, (f"a stated spread: samples to target log-normal with a CV of {cv:.1%} in every arm, every "
                           f"run reaching the target; the truth: {truth}",))  # fmt: skip


STATED_SAMPLES = 10_000  # a stated spread's slower arms' mean samples to target (the verdict is free of scale)


def pilot_evidence(storage, name: str, labels: Sequence[str]) -> Evidence:
    """The spread of experiment `name` (read only): per arm, ln samples to target of its best configuration's
    confirmation runs, plus its best tuning run when it has fewer than 2, interpolated between evaluations as the
    verdict reads them; its hit rate; the floor of one evaluation interval where the verdict would apply it.
    `PilotError` when an arm has fewer than 2 runs that reached the target, or the arms are not the file's."""
    record = storage.get_experiment_by_name(name)
    spec = spec_from_stored(record)
    pilot_labels = arm_labels(spec)
    if sorted(pilot_labels) != sorted(labels):
        raise PilotError(f"--like {name}: it compares {_names(pilot_labels)}, the file {_names(labels)}: a pilot "
                         "must have the file's arms (the same compare keys and values)")  # fmt: skip
    trials = storage.list_trials(record.id)
    best = storage.best_per_arm(record.id)
    runs = {r.label: r for r in arm_runs(spec, best, trials, stored_curves(storage, trials))}
    arms, pilot_runs = [], {}
    lines = [f"the spread of experiment {name} in your database (read only), taken as the truth:"]
    for label in labels:
        values, origin = _pilot_values(storage, spec, runs[label], best.get(label))
        hits = [v for v in values if v is not None]
        if len(hits) < 2:
            raise PilotError(_too_little(name, label, len(values), len(hits)))
        logs = [math.log(v) for v in hits]
        floor = runs[label].resolution / math.sqrt(12) / math.exp(statistics.fmean(logs))  # hpo.verdict's floor
        arm = ArmSpread(label, statistics.fmean(logs), max(statistics.stdev(logs), floor), len(hits) / len(values),
                        runs[label].max_samples, runs[label].resolution)  # fmt: skip
        arms.append(arm)
        pilot_runs[label] = ArmRuns(label, tuple(values), runs[label].max_samples, runs[label].resolution)
        lines.append(f"  {label}: {len(hits)} of {len(values)} {origin} reached the target; samples to target "
                     f"geometric mean {math.exp(arm.log_mean):,.0f}, CV {arm.cv:.1%} (sd of ln "
                     f"{arm.log_sd:.3f})")  # fmt: skip
    return Evidence(tuple(arms), tuple(lines + _pilot_truth(arms, pilot_runs)))


def _pilot_truth(arms: Sequence[ArmSpread], runs: dict[str, ArmRuns]) -> list[str]:
    """The pilot's difference, taken as the truth, with its own 95 % interval (hpo.verdict.compare): how sure it is."""
    top = min(arms, key=lambda a: a.log_mean)
    rest = [a for a in arms if a.log_mean != top.log_mean]
    if not rest:
        return ["  the truth: the arms tie exactly"]
    parts = []
    for arm in rest:
        c = compare(runs[top.label], runs[arm.label], ALPHA)
        parts.append(f"{-math.expm1(top.log_mean - arm.log_mean):.1%} fewer than {arm.label} (the pilot's 95 % "
                     f"interval: {1 - c.high:.1%} to {1 - c.low:.1%} fewer)")  # fmt: skip
    caveat = "  (the chances below hold where the truth is the pilot's estimate; a short pilot's is uncertain)"
    return [f"  the truth: {top.label} needs {'; '.join(parts)}", caveat]


class PilotError(PlanError):
    """An experiment `--like` cannot take a spread from (too few runs that reached the target, other arms)."""


def _pilot_values(storage, spec, runs: ArmRuns, top) -> tuple[list[float | None], str]:
    """An arm's runs: its confirmation runs, and its best tuning run when there are fewer than 2 and it hit."""
    values = list(runs.samples_to_target)
    if len(values) >= 2 or top is None or top.state is not TrialState.COMPLETED or top.samples_to_target is None:
        return values, "confirmation runs"
    target = trial_config(spec, top.params).eval.target_mlm_accuracy
    curve = [(m.samples, m.value) for m in storage.get_metrics(top.id, "mlm_accuracy") if m.samples is not None]
    tuning = samples_between_evaluations(curve, target, top.samples_to_target)
    return [*values, tuning], "runs (its best tuning run too)"


def _too_little(name: str, label: str, runs: int, hits: int) -> str:
    return (f"--like {name}: too little evidence for a spread: arm {label} has {hits} run(s) that reached the target "
            f"of {runs} (its best configuration's confirmation runs, and its best tuning run when there are fewer "
            "than 2); a spread needs at least 2 per arm. Run the pilot with `budget.confirm_seeds: 3` or more, or "
            "state a spread with --cv and --difference")  # fmt: skip


def _names(labels: Sequence[str]) -> str:
    return " and ".join(labels) if labels else "no arms"


def confirmation_verdict(arms: Sequence[ArmRuns], rounds: Sequence[int], margin: float) -> tuple[Verdict, int]:
    """The verdict the service reaches over these runs (each arm's runs in the order they would finish): look j
    of J over the first rounds[j - 1] runs, stopping at an answer or where more runs would not decide (the rule of
    `hpo.confirmations.runs_to_queue`); (that verdict, the runs per arm it used)."""
    for look, n in enumerate(rounds, 1):
        verdict = decide([replace(a, samples_to_target=a.samples_to_target[:n]) for a in arms], margin, look,
                         len(rounds))  # fmt: skip
        if verdict.outcome is not Outcome.NOT_YET or verdict.runs_needed is None:
            return verdict, n
    return verdict, rounds[-1]


def verdict_chances(evidence: Evidence, margin: float, choice: Confirmations, draws: int, seed: int = 0) -> Chances:
    """The verdict's outcomes over `draws` experiments whose confirmation runs are drawn from `evidence`, each
    asked of `hpo.verdict.decide` as the service asks it under `choice`. Seeded by (seed, choice): the same
    arguments give the same counts."""
    rounds = choice.rounds
    rng = np.random.default_rng([seed, 0 if choice.k is not None else 1, rounds[-1]])
    columns = [_draw_runs(rng, arm, draws, rounds[-1]) for arm in evidence.arms]
    better, counts, runs = evidence.better, dict.fromkeys(("right", "wrong", "equivalent", "not yet"), 0), 0
    for d in range(draws):
        arms = [ArmRuns(a.label, column[d], a.max_samples, a.resolution)
                for a, column in zip(evidence.arms, columns, strict=True)]  # fmt: skip
        verdict, used = confirmation_verdict(arms, rounds, margin)
        runs += used
        if verdict.outcome is Outcome.WINNER:
            counts["right" if verdict.winner == better else "wrong"] += 1
        else:
            counts[verdict.outcome.value] += 1
    t_quantile.cache_clear()  # continuous degrees of freedom rarely repeat: do not keep thousands of quantiles
    return Chances(choice, draws, counts["right"], counts["wrong"], counts["equivalent"], counts["not yet"], runs,
                   evidence.within(margin))  # fmt: skip


def _draw_runs(rng: np.random.Generator, arm: ArmSpread, draws: int, n: int) -> list[tuple[float | None, ...]]:
    """`draws` rows of n runs of one arm: samples to target, None for a miss."""
    samples = np.exp(rng.normal(arm.log_mean, arm.log_sd, (draws, n)))
    hits = rng.random((draws, n)) < arm.hit_rate
    return [tuple(float(s) if hit else None for s, hit in zip(row, hit_row, strict=True))
            for row, hit_row in zip(samples, hits, strict=True)]  # fmt: skip


ADVICE_FIXED = tuple(range(2, 13))  # confirm_seeds: k searched for --power
ADVICE_CAPS = (6, 9, 12)  # confirm_seeds: auto with these max_confirm_seeds
DRAWS = 2000  # drawn experiments a confirmation budget (one standard error of an 80 % chance: 0.9 points)


@dataclass(frozen=True)
class Advice:
    """For a wanted chance of a right answer: the fixed k searched upwards until one reaches it, and auto's caps."""

    power: float
    fixed: tuple[Chances, ...]
    auto: tuple[Chances, ...]

    @property
    def fewest_fixed(self) -> Chances | None:
        return next((c for c in self.fixed if c.power >= self.power), None)

    @property
    def smallest_cap(self) -> Chances | None:
        return next((c for c in self.auto if c.power >= self.power), None)


def advise(evidence: Evidence, margin: float, power: float, draws: int, seed: int = 0,
           known: Sequence[Chances] = ()) -> Advice:  # fmt: skip
    """The fewest fixed confirmation runs per arm (2 to 12) whose chance of a right answer reaches `power`, and
    auto at caps 6, 9 and 12 (`known`: chances already computed, reused where their budget is searched)."""
    done = {c.choice: c for c in known if c.draws == draws}

    def chances(choice: Confirmations) -> Chances:
        return done.get(choice) or verdict_chances(evidence, margin, choice, draws, seed)

    fixed = []
    for k in ADVICE_FIXED:
        fixed.append(chances(Confirmations(k)))
        if fixed[-1].power >= power:
            break
    auto = tuple(chances(Confirmations(None, cap)) for cap in ADVICE_CAPS)
    return Advice(power, tuple(fixed), auto)


def chances_forecast(spec, evidence: Evidence, draws: int = DRAWS, power: float | None = None,
                     seed: int = 0) -> list[str]:  # fmt: skip
    """The verdict's chances with the file's confirmation budget and, for a wanted `power`, the advice: printed."""
    margin, choice = spec.verdict.margin, file_confirmations(spec)
    mine = verdict_chances(evidence, margin, choice, draws, seed) if choice else None
    advice = advise(evidence, margin, power, draws, seed, [mine] if mine else []) if power else None
    return chances_lines(evidence, spec, mine, advice, draws, seed)


def chances_lines(evidence: Evidence, spec, mine: Chances | None, advice: Advice | None, draws: int,
                  seed: int = 0) -> list[str]:  # fmt: skip
    """What `hpo plan --cv/--like` prints: where the spread comes from, the verdict's chances with the file's
    confirmation budget, and with --power the advice table."""
    margin = spec.verdict.margin
    lines = [f"the verdict's chances: {draws:,} drawn experiments a confirmation budget (seed {seed}), each arm's "
             "confirmation runs drawn log-normally from the spread below and judged by the verdict itself "
             f"(hpo.verdict.decide, margin ±{margin:.0%}) as `hpo run` asks it; no training, no simulated "
             "cluster"]  # fmt: skip
    lines += [f"  {line}" if not line.startswith("  ") else line for line in evidence.source]
    if mine is None:
        lines += ["", "this file has no confirmation runs (budget.confirm_seeds: 0): its verdict has no evidence"]
    else:
        lines += ["", f"outcome with this file's {_budget_words(mine.choice)} (of {draws:,} draws; 95 % Wilson "
                      "interval of the share)"]  # fmt: skip
        lines += [_share_line(label, count, draws) for label, count in _outcome_rows(evidence, mine, margin)]
        lines.append(f"  {'confirmation runs per arm (mean)':<{WIDTH - 2}}{mine.runs_per_arm:>11.1f}")
    if advice is not None:
        lines += [""] + advice_lines(advice, len(evidence.arms))
    return lines


def _budget_words(choice: Confirmations) -> str:
    if choice.k is not None:
        return f"confirm_seeds: {choice.k} (one look)"
    return f"confirm_seeds: auto (looks after {', '.join(map(str, choice.rounds))} runs per arm)"


def _outcome_rows(evidence: Evidence, chances: Chances, margin: float) -> list[tuple[str, int]]:
    better = evidence.better
    equivalent = f"equivalent within ±{margin:.0%}" + (" (right)" if chances.within else " (wrong)")
    rows = [(f"right: {better} named", chances.right_winner)] if better else []
    rows += [("wrong: another arm named" if better else "wrong: an arm named", chances.wrong_winner),
             (equivalent, chances.equivalent), ("not yet", chances.not_yet),
             ("a right answer", chances.right)]  # fmt: skip
    return rows


def _share_line(label: str, count: int, total: int) -> str:
    low, high = share_interval(count, total)
    return f"  {label:<{WIDTH - 2}}{count:>5} {count / total:>6.1%}   {low:.1%} to {high:.1%}"


def advice_lines(advice: Advice, arms: int) -> list[str]:
    """The --power table: each searched budget's chance of a right answer and its cost, and the advice to copy."""
    wanted = f"{advice.power:.0%}"
    lines = [f"advice for a right answer in at least {wanted} of experiments: fixed confirm_seeds searched from 2 up "
             f"to the first that reaches it, and auto at max_confirm_seeds {', '.join(map(str, ADVICE_CAPS))}",
             f"  {'under budget: in the experiment file':<{WIDTH}}{'right':>7}{'not yet':>9}{'wrong':>7}"
             f"{'runs per arm':>14}{'runs in all':>13}"]  # fmt: skip
    for c in (*advice.fixed, *advice.auto):
        mark = f"  reaches {wanted}" if c.power >= advice.power else ""
        lines.append(f"  {str(c.choice):<{WIDTH}}{c.power:>7.1%}{c.not_yet / c.draws:>9.1%}{c.wrong / c.draws:>7.1%}"
                     f"{c.runs_per_arm:>14.1f}{c.runs_per_arm * arms:>13.1f}{mark}")  # fmt: skip
    fixed, auto = advice.fewest_fixed, advice.smallest_cap
    if fixed:
        k = fixed.choice.k
        lines.append(f"fewest fixed: confirm_seeds: {k}  ({k} runs per arm, {k * arms} confirmation runs in all; a "
                     f"right answer in {fixed.power:.1%})")  # fmt: skip
    else:
        lines.append(f"no fixed confirm_seeds up to {ADVICE_FIXED[-1]} reaches {wanted} (at {ADVICE_FIXED[-1]}: "
                     f"{advice.fixed[-1].power:.1%}): the spread is too wide for the difference; more tuning, a "
                     "larger margin, or accepting a lower chance")  # fmt: skip
    if auto:
        lines.append(f"smallest auto cap: confirm_seeds: auto + max_confirm_seeds: {auto.choice.cap}  "
                     f"({auto.runs_per_arm:.1f} runs per arm on average, at most {auto.choice.cap}; a right answer "
                     f"in {auto.power:.1%})")  # fmt: skip
    else:
        lines.append(f"no auto cap up to {ADVICE_CAPS[-1]} reaches {wanted}")
    return lines
