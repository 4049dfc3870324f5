"""`hpo plan`: what an experiment will cost and how likely it ends with an answer, before it spends anything.

    plan = prepare_plan("search_spaces/presets/adam_vs_lamb_simulated.yaml", PlanOptions(repetitions=20))
    repetitions = run_plan(plan)                       # R simulated experiments, each in a temporary database
    print("\\n".join(forecast_lines(plan, repetitions)))
    evidence = stated_evidence(arm_labels(plan.spec), cv=0.05, difference=0.10)   # or pilot_evidence(storage, ...)
    print("\\n".join(chances_lines(chances_forecast(plan.spec, evidence, power=0.8))))   # the chances, the advice

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
- the outcome: the verdict's winner, equivalent, or not yet (`hpo.evidence.verdict`); in a batch-size study also
  the verdict at each batch size (`Evidence.batch_verdicts`, the study's question, which its confirmation rounds
  follow), judged against the truth there (`hpo.plan.truth.batch_truths`).

Summaries over the R repetitions: the median and the 2.5th to 97.5th percentile (linear interpolation, numpy's
default), the range 95 % of such experiments fall in (a repetition without a hit counts as never); each outcome's
share with its 95 % Wilson interval (scipy).

Speed: the repetitions read a copy of the table without its training-loss and noise-scale series
(`without_progress_series`): the runner writes every point of them as a record, most of its time, and they change
no duration, objective or decision.

The verdict's chances from a spread (`--cv`, `--difference`, `--like`, `--power`) are in `hpo.plan.chances`.
"""

from __future__ import annotations

import copy
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scipy.stats import binomtest

from hpo.engine.study import Study
from hpo.errors import HpoError
from hpo.evidence.confirmations import stored_evidence
from hpo.experiment import experiment_from_dict, load_experiment, stored_form
from hpo.experiment.arms import BATCH_STUDY_NOTE, arm_labels, batch_study
from hpo.experiment.checks import SEED_LIMIT, TUNER_SEED_LIMIT
from hpo.experiment.schema import SEEDLESS_TUNERS
from hpo.plan.combined import covering_table, sources_line
from hpo.plan.proxy import simulated_resources, table_proxy
from hpo.plan.truth import JUDGED, Truth, batch_truths, stated_handicap, table_truth
from hpo.runners import build_runner
from hpo.simulation.cost import experiment_cost
from hpo.simulation.table import DIMENSIONS, TABLES, load_table
from hpo.storage import SqlStorage
from hpo.trials import TrialKind
from search_spaces import preset_path
from trainer import CURVES_REVISION
from trainer.config import config_from_dict

DEFAULT_TABLE = TABLES / "curves.jsonl"
SEED_STRIDE = 1000  # training seeds between repetitions: more than any arm's confirmation runs
LEVEL = 0.95
SIMULATED_PRESET = "adam_vs_lamb_simulated"  # the example of a file on the simulated runner, named in errors


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
    difference: float | None = None  # a stated true difference (hpo.plan.truth); None: the table's own truth
    trials: int | None = None  # budget.trials: the tuning trials of all arms together (the trials advice)
    table: str | None = None  # a curve table to plan over instead of the file's (a pilot's curves: `--like`)
    max_confirm_seeds: int | None = None  # budget.max_confirm_seeds (confirm_seeds: auto): the trials advice's caps


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
    truth: Truth | None = None  # what the outcomes are judged against; None without compare arms
    assumptions: tuple[str, ...] = ()  # how a real file the table cannot serve as it is was moved onto it
    on_cpus: bool = False  # the file's trials train on CPUs (resources.gpus: none); its slots are timed as GPUs
    limits_left_out: tuple[str, ...] = ()  # a real CPU file's time limits, left out (`cpu_time_limits`)
    # a batch-size study: the truth at each batch size where two or more optimizers are compared (the verdict there)
    batch_truths: dict[int, Truth] = field(default_factory=dict)

    def seeds(self, index: int) -> tuple[int, int]:
        """(tuner seed, training seed) of repetition `index` (a tuner that draws nothing keeps the file's seed)."""
        tuner, training = repetition_seeds(self.file_seeds, self.options.seed + index)
        return (self.file_seeds[0] if self.spec.tuner.name in SEEDLESS_TUNERS else tuner), training


def check_repetition_seeds(file_seeds: tuple[int, int], options: PlanOptions, confirmations: int) -> None:
    """HpoError naming --seed, before any repetition runs, when the last repetition's seeds (its tuner seed, its
    training seed and the confirmation runs' after it) pass what a tuner or the database takes."""
    tuner, training = repetition_seeds(file_seeds, options.seed + options.repetitions - 1)
    if tuner < TUNER_SEED_LIMIT and training + confirmations <= SEED_LIMIT:
        return
    room = min((TUNER_SEED_LIMIT - 1 - file_seeds[0]), (SEED_LIMIT - confirmations - file_seeds[1]) // SEED_STRIDE)
    largest = room - options.repetitions + 1
    fix = (f"give --seed {largest} or less" if largest >= 0 else
           f"give --seed 0 and at most {room + 1} --repetitions")  # fmt: skip
    raise HpoError(f"--seed {options.seed}: repetition r trains with seed {file_seeds[1]} + {SEED_STRIDE} x (SEED + "
                   f"r) and tunes with seed {file_seeds[0]} + SEED + r, and the last of {options.repetitions} would "
                   f"pass what the database or the tuner takes: {fix}")  # fmt: skip


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
    # a batch-size study: the verdict at each batch size where two or more optimizers ran (batch, outcome, winner)
    at_batches: tuple[tuple[int, str, str | None], ...] = ()


# ------------------------------------------------------------------------------------------------ the file
def prepare_plan(path: str, options: PlanOptions) -> Plan:
    """The experiment file on the simulated runner, checked as `hpo run` checks it (the same errors for a bad file,
    and the table must serve every trial); nothing is written."""
    spec = load_experiment(path)  # a bad file: the errors `hpo run` gives
    data = spec.self_contained()
    moved = None if spec.runner.name == "simulated" else f"runner {spec.runner.name}, engine {spec.engine}"
    if moved:
        data = _on_simulated(data, DEFAULT_TABLE)
    data = _with_options(_cpu_time_limits_out(data, spec) if moved else data, options)
    seeds = (spec.tuner.seed, config_from_dict(spec.resolved_base()).seed)
    check_repetition_seeds(seeds, options, max(spec.budget.most_confirm_seeds, options.max_confirm_seeds or 0))
    assumptions: list[str] = []
    try:
        first = _repetition_spec(data, path, repetition_seeds(seeds, options.seed))
        runner = build_runner(first)  # reads the table and checks that it covers every trial the file can propose
    except HpoError as e:
        if not moved:
            raise
        data, assumptions = _on_a_table(spec, options, e)  # the file's shape on the table, its moves stated
        data = _cpu_time_limits_out(data, spec)
        first = _repetition_spec(data, path, repetition_seeds(seeds, options.seed))
        runner = build_runner(first)
    truth = None
    if options.difference is not None:
        data["runner"]["simulation"]["handicaps"] = stated_handicap(runner, first, options.difference)
        runner.close()
        first = _repetition_spec(data, path, repetition_seeds(seeds, options.seed))
        runner = build_runner(first)
    if first.compare:
        truth = table_truth(runner, first)
        if options.difference is not None:
            (handicap,) = data["runner"]["simulation"]["handicaps"].values()
            truth = replace(truth, stated=options.difference, delay_samples=handicap["delay_samples"])
    runner.close()
    table = Path(first.runner.simulation.table)
    return Plan(
        path,
        data,
        first,
        table,
        moved,
        options,
        seeds,
        truth,
        tuple(assumptions),
        on_cpus=spec.resources.gpus == "none",
        limits_left_out=cpu_time_limits(spec) if moved else (),
        batch_truths=batch_truths(truth, first) if truth is not None and batch_study(first.compare) else {},
    )


def _on_simulated(data: dict[str, Any], table: Path) -> dict[str, Any]:
    """A real file's self-contained form on the simulated runner over `table`, as it is."""
    data = {**data, "engine": "local", "runner": {"name": "simulated", "simulation": {"table": str(table)}}}
    return {**data, "resources": simulated_resources(data["resources"])}


def cpu_time_limits(spec) -> tuple[str, ...]:
    """The time limits of a real file of CPU trials (resources.gpus: none) that a plan leaves out, as `key value`:
    budget.trial_timeout_s and the trainer's budget.max_time_s are seconds of its CPUs, and would cut every trial
    on slots timed as GPUs that a GPU takes longer on. Kept where the objective is time to target (its penalty needs
    a cap): there they hold in simulated GPU seconds."""
    if spec.resources.gpus != "none" or spec.objective.metric == "time_to_target_s":
        return ()
    limits = {"budget.trial_timeout_s": spec.budget.trial_timeout_s,
              "budget.max_time_s": config_from_dict(spec.resolved_base()).budget.max_time_s}  # fmt: skip
    return tuple(f"{key} {value:g} s" for key, value in limits.items() if value is not None)


def _cpu_time_limits_out(data: dict[str, Any], spec) -> dict[str, Any]:
    if not cpu_time_limits(spec):
        return data
    data = copy.deepcopy(data)
    data["budget"]["trial_timeout_s"] = None
    data["base_config"].setdefault("budget", {})["max_time_s"] = None  # self-contained: the overrides applied
    return data


def _with_options(data: dict[str, Any], options: PlanOptions) -> dict[str, Any]:
    data = copy.deepcopy(data)
    simulation = data["runner"]["simulation"]
    if options.slots is not None:
        data["budget"]["max_parallel"] = options.slots
    if options.gpus_per_slot is not None:
        data["resources"]["gpus_per_trial"] = options.gpus_per_slot
        if options.gpus_per_slot > 1 and data["resources"].get("gpus") == "none":
            data["resources"]["gpus"] = "all"  # a CPU file planned on slots of several (simulated) GPUs
    if options.gpu is not None:
        simulation.update(gpu=options.gpu, samples_per_s=None)
    if options.samples_per_s is not None:
        simulation["samples_per_s"] = options.samples_per_s
    if options.trials is not None:
        data["budget"]["trials"] = options.trials
    if options.table is not None:
        simulation["table"] = options.table
    if options.max_confirm_seeds is not None:
        data["budget"]["max_confirm_seeds"] = options.max_confirm_seeds
    return data


def _on_a_table(spec, options: PlanOptions, error: HpoError) -> tuple[dict[str, Any], list[str]]:
    """A real file the default table cannot serve as it is (`error`): as it is over the shipped table, or the
    shipped tables combined, that has each batch size it runs to its budget there (hpo.plan.combined); else moved
    onto the given table (`--like`'s), else the default one, else the large-batch one (more batch sizes); PlanError
    naming why not, each way, when none serves it."""
    tables = [options.table] if options.table else [DEFAULT_TABLE, TABLES / "large_batch.jsonl"]
    reasons = [f"as it is over {tables[0]}: {_unprefixed(error, spec)}"]
    if not options.table:
        try:
            covering = covering_table(spec)
        except HpoError as e:  # said first: what the file runs that no shipped table has
            reasons.insert(0, str(e))
            covering = DEFAULT_TABLE
        if covering != DEFAULT_TABLE:  # the default table alone is what `error` is about
            try:
                data = _with_options(_on_simulated(spec.self_contained(), covering), options)
                build_runner(_repetition_spec(data, spec.source, (0, 0))).close()  # the table serves the file
                return data, []
            except HpoError as e:
                over = sources_line(load_table(covering)) or covering
                reasons.append(f"as it is over {over}: {_unprefixed(e, spec)}")
    for table in tables:
        try:
            data, assumptions = table_proxy(spec, spec.self_contained(), load_table(table))
            data = _with_options(data, options)
            build_runner(_repetition_spec(data, spec.source, (0, 0))).close()  # the table serves the moved file
            return data, assumptions
        except HpoError as e:
            reasons.append(f"moved onto {table}: {_unprefixed(e, spec)}")
    raise PlanError(_not_plannable(spec, reasons))


def _unprefixed(error: HpoError, spec) -> str:
    return str(error).removeprefix(f"{spec.source}: ")


def _not_plannable(spec, reasons: list[str]) -> str:
    return (f"{spec.source}: cannot be planned: it is a real experiment (runner {spec.runner.name}, engine "
            f"{spec.engine}), and `hpo plan` runs it on the simulated runner over a learning-curve table that serves "
            f"it, as it is or with its shape moved onto the table; none does: {'; '.join(reasons)}\nA plannable file "
            f"tunes only what a table varies ({', '.join(DIMENSIONS)}) within the table's grid, with its budget and "
            "evaluations at each batch size (see the table's meta line); or copy the file with `runner: {name: "
            f"simulated, simulation: {{table: YOUR_TABLE}}}}` (the shipped preset {SIMULATED_PRESET} is one: "
            f"{preset_path(SIMULATED_PRESET)}); or forecast it from curves of your own: run a pilot of the file "
            "with eval.stop_at_target: false (a grid of learning rates and seeds) and "
            "`hpo plan FILE --like PILOT`")  # fmt: skip


def _repetition_spec(data: dict[str, Any], source: str, seeds: tuple[int, int], table: Path | None = None):
    """The validated spec of a repetition with these (tuner, training) seeds (table: the copy its trials read,
    else the data's)."""
    tuner_seed, training_seed = seeds
    data = copy.deepcopy(data)
    if data["tuner"]["name"] not in SEEDLESS_TUNERS:  # one that draws nothing takes no seed (it is refused)
        data["tuner"]["seed"] = tuner_seed
    data["overrides"] = {"seed": training_seed}
    if table is not None:
        data["runner"]["simulation"]["table"] = str(table)
    return experiment_from_dict(data, source)


# ------------------------------------------------------------------------------------------------ the runs
def run_plan(plan: Plan, progress: Callable[[int, float], None] | None = None, jobs: int = 1) -> list[Repetition]:
    """The plan's repetitions, each in a temporary database deleted when it ends, `jobs` at a time in worker
    processes (1: one after another in this process; the figures do not depend on it: each repetition has its own
    seeds and database); `progress` is called with (repetitions done, seconds elapsed) after each."""
    started = time.perf_counter()
    scratch = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # SQLite's syncs cost nothing in memory
    repetitions: list[Repetition] = []
    with tempfile.TemporaryDirectory(prefix=f"hpo-plan-{os.getpid()}-", dir=scratch) as tmp:
        directory = Path(tmp)
        table = without_progress_series(plan.table, directory / "curves.jsonl")
        indices = range(plan.options.repetitions)
        if jobs <= 1:
            done = (run_repetition(plan, r, directory, table) for r in indices)
            for repetition in done:
                repetitions.append(repetition)
                if progress:
                    progress(len(repetitions), time.perf_counter() - started)
            return repetitions
        workers = _Workers(plan, directory, table, indices, jobs)
        try:
            for repetition in workers.results():
                repetitions.append(repetition)
                if progress:
                    progress(len(repetitions), time.perf_counter() - started)
        finally:
            workers.end()  # before the directory they write in is deleted
    return sorted(repetitions, key=lambda r: r.index)


class _Workers:
    """`jobs` worker processes, forked once, that run the repetitions `indices` and send back their figures.

    Not multiprocessing's pool: it forks a worker in place of one that died (a SIGTERM to the plan's process group,
    `timeout`'s, ends them), also while the plan unwinds, and ends it with SIGTERM, which a process forked a moment
    before can lose (Python drops a signal that comes before its fork has returned): the plan then waited for that
    worker forever. These workers are never replaced; one that dies makes the plan fail naming it, and the plan ends
    those left with SIGKILL, which no process can lose or ignore."""

    def __init__(self, plan: Plan, directory: Path, table: Path, indices: range, jobs: int) -> None:
        context = multiprocessing.get_context("fork")  # the plan's objects as they are, not pickled
        self._taken = context.Value("q", 0)  # how many repetitions the workers took, one after another
        self._left = len(indices)
        self._processes, self._pipes = [], []
        for _ in range(min(jobs, len(indices))):
            reader, writer = context.Pipe(duplex=False)  # one a worker: their figures never interleave
            process = context.Process(target=_work, args=(plan, directory, table, indices, self._taken, writer),
                                      daemon=True)  # fmt: skip
            process.start()
            writer.close()  # the worker's end: the reader sees the end of the pipe once the worker is gone
            self._processes.append(process)
            self._pipes.append(reader)

    def results(self) -> Iterator[Repetition]:
        """The repetitions' figures as they end (a repetition's error is raised here)."""
        open_pipes = dict(zip(self._pipes, self._processes, strict=True))
        while self._left:
            if not open_pipes:
                raise HpoError(f"the plan's worker processes ended with {self._left} repetition(s) left")
            for pipe in multiprocessing.connection.wait(list(open_pipes)):
                try:
                    failed, value = pipe.recv()
                except EOFError:  # the worker is gone: fine once the tasks are done
                    process = open_pipes.pop(pipe)
                    process.join()
                    if process.exitcode != 0:
                        raise HpoError(f"a worker process of the plan (pid {process.pid}) ended with "
                                       f"{_ended_how(process.exitcode)}: run the plan again (with fewer --jobs if "
                                       "memory ran short)") from None  # fmt: skip
                    continue
                if failed:
                    raise value
                self._left -= 1
                yield value

    def end(self) -> None:
        for process in self._processes:
            if process.exitcode is None:
                process.kill()
        for process in self._processes:
            process.join()
        for pipe in self._pipes:
            pipe.close()


def _ended_how(exitcode: int) -> str:
    if exitcode < 0:
        return f"signal {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def _work(plan: Plan, directory: Path, table: Path, indices: range, taken, figures) -> None:
    """A worker: Ctrl-C is the plan's process to handle (it ends the workers), and SIGTERM (the plan's, or
    `timeout`'s to the process group) ends a worker at once, whatever handler the plan's process had when it forked;
    then the next repetition not taken (`taken` counts them) until none is left, each one's figures (or its error)
    sent on `figures`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        with taken.get_lock():
            if taken.value >= len(indices):
                return
            index = indices[taken.value]
            taken.value += 1
        try:
            figures.send((False, run_repetition(plan, index, directory, table)))
        except Exception as error:  # the plan's process raises it
            try:
                figures.send((True, error))
            except Exception:  # an error that does not pickle: its type and message
                figures.send((True, HpoError(f"repetition {index}: {type(error).__name__}: {error}")))
            return


def run_repetition(plan: Plan, index: int, directory: Path, table: Path) -> Repetition:
    """Repetition `index` through the study loop on the simulated runner, in its own database under `directory`
    (deleted afterwards); its figures."""
    spec = _repetition_spec(plan.data, plan.source, plan.seeds(index), table)
    database = directory / f"repetition-{index}.db"
    url, run_dir = f"sqlite:///{database}", directory / f"repetition-{index}"
    runner, storage = build_runner(spec), SqlStorage(url, upgrade=True)
    try:
        experiment_id = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
        runner.attach(storage, experiment_id)  # as `hpo run` drives it (hpo.engine.local.drive), without a display
        Study(spec, storage, experiment_id, run_dir, runner, url).run()
        trials = storage.list_trials(experiment_id)
        evidence = stored_evidence(storage, experiment_id) if spec.compare else None
        verdict = evidence.verdict(spec) if evidence is not None else None
        at_batches = _at_batches(evidence, spec)
    finally:
        runner.close()
        storage.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{database}{suffix}").unlink(missing_ok=True)
    return replace(repetition_figures(index, plan.seeds(index), trials, spec, verdict), at_batches=at_batches)


def _at_batches(evidence, spec) -> tuple[tuple[int, str, str | None], ...]:
    """A batch-size study's verdict at each batch size (`Evidence.batch_verdicts`); () for another experiment."""
    if evidence is None or not batch_study(spec.compare):
        return ()
    _, verdicts = evidence.batch_verdicts(spec)
    return tuple((batch, v.outcome.value, v.winner) for batch, v in verdicts.items())


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


def batch_counts(plan: Plan, repetitions: Sequence[Repetition]) -> dict[int, tuple[dict[str, int], dict[str, int]]]:
    """A batch-size study: per batch size with a truth (`Plan.batch_truths`), how many repetitions' verdicts there
    ended in each outcome (`winner OPTIMIZER`, `equivalent`, `not yet`) and how many were right, wrong, equivalent
    (the optimizers truly differ by more than the margin) or not yet against the truth there."""
    counts = {}
    for batch, truth in plan.batch_truths.items():
        outcomes = {f"winner {a.label}": 0 for a in truth.arms} | {"equivalent": 0, "not yet": 0}
        judged = dict.fromkeys(JUDGED, 0)
        for r in repetitions:
            outcome, winner = _at(r, batch)
            outcomes[f"winner {winner}" if outcome == "winner" else outcome] += 1
            judged[truth.judged(outcome, winner)] += 1
        counts[batch] = (outcomes, judged)
    return counts


def right_answers(plan: Plan, repetitions: Sequence[Repetition]) -> int:
    """How many repetitions gave a right answer (`hpo plan --power`'s advice counts them): the verdict's
    (`judged_counts`); in a batch-size study, the verdict at every batch size right against the truth there (the
    study's question, `batch_counts`)."""
    if plan.batch_truths:
        return sum(all(truth.judged(*_at(r, batch)) == "right" for batch, truth in plan.batch_truths.items())
                   for r in repetitions)  # fmt: skip
    return judged_counts(plan, repetitions)["right"] if plan.truth else 0


def _at(repetition: Repetition, batch: int) -> tuple[str, str | None]:
    """A repetition's verdict at one batch size: (outcome, winner); not yet where none was asked there."""
    return next(((o, w) for b, o, w in repetition.at_batches if b == batch), ("not yet", None))


def judged_counts(plan: Plan, repetitions: Sequence[Repetition]) -> dict[str, int]:
    """How many repetitions' outcomes were right, wrong, equivalent (where the arms truly differ by more than the
    verdict's margin), not yet, judged against the plan's truth (`hpo.plan.truth`)."""
    counts = dict.fromkeys(JUDGED, 0)
    for r in repetitions:
        counts[plan.truth.judged(r.outcome, r.winner)] += 1
    return counts


def _shares(counts: dict[str, int], n: int) -> dict[str, dict[str, float]]:
    """Each outcome's count, share of the n repetitions and the share's Wilson interval."""
    shares = {}
    for outcome, count in counts.items():
        low, high = share_interval(count, n)
        shares[outcome] = {"count": count, "share": count / n, "low": low, "high": high}
    return shares


def _share_line(label: str, share: dict[str, float], width: int | None = None) -> str:
    width = width or WIDTH
    return (f"  {label:<{width - 2}}{share['count']:>4} {share['share']:>6.0%}   {share['low']:.0%} to "
            f"{share['high']:.0%}")  # fmt: skip


def _label_width(labels) -> int:
    """The label column of a block of outcome lines: WIDTH, or wider where a label is longer (a batch-size study's
    arms: `winner optimizer.name=adamw,batch.global_batch_size=1024`), so the counts stay in one column."""
    return max(WIDTH, *(len(label) + 4 for label in labels))


def forecast_lines(plan: Plan, repetitions: Sequence[Repetition], seconds: float | None = None,
                   pilot: str | None = None, curves: str | None = None) -> list[str]:  # fmt: skip
    """What `hpo plan` prints: the set-up, the cost figures with their ranges, the outcomes with their intervals
    (`pilot`: the experiment --like read from the user's database; `curves`: what became of its curves)."""
    spec, n = plan.spec, len(repetitions)
    lines = _setup_lines(plan, n, pilot, curves)
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
        shares = _shares(outcome_counts(plan, repetitions), n)
        width = _label_width(shares)
        lines += [_share_line(outcome, s, width) for outcome, s in shares.items()]
        lines += ["", f"judged against the truth: {plan.truth.line()}"]
        for judged, share in _shares(judged_counts(plan, repetitions), n).items():
            differ = judged == "equivalent" and not plan.truth.within()  # "equivalent" said wrongly
            lines.append(_share_line("equivalent (the arms truly differ)" if differ else judged, share, width))
        lines += _batch_lines(plan, repetitions)
    else:
        lines += ["", "no compare arms: no verdict, only the cost"]
    if seconds is not None:
        lines += ["", f"planned in {seconds:,.0f} s ({seconds / max(n, 1):,.1f} s a repetition on this machine)"]
    return lines


def _batch_lines(plan: Plan, repetitions: Sequence[Repetition]) -> list[str]:
    """A batch-size study: the note on the experiment's verdict, and the outcomes of the verdict at each batch size
    (the study's question, which the confirmation rounds follow) with their judgement against the truth there."""
    if not plan.batch_truths:
        return []
    n, lines = len(repetitions), ["", f"({BATCH_STUDY_NOTE}, forecast below)"]
    for batch, (outcomes, judged) in batch_counts(plan, repetitions).items():
        truth = plan.batch_truths[batch]
        lines += ["", f"the verdict at batch {batch:,} (of {_repetitions(n)}; 95 % Wilson interval of the share)"]
        lines += [_share_line(outcome, s) for outcome, s in _shares(outcomes, n).items()]
        lines.append(f"judged against the truth at batch {batch:,}: {truth.line()}")
        for name, share in _shares(judged, n).items():
            differ = name == "equivalent" and not truth.within()
            lines.append(_share_line("equivalent (the arms truly differ)" if differ else name, share))
    return lines


def forecast_data(plan: Plan, repetitions: Sequence[Repetition], seconds: float | None = None,
                  pilot: str | None = None, curves: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The forecast as plain data (`hpo plan --json`, the API): each figure's median and the range of 95 % of the
    repetitions (None: never, a repetition without a hit), each outcome's count and share with its Wilson
    interval, the set-up; `simulated` is always true."""
    spec, n = plan.spec, len(repetitions)

    def figure(values: Sequence[float | None]) -> dict[str, float | None]:
        median, low, high = percentile_range(values)
        return {k: None if math.isinf(v) else v for k, v in (("median", median), ("low", low), ("high", high))}

    def truth_data(t: Truth) -> dict[str, Any]:
        return {
            "better": t.better,
            "difference": t.difference(),
            "stated": t.stated,
            "delay_samples": t.delay_samples,
            "metric": t.metric,
            "line": t.line(),
            "arms": {a.label: {"params": a.params, "objective": a.objective, "figure": a.figure} for a in t.arms},
        }

    outcomes, judged, truth = {}, {}, None
    if spec.compare:
        outcomes = _shares(outcome_counts(plan, repetitions), n)
        judged = _shares(judged_counts(plan, repetitions), n)
        truth = truth_data(plan.truth)
    at_batches = {
        batch: {"outcomes": _shares(outcomes_there, n), "judged": _shares(judged_there, n),
                "truth": truth_data(plan.batch_truths[batch])}
        for batch, (outcomes_there, judged_there) in batch_counts(plan, repetitions).items()
    }  # fmt: skip
    simulation = spec.runner.simulation
    return {
        "simulated": True,
        "experiment": spec.name,
        "source": plan.source,
        "moved": plan.moved,
        "assumptions": list(plan.assumptions),
        "repetitions": n,
        "cluster": {
            "slots": spec.budget.max_parallel,
            "gpus_per_slot": spec.resources.gpus_per_trial,
            "gpu": None if simulation.samples_per_s else simulation.gpu,
            "samples_per_s": simulation.samples_per_s or simulation.gpu_samples_per_s,
            "sample_scale": simulation.sample_scale,
            "batch_sample_scale": {str(b): v for b, v in simulation.batch_sample_scale.items()},
        },  # fmt: skip
        # a combination of the shipped tables is a temporary file, gone after the plan: the table of each batch size;
        # so is a pilot's table (`pilot_curves` says what it held)
        "table": None
        if (combined := load_table(plan.table).meta.get("combined")) or (pilot and plan.options.table)
        else str(plan.table),
        "tables_by_batch": {b: str(TABLES / name) for b, name in combined.items()} if combined else None,
        "trials": spec.budget.trials,
        "tuner": spec.tuner.name,
        "confirm_seeds": spec.budget.confirm_seeds,
        "first_hit": {
            "gpu_hours": figure([r.first_hit_gpu_h for r in repetitions]),
            "wall_hours": figure([r.first_hit_wall_h for r in repetitions]),
        },  # fmt: skip
        "answer": {
            "gpu_hours": figure([r.answer_gpu_h for r in repetitions]),
            "wall_hours": figure([r.answer_wall_h for r in repetitions]),
        },  # fmt: skip
        "idle_fraction": figure([r.idle_fraction for r in repetitions]),
        "confirmation_runs": figure([r.confirmation_runs for r in repetitions]),
        "outcomes": outcomes,
        "truth": truth,
        "judged": judged,
        "at_batches": at_batches,
        "seconds": seconds,
        "lines": forecast_lines(plan, repetitions, seconds, pilot, curves),
    }


WIDTH = 44  # the label column of the summary


def _figure_line(label: str, values: Sequence[float | None], fmt: str) -> str:
    median, low, high = percentile_range(values)

    def shown(v: float) -> str:
        return "never" if math.isinf(v) else fmt.format(v)

    return f"{label:<{WIDTH}}{shown(median):>10}   {shown(low)} to {shown(high)}"


def _setup_lines(plan: Plan, n: int, pilot: str | None = None, curves: str | None = None) -> list[str]:
    spec = plan.spec
    simulation, slots, gpus = spec.runner.simulation, spec.budget.max_parallel, spec.resources.gpus_per_trial
    rate = (f"{simulation.samples_per_s:,.0f} samples/s a GPU (samples_per_s)" if simulation.samples_per_s else
            f"{simulation.gpu.upper()}, {simulation.gpu_samples_per_s:,.0f} samples/s a GPU")  # fmt: skip
    tuner_seed, training_seed = plan.seeds(0)
    sources = sources_line(load_table(plan.table))  # a combination of the shipped tables: what each batch size reads
    confirm = spec.budget.confirm_seeds
    confirm = f"auto (at most {spec.budget.most_confirm_seeds} per arm)" if confirm == "auto" else confirm
    lines = [
        f"plan of {spec.name} ({plan.source}): {_repetitions(n)} on the simulated runner; no training happens, every "
        "figure is simulated",
        f"  cluster: {slots} slot(s) of {gpus} GPU(s), {rate}; 1 table sample = {_scales(simulation)} "
        "samples (the simulated runner's duration model: a conversion, not a measurement)",
        f"  learning curves: {curves}"
        if plan.options.table and curves
        else f"  learning curves: {sources or plan.table}" + _table_data(plan.table),
        f"  each: {spec.budget.trials} trials, tuner {spec.tuner.name}, confirm_seeds {confirm}; repetition r: "
        + ("" if spec.tuner.name in SEEDLESS_TUNERS else f"tuner seed {tuner_seed} + r, ")
        + f"training seed {training_seed} + {SEED_STRIDE} r",
        "  each repetition ran in a temporary database, deleted after; your database was "
        + (f"only read (the pilot {pilot}, below)" if pilot else "not opened"),
    ]
    if curves and not plan.options.table:
        lines.insert(3, f"  the pilot's curves: {curves}")
    if plan.moved and plan.assumptions:
        lines[1:1] = [f"  {plan.source} is a real experiment ({plan.moved}) the table cannot serve as it is: planned "
                      "on the simulated runner under these assumptions:"]  # fmt: skip
        lines[2:2] = [f"    assumption: {a}" for a in plan.assumptions]
    elif plan.moved:
        over, verb = _over(plan, sources), "cover" if sources or plan.options.table else "covers"
        lines.insert(1, f"  {plan.source} is a real experiment ({plan.moved}): planned on the simulated runner over "
                        f"{over}, which {verb} its space")  # fmt: skip
    if plan.moved and plan.on_cpus:  # its slots are timed as GPUs: said beside the hours
        at = next(i for i, line in enumerate(lines) if line.startswith("  cluster: "))
        lines.insert(at + 1, "  resources.gpus is none (its trials train on CPUs): each slot is timed as GPUs "
                             "(runner.simulation.gpu, --gpu, --samples-per-s), so the hours are a GPU cluster's, not "
                             "those of this file's CPU slots" + _time_limits_said(plan))  # fmt: skip
    return lines


def _time_limits_said(plan: Plan) -> str:
    """What became of a CPU file's time limits (`cpu_time_limits`), when it has any."""
    limits = plan.limits_left_out
    return f"; its time limits ({', '.join(limits)}) are its CPUs' seconds and are left out" if limits else ""


def _over(plan: Plan, sources: str | None) -> str:
    """The curves a real file the table covers as it is was planned over."""
    if plan.options.table:
        return "the pilot's curves"
    if sources:
        return "the shipped learning-curve tables, each batch size from one that has it to its budget there"
    return (
        "the default learning-curve table"
        if plan.table == DEFAULT_TABLE
        else f"the learning-curve table {plan.table.name}"
    )


def _table_data(table: Path) -> str:
    """The table's data digest and, when an older trainer made it, which (its curves are not today's trainer's)."""
    meta = load_table(table).meta
    digest, revision = meta.get("data_sha256"), meta.get("trainer_revision", 1)
    notes = [f"data sha256 {str(digest)[:12]}"] if digest else []
    if revision != CURVES_REVISION:
        notes.append(f"recorded by the trainer's revision {revision}: today's ({CURVES_REVISION}) gives other curves "
                     "for the same runs")  # fmt: skip
    return f" ({'; '.join(notes)})" if notes else ""


def _repetitions(n: int) -> str:
    return f"{n} repetition" + ("" if n == 1 else "s")


def _scales(simulation) -> str:
    """`256` samples a table sample, or by batch size `20.3 to 163 (by batch size)`."""
    scales = list(simulation.batch_sample_scale.values())
    if not scales:
        return f"{simulation.sample_scale:g}"
    return f"{min(scales):.3g} to {max(scales):.3g} (by batch size)"
