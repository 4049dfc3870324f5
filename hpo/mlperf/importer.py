"""Imported experiments planned and written: MLPerf runs (`plan_mlperf`) or RCP records (`plan_rcp`) become an
`ImportPlan` (a synthetic spec and one finished trial per run; pure), and `write_plan` stores it.

The package docstring (`hpo.mlperf`) says how runs are stored and why. `describe` says what an import did: per arm
its runs, how many reached the target, samples to target, and what a run cost (wall-clock from run_start to
run_stop, the system description's accelerators and their product, accelerator-hours), which the stored `imported`
entry keeps too (`cost`, shown by `hpo status`). Planning reads and checks everything: a
file that cannot be read, a logged value the trainer cannot take, or runs that disagree on the target raise before
the storage is opened. A run reaches the import's target (`--target`, else the logged one, else MLPerf BERT's 0.720)
at its first evaluation at or above it (`ResultRun.samples_to`); a run that logged run_stop success but never
evaluated at the target is a miss, and the plan's notes name it with its best accuracy. Writing adds only runs
whose content hash the experiment does not hold yet, so importing the same files twice adds nothing; an experiment
of that name that was not imported, that holds an import of other files, or that was imported with other options
(--compare, --target, the --optimizer of runs whose log names none) is refused (an imported experiment's arms,
target and configurations are fixed when it is created: import under another name).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpo.errors import HpoError, NotFoundError
from hpo.experiment import ExperimentSpec, experiment_from_dict, spec_from_stored, stored_form
from hpo.experiment.arms import arm_label, arm_of, arms, trial_config
from hpo.mlperf import HASH_KEY, IMPORTED_KEY, UNSELECTED_KEY, cost_line, imported
from hpo.mlperf.logs import CURVE_SOURCES, HYPERPARAMETERS, NAMED_HYPERPARAMETERS, ResultFileError, ResultRun
from hpo.mlperf.rcp import RcpRecord
from hpo.objective import trial_result
from hpo.storage.base import ExperimentRecord, ExperimentStatus, MetricPoint, Storage, TrialRecord
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from trainer.config import ConfigError, config_from_dict, set_dotted
from trainer.result import TrainResult, TrainStatus

MLPERF_BERT_TARGET = 0.720  # MLPerf BERT's target masked-LM accuracy (closed division)
# where an import's target came from (stored in its `imported` entry, shown by `imported_line`)
TARGET_SOURCES = {"given": "--target", "logged": "logged by the runs", "default": "MLPerf BERT's; the runs log none",
                  "some": "logged by some runs; the others name none: MLPerf BERT's"}  # fmt: skip
# --compare names -> trainer keys
COMPARE_KEYS = {
    "optimizer": "optimizer.name",
    "global_batch_size": "batch.global_batch_size",
    "batch": "batch.global_batch_size",
    "system": "log.mlperf_submission.platform",
    "submitter": "log.mlperf_submission.org",
    "clipping": "clipping.strategy",  # logged by our trainer only (opt_gradient_clipping)
}
DEFAULT_COMPARE = ("optimizer", "global_batch_size")


@dataclass(frozen=True)
class PlannedRun:
    """One run as it will be stored: a finished trial with its curve."""

    key: str  # the content hash (stored under HASH_KEY in the trial's metrics)
    source: str  # where it was read: a file, or an RCP file's record and seed
    params: dict[str, Any]
    arm: str | None
    global_batch_size: int
    seed: int | None
    kind: TrialKind
    result: TrialResult
    points: tuple[MetricPoint, ...] = ()
    started: datetime | None = None
    finished: datetime | None = None
    worker: str | None = None  # the system it ran on
    wall_clock_s: float | None = None  # run_start to run_stop
    accelerators: int | None = None  # of its system description

    @property
    def accelerator_hours(self) -> float | None:
        if self.wall_clock_s is None or self.accelerators is None:
            return None
        return self.accelerators * self.wall_clock_s / 3600


@dataclass(frozen=True)
class ImportPlan:
    kind: str  # "mlperf" or "rcp"
    name: str
    spec: ExperimentSpec
    stored: dict[str, Any]  # what the experiments table keeps (the stored form and the `imported` entry)
    runs: tuple[PlannedRun, ...]
    notes: tuple[str, ...] = ()

    @property
    def configurations(self) -> int:
        return sum(1 for r in self.runs if r.kind is TrialKind.TUNING)


@dataclass(frozen=True)
class Written:
    experiment_id: int
    added: int  # trials written now
    present: int  # runs the experiment already held (a second import of the same files)
    left: int = 0  # runs of the experiment's import that it still does not hold (it stays unfinished)
    stored_cost: dict[str, Any] | None = None  # an experiment imported before: the cost per arm it stores
    cost_differs: bool = False  # the system descriptions now give these runs another cost than the one stored
    held: int = 0  # the runs of the import that made the experiment (these files' runs where it is new)


@dataclass
class _Run:
    """A run before the spec exists: its configuration and its outcome in the trainer's vocabulary."""

    key: str
    source: str
    params: dict[str, Any]
    global_batch_size: int
    seed: int | None
    result: TrainResult
    extra: dict[str, Any]
    ended: bool = True  # it has an end (a run_stop); only such a run is its configuration's tuning trial
    budget: int = 0
    every: int | None = None
    points: tuple[MetricPoint, ...] = ()
    started: datetime | None = None
    finished: datetime | None = None
    worker: str | None = None
    notes: list[str] = field(default_factory=list)
    wall_clock_s: float | None = None
    accelerators: int | None = None


# ------------------------------------------------------------------------------------------------ MLPerf results


def compare_keys(names: Sequence[str]) -> list[str]:
    """--compare names (optimizer, global_batch_size or batch, system, submitter) as trainer keys, in order."""
    keys = []
    for name in names:
        key = COMPARE_KEYS.get(name.strip().lower())
        if key is None:
            raise HpoError(f"--compare {name!r}: compare by {', '.join(COMPARE_KEYS)}")
        if key not in keys:
            keys.append(key)
    if not keys:
        raise HpoError(f"--compare: name at least one of {', '.join(COMPARE_KEYS)}")
    return keys


def plan_mlperf(results: Sequence[ResultRun], name: str, compare: Sequence[str] = DEFAULT_COMPARE,
                target: float | None = None) -> ImportPlan:  # fmt: skip
    """The experiment of MLPerf runs (read by hpo.mlperf.logs), arms by `compare` (names, see COMPARE_KEYS);
    `target` overrides the logged target (else MLPerf BERT's 0.720)."""
    if not results:
        raise HpoError("no MLPerf result file to import")
    keys = compare_keys(compare)
    given = target
    target, source = _target(results, target)
    runs = [_mlperf_run(run, keys, target) for run in results]
    files = [str(r.path) for r in results]
    submitters = sorted({r.submitter for r in results if r.submitter})
    systems = sorted({r.system for r in results if r.system})
    description = (f"MLPerf results: {len(results)} run(s) of {_listed(submitters) or 'an unnamed submitter'} on "
                   f"{_listed(systems) or 'an unnamed system'}")  # fmt: skip
    below = _below_target(results, target, given is not None)
    return _plan("mlperf", name, description, runs, keys, (target, source), files, _common_dir(files), below)


def _below_target(results: Sequence[ResultRun], target: float, given: bool, most: int = 5) -> list[str]:
    """Notes on the runs that logged run_stop success but whose evaluations never reach the import's target (a run
    of another target: our trainer's logs do not name theirs): each is counted as not reaching it."""
    below = [r for r in results if r.reached and r.evaluations and r.samples_to(target) is None]
    whose = "--target" if given else ("the logged one" if any(r.target is not None for r in results) else
                                      "MLPerf BERT's: the logs name none")  # fmt: skip
    notes = [f"{r.path} logged run_stop success, but its best eval_accuracy {r.best_accuracy:g} is below the target "
             f"{target:g} ({whose}): counted as not reaching it; if it trained to another target, give that with "
             "--target (import under another --name)" for r in below[:most]]  # fmt: skip
    if len(below) > most:
        notes.append(f"{len(below) - most} more run(s) logged run_stop success below the target {target:g}: counted "
                     "as not reaching it")  # fmt: skip
    return notes


def _mlperf_run(run: ResultRun, keys: Sequence[str], target: float) -> _Run:
    hyperparameters, left_out = _takeable(run)
    params: dict[str, Any] = {"optimizer.name": run.optimizer, "batch.global_batch_size": run.global_batch_size,
                              **hyperparameters}  # fmt: skip
    named = (
        ("log.mlperf_submission.platform", run.system, "submission_platform (the system)"),
        ("log.mlperf_submission.org", run.submitter, "submission_org (the submitter)"),
    )
    for key, value, what in named:
        if key in keys:
            if not value:
                raise ResultFileError(f"{run.path}: no {what} event, which --compare needs")
            params[key] = value
    if "clipping.strategy" in keys and "clipping.strategy" not in params:
        raise ResultFileError(f"{run.path}: no opt_gradient_clipping event, which --compare clipping needs (this "
                              "trainer's logs name their clipping strategy; MLPerf submissions do not)")  # fmt: skip
    hit = run.samples_to(target)
    if hit is not None:
        status, reason = TrainStatus.REACHED_TARGET, None
    elif run.reached:  # success at a target of its own that the import's target is above
        status = TrainStatus.BUDGET_EXHAUSTED
        reason = (f"run_stop status success, but its best eval_accuracy {run.best_accuracy:g} is below the target "
                  f"{target:g}: the target was not reached ({run.samples:,} samples trained)")  # fmt: skip
    elif run.status is not None:
        status = TrainStatus.BUDGET_EXHAUSTED
        reason = f"run_stop status {run.status}: the target was not reached ({run.samples:,} samples trained)"
    else:
        status, reason = TrainStatus.FAILED, f"unfinished: the log ends without run_stop (line {run.lines})"
    start, stop = run.run_start_ms, run.run_stop_ms if run.run_stop_ms is not None else run.last_ms
    seconds = (stop - start) / 1000 if start is not None and stop is not None else 0.0
    notes = left_out + _run_notes(run)
    if hit is not None and hit < run.samples:
        notes.append("trained on past the target (train_samples at its run_stop is the samples at its end): samples "
                     "to target is its first evaluation at or above the target")  # fmt: skip
    result = TrainResult(
        status=status,
        reason=reason,
        samples=run.samples,
        steps=run.samples // run.global_batch_size,
        samples_to_target=hit,
        time_to_target_s=_time_to(run, target) if hit is not None else None,
        best_mlm_accuracy=run.best_accuracy,
        final_mlm_accuracy=run.final_accuracy,
        train_time_s=max(seconds, 0.0),
        sequences_per_s=run.samples / seconds if seconds > 0 else 0.0,
        global_batch_size=run.global_batch_size,
        target_mlm_accuracy=target,
    )
    extra = {"mlperf": {"file": str(run.path), "submitter": run.submitter, "system": run.system,
                        "status": run.status, "optimizer_named_by": run.optimizer_source, "logged": run.logged,
                        "curve": CURVE_SOURCES[run.curve], "wall_clock_s": run.wall_clock_s,
                        "accelerators": run.hardware.accelerators, "accelerator": run.hardware.accelerator,
                        "accelerator_hours": run.accelerator_hours, "notes": list(run.notes)}}  # fmt: skip
    return _Run(run.sha256, str(run.path), params, run.global_batch_size, run.seed, result, extra,
                ended=run.status is not None, budget=run.budget, every=run.eval_every, points=_points(run),
                started=_at(start), finished=_at(stop), worker=run.system, notes=notes,
                wall_clock_s=run.wall_clock_s, accelerators=run.hardware.accelerators)  # fmt: skip


def _time_to(run: ResultRun, target: float) -> float | None:
    """Seconds from run_start to the target: to run_stop where the run stopped at its first evaluation at or above
    the target (MLPerf's time to train), else to that evaluation."""
    hit = run.first_at(target)
    if hit is None or hit is run.evaluations[-1] or hit.time_ms is None:
        return run.wall_clock_s
    return None if run.run_start_ms is None else max(hit.time_ms - run.run_start_ms, 0.0) / 1000


def _takeable(run: ResultRun) -> tuple[dict[str, Any], list[str]]:
    """The logged hyperparameters the trainer can take; a value it cannot (Baidu's and Graphcore's PaddlePaddle logs
    of training 2.0 say opt_learning_rate_training_steps 0) is left out of the run's configuration, with a note: the
    run itself, its curve and samples to target, stands."""
    kept, notes = {}, []
    for key, value in run.hyperparameters.items():
        raw: dict[str, Any] = {}
        set_dotted(raw, key, value)
        try:
            config_from_dict(raw, str(run.path))
        except ConfigError as e:
            why = str(e).splitlines()[-1].strip()
            logged = next((k for k in {**HYPERPARAMETERS, **NAMED_HYPERPARAMETERS}[key] if k in run.logged), key)
            notes.append(f"{logged} {run.logged.get(logged, value)!r} is not a value the trainer takes ({why}): left "
                         "out of the configuration")  # fmt: skip
            continue
        kept[key] = value
    return kept, notes


def _run_notes(run: ResultRun) -> list[str]:
    """What the plan says about a run beyond its numbers: positions not read from epoch_num, no accelerator count."""
    notes = [] if run.curve == "epoch_num" else [f"evaluation positions from {CURVE_SOURCES[run.curve]}"]
    if run.hardware.note:
        notes.append(f"no accelerator count: {run.hardware.note}")
    return notes


def _points(run: ResultRun) -> tuple[MetricPoint, ...]:
    """The eval_accuracy curve as the trainer reports it: mlm_accuracy (and time_s) at samples = epoch_num."""
    points, step = [], -1
    for e in run.evaluations:
        step = max(step + 1, e.samples // run.global_batch_size)
        values = {"mlm_accuracy": e.accuracy}
        if e.time_ms is not None and run.run_start_ms is not None:
            values["time_s"] = round((e.time_ms - run.run_start_ms) / 1000, 3)
        points.append(MetricPoint(step, e.samples, values, _at(e.time_ms)))
    return tuple(points)


def _target(results: Sequence[ResultRun], target: float | None) -> tuple[float, str]:
    """The import's target and where it came from (`TARGET_SOURCES`): --target, else each run's own, the one it logs
    or, where it logs none, MLPerf BERT's 0.720 (the closed division's, which a log need not name): runs whose
    targets differ are an error (v0.7's 0.712 beside a later round's runs)."""
    if target is not None:
        if not 0 < target <= 1:
            raise HpoError(f"--target {target}: a masked-LM accuracy in (0, 1]")
        return float(target), TARGET_SOURCES["given"]
    own = [MLPERF_BERT_TARGET if r.target is None else r.target for r in results]
    if len(set(own)) > 1:
        first = {}  # of each target, its first run
        for run, aim in zip(results, own, strict=True):
            first.setdefault(aim, run)
        where = "; ".join(f"{run.path}: {aim:g}" + (" (it names none: MLPerf BERT's)" if run.target is None else "")
                          for aim, run in first.items())  # fmt: skip
        raise ResultFileError(f"the runs trained to different targets ({where}): a comparison needs one target; "
                              "import them separately, or give the one they all trained to with --target")  # fmt: skip
    logged = sum(r.target is not None for r in results)
    source = "logged" if logged == len(results) else "default" if not logged else "some"
    return own[0], TARGET_SOURCES[source]


# ------------------------------------------------------------------------------------------------ RCP records


def plan_rcp(records: Sequence[RcpRecord], path: str | Path, name: str) -> ImportPlan:
    """The reference experiment of an RCP file's records: arms by global batch size, one run per seed."""
    if not records:
        raise HpoError(f"{path}: no RCP record to import")
    runs = []
    for record in records:
        params = {"optimizer.name": record.optimizer, "batch.global_batch_size": record.global_batch_size,
                  **record.hyperparameters}  # fmt: skip
        total = record.hyperparameters.get("schedule.total_steps")
        budget = max([*record.samples, *([total * record.global_batch_size] if total else [])])
        for index, samples in enumerate(record.samples):
            result = TrainResult(status=TrainStatus.REACHED_TARGET, samples=samples,
                                 steps=samples // record.global_batch_size, samples_to_target=samples,
                                 global_batch_size=record.global_batch_size,
                                 target_mlm_accuracy=MLPERF_BERT_TARGET)  # fmt: skip
            extra = {"rcp": {"file": str(path), "record": record.name, "seed_index": index, "creator": record.creator,
                             "platform": record.platform, "when": record.when, "logged": record.logged}}  # fmt: skip
            runs.append(_Run(record.run_hash(index), f"{path}: {record.name}[{index}]", dict(params),
                             record.global_batch_size, index, result, extra, budget=budget,
                             worker=record.platform))  # fmt: skip
    batches = sorted({r.global_batch_size for r in records})
    description = (f"MLPerf reference convergence points: {Path(path).name}, {len(batches)} batch sizes "
                   f"({batches[0]:,} to {batches[-1]:,}), {len(runs)} runs that reached the target")  # fmt: skip
    target = (MLPERF_BERT_TARGET, "MLPerf BERT's, as the reference runs trained to")
    return _plan("rcp", name, description, runs, ["batch.global_batch_size"], target, [str(path)],
                 str(Path(path).resolve().parent))  # fmt: skip


# ------------------------------------------------------------------------------------------------ the plan


def _plan(kind: str, name: str, description: str, runs: list[_Run], compare: list[str],
          target_from: tuple[float, str], files: list[str], run_dir: str,
          notes: Sequence[str] = ()) -> ImportPlan:  # fmt: skip
    """Configurations, their budgets and evaluation intervals, the synthetic spec, and each run's trial (`target_from`:
    the target and where it came from)."""
    target = target_from[0]
    groups: dict[str, list[_Run]] = {}
    for run in runs:
        groups.setdefault(json.dumps(run.params, sort_keys=True), []).append(run)
    configurations = []
    for group in groups.values():
        params = dict(group[0].params)
        params["budget.max_samples"] = max(r.budget for r in group)
        every = Counter(r.every for r in group if r.every)
        if every:
            params["eval.every_samples"] = min(e for e, n in every.items() if n == max(every.values()))
        _check_values(group[0].source, params)
        tuning = next((r for r in group if r.ended), group[0])
        for run in group:
            run.params, run.extra["configuration"] = params, len(configurations)
        configurations.append((params, tuning, group))
    # an arm with one configuration picked nothing: all its runs are evidence; with several, each one's first run
    # picks the best, and is left out of it
    shared = Counter(_arm_key(params, compare) for params, _, _ in configurations)
    alone = [shared[_arm_key(params, compare)] == 1 for params, _, _ in configurations]
    spec = _spec(kind, name, description, [c[0] for c in configurations], compare, target,
                 max(len(g) - (not one) for (_, _, g), one in zip(configurations, alone, strict=True)))  # fmt: skip
    planned = []
    for (params, tuning, group), one in zip(configurations, alone, strict=True):
        cfg = trial_config(spec, params)
        for run in group:
            result = trial_result(spec, run.result, cfg, run.result.train_time_s or None)
            metrics = {**result.metrics, **run.extra, HASH_KEY: run.key}
            if run is tuning and one:  # nothing was picked on its outcome: it is evidence too
                metrics[UNSELECTED_KEY] = True
            planned.append(PlannedRun(
                run.key, run.source, params, arm_of(spec, params), run.global_batch_size, run.seed,
                TrialKind.TUNING if run is tuning else TrialKind.CONFIRMATION, replace(result, metrics=metrics),
                run.points, run.started, run.finished, run.worker, run.wall_clock_s, run.accelerators))  # fmt: skip
    order = {run.key: i for i, run in enumerate(runs)}
    planned.sort(key=lambda r: order[r.key])
    notes = [*_arm_notes(spec, compare, planned), *_counted([n for r in runs for n in r.notes]), *notes]
    info = {"kind": kind, "files": files, "runs": len(planned), "configurations": len(configurations),
            "compare": compare, "sha256": [r.key for r in planned], "cost": cost_per_arm(planned, spec),
            "target": target, "target_from": target_from[1]}  # fmt: skip
    stored = {**stored_form(spec, run_dir), IMPORTED_KEY: info}
    return ImportPlan(kind, name, spec, stored, tuple(planned), tuple(notes))


def _arm_key(params: Mapping[str, Any], compare: Sequence[str]) -> str:
    """The values of the compare keys of a configuration: its arm, before the spec exists."""
    return json.dumps([params.get(key) for key in compare], sort_keys=True)


def _arm_notes(spec: ExperimentSpec, compare: Sequence[str], planned: Sequence[PlannedRun]) -> list[str]:
    """Arms without a run, and arms whose best configuration is picked among several (its first run left out)."""
    shared = Counter(r.arm for r in planned if r.kind is TrialKind.TUNING)
    with_runs = {r.arm for r in planned}
    empty = [arm_label(fixed) for fixed in arms(spec) if arm_label(fixed) not in with_runs]
    notes = []
    if empty:
        notes.append(f"{len(empty)} of the {len(arms(spec))} arms of compare {', '.join(compare)} have no run "
                     f"({'; '.join(empty)}): the verdict needs runs in every arm; compare by fewer keys "
                     "(--compare optimizer) or import those arms' runs under another name")  # fmt: skip
    for arm, n in sorted((a, n) for a, n in shared.items() if n > 1):
        notes.append(f"arm {arm} holds {n} configurations: its best is picked on each one's first run (its tuning "
                     "trial), which is left out of the verdict's evidence; every other run of it counts")  # fmt: skip
    return notes


def _counted(notes: Sequence[str]) -> list[str]:
    """Each distinct note once, with how many runs it is about."""
    return [f"{n} run(s): {note}" for note, n in Counter(notes).items()]


def cost_per_arm(runs: Sequence[PlannedRun], spec: ExperimentSpec) -> dict[str, dict[str, Any]]:
    """Arm -> what a run cost, over its runs that logged run_start and run_stop: runs, mean wall-clock seconds, the
    accelerator counts, mean accelerator-hours (None where a run's count is unknown); in the order of the spec's arms,
    as the import's summary lists them."""
    cost = {}
    for arm in [arm_label(fixed) for fixed in arms(spec)]:
        timed = [r for r in runs if r.arm == arm and r.wall_clock_s is not None]
        if not timed:
            continue
        hours = [r.accelerator_hours for r in timed]
        cost[str(arm)] = {
            "runs": len(timed),
            "wall_clock_s": statistics.fmean(r.wall_clock_s for r in timed),
            "accelerators": sorted({r.accelerators for r in timed if r.accelerators is not None}),
            "accelerator_hours": statistics.fmean(hours) if None not in hours else None,
        }
    return cost


def _check_values(source: str, params: Mapping[str, Any]) -> None:
    """A logged value the trainer cannot take is an error of the file it came from."""
    raw: dict[str, Any] = {}
    for key, value in params.items():
        set_dotted(raw, key, value)
    try:
        config_from_dict(raw, source)
    except ConfigError as e:
        raise ResultFileError(f"{source}: a logged value the trainer cannot take: {e}") from None


def _spec(kind: str, name: str, description: str, configurations: Sequence[dict[str, Any]], compare: list[str],
          target: float, confirm_seeds: int) -> ExperimentSpec:  # fmt: skip
    """The synthetic experiment: a choice per hyperparameter over the values the runs used (see hpo.mlperf)."""
    keys = list(dict.fromkeys(k for c in configurations for k in c))
    space = {key: {"choice": _choices([c[key] for c in configurations if key in c])} for key in keys}
    batches = [c["batch.global_batch_size"] for c in configurations]
    first = configurations[0]
    base = {
        "optimizer": {"name": first["optimizer.name"]},
        "batch": {"global_batch_size": batches[0], "micro_batch_size": math.gcd(*batches)},
        "eval": {"target_mlm_accuracy": target,
                 **({"every_samples": first["eval.every_samples"]} if "eval.every_samples" in first else {})},
        "budget": {"max_samples": max(c["budget.max_samples"] for c in configurations)},
    }  # fmt: skip
    n_arms = math.prod(len(space[key]["choice"]) for key in compare)
    data = {
        "name": name, "description": description, "base_config": base, "space": space, "compare": compare,
        "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": max(len(configurations), n_arms), "confirm_seeds": confirm_seeds},
        "resources": {"gpus": "none", "cpu_slots": 1},
    }  # fmt: skip
    return experiment_from_dict(data, f"hpo import {kind} --name {name}", base_dir=Path.cwd(), current_rules=False)


def _choices(values: Sequence[Any]) -> list[Any]:
    unique = list(dict.fromkeys(values))
    try:
        return sorted(unique)
    except TypeError:
        return unique


def _listed(names: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _common_dir(files: Sequence[str]) -> str:
    try:
        return os.path.commonpath([str(Path(f).resolve().parent) for f in files])
    except ValueError:
        return str(Path(files[0]).resolve().parent)


def _at(time_ms: float | None) -> datetime | None:
    if time_ms is None:
        return None
    try:
        return datetime.fromtimestamp(time_ms / 1000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------ writing


def write_plan(storage: Storage, plan: ImportPlan) -> Written:
    """Store the plan's experiment and the runs it does not hold yet; it is FINISHED once it holds every run of the
    import that created it (a cut-short import run again with part of its files stays unfinished, `Written.left`);
    see the module docstring."""
    try:
        record = storage.get_experiment_by_name(plan.name)
    except NotFoundError:
        record = None
    expected = {r.key for r in plan.runs}  # every run of the experiment's import: it is finished when it holds them
    stored_cost, cost_differs = None, False
    if record is None:
        experiment_id, present = storage.create_experiment(plan.name, plan.stored, plan.spec.direction), set()
    else:
        info = imported(record)
        if info is None:
            raise HpoError(f"experiment {plan.name!r} exists and was not imported (it ran here): import under "
                           "another --name")  # fmt: skip
        experiment_id = record.id
        trials = storage.list_trials(record.id)
        present = {t.metrics.get(HASH_KEY) for t in trials if t.state.finished}
        missing = [r for r in plan.runs if r.key not in present]
        own = set(info.get("sha256") or [])  # every run of the import that created it
        if missing and (info.get("kind") != plan.kind or not {r.key for r in plan.runs} <= own):
            held = len([t for t in trials if t.metrics.get(HASH_KEY)])
            raise HpoError(f"experiment {plan.name!r} holds an import of other files ({held} run(s)); "
                           f"{len(missing)} of these {len(plan.runs)} run(s) are not in it, e.g. {missing[0].source}: "
                           "an imported experiment's arms and configurations are fixed when it is created, so import "
                           "them under another --name")  # fmt: skip
        if missing and {r.key for r in plan.runs} != own:
            raise HpoError(f"experiment {plan.name!r} is an import that stopped before it finished ({len(present)} of "
                           f"its {len(own)} runs stored), and these files are {len(plan.runs)} of its runs: run the "
                           "import again with all its files (the same command) to finish it; read without the "
                           "others, its runs would be grouped into configurations and tuning or confirmation runs "
                           "otherwise than the import that created it grouped them")  # fmt: skip
        _same_options(plan, record, trials)
        stored_cost = info.get("cost") or {}
        cost_differs = _cost_differs(plan, stored_cost, trials)
        expected = set(info.get("sha256") or []) | expected  # a cut-short import, finished with part of its files
        for trial in trials:  # an earlier import of these very files that stopped between writing a trial's rows
            if not trial.state.finished and trial.state is not TrialState.INTERRUPTED:
                storage.interrupt_trial(trial.id, "an earlier import stopped before this run was complete; it was "
                                                  "written again as another trial")  # fmt: skip
    clock = _Clock()
    storage.use_trial_clock(clock)
    added = 0
    try:
        for run in plan.runs:
            if run.key in present:
                continue
            _write_run(storage, experiment_id, run, clock)
            added += 1
    finally:
        storage.use_trial_clock(_now)
    left = len(expected - present - {r.key for r in plan.runs})
    if not left and (added or record is None or record.status is not ExperimentStatus.FINISHED):  # a repeat that
        storage.set_experiment_status(experiment_id, ExperimentStatus.FINISHED)  # adds nothing writes nothing
    held = len(set(imported(record).get("sha256") or [])) if record is not None else len(plan.runs)
    return Written(experiment_id, added, len(plan.runs) - added, left, stored_cost, cost_differs, held)


def _cost_differs(plan: ImportPlan, stored_cost: Mapping[str, Any], trials: Sequence[TrialRecord]) -> bool:
    """Whether the runs now read cost otherwise than the experiment stored (a system description changed since): a
    run it holds whose wall-clock or accelerator count differs from its trial's, or, where some runs are written only
    now (these files are then every run of its import), a cost per arm other than the stored one. The cost per arm of
    part of the import's files is not compared with the stored one: it is over fewer runs, so it differs anyway."""
    held = {t.metrics.get(HASH_KEY): t.metrics.get("mlperf") or {} for t in trials if t.state.finished}
    read = [(run, held[run.key]) for run in plan.runs if run.key in held]  # each held run and what its trial keeps
    if any((run.wall_clock_s, run.accelerators) != (kept.get("wall_clock_s"), kept.get("accelerators"))
           for run, kept in read):  # fmt: skip
        return True
    return len(read) < len(plan.runs) and plan.stored[IMPORTED_KEY]["cost"] != stored_cost


def _same_options(plan: ImportPlan, record: ExperimentRecord, trials: Sequence[TrialRecord]) -> None:
    """A second import of an imported experiment's files must read them as the first did: the same arms (--compare),
    target (--target) and optimizers (--optimizer, of runs whose log names none); else it is refused, naming the
    option (what is stored stays as the first import made it)."""
    info = imported(record) or {}
    stored, asked = list(info.get("compare") or []), list(plan.stored[IMPORTED_KEY]["compare"])
    differ = []
    if stored and stored != asked:
        differ.append(f"--compare {_compare_names(stored)} (now --compare {_compare_names(asked)})")
    was = spec_from_stored(record).resolved_base()["eval"]["target_mlm_accuracy"]
    now = plan.spec.resolved_base()["eval"]["target_mlm_accuracy"]
    if not math.isclose(was, now, rel_tol=0, abs_tol=1e-12):
        differ.append(f"--target {was:g} (now --target {now:g})")
    held = {t.metrics.get(HASH_KEY): t.params.get("optimizer.name") for t in trials if t.state.finished}
    other = next((r for r in plan.runs if r.key in held and held[r.key] != r.params.get("optimizer.name")), None)
    if other is not None:
        differ.append(f"--optimizer {held[other.key]} for the runs whose log names none (now --optimizer "
                      f"{other.params.get('optimizer.name')}; e.g. {other.source})")  # fmt: skip
    if differ:
        raise HpoError(f"experiment {plan.name!r} was imported with {'; '.join(differ)}: an imported experiment's "
                       "arms, target and configurations are fixed when it is created; import with the options it was "
                       "imported with, or under another --name")  # fmt: skip


def _compare_names(keys: Sequence[str]) -> str:
    """Trainer keys as --compare names them (optimizer.name -> optimizer)."""
    names: dict[str, str] = {}
    for name, key in COMPARE_KEYS.items():
        names.setdefault(key, name)
    return ",".join(names.get(key, key) for key in keys)


def _write_run(storage: Storage, experiment_id: int, run: PlannedRun, clock: _Clock) -> None:
    clock.at = run.started
    spec = TrialSpec(None, run.params, run.arm, 1.0, (), run.global_batch_size, run.kind, run.seed)
    trial_id = storage.create_trial(experiment_id, spec)
    storage.mark_trial_running(trial_id, None, worker=run.worker)
    if run.points:
        storage.add_metrics(trial_id, run.points)
    clock.at = run.finished or run.started
    storage.finish_trial(trial_id, run.result)


class _Clock:
    """The trial clock of an import: the run's own times where the log has them, else now."""

    def __init__(self) -> None:
        self.at: datetime | None = None

    def __call__(self) -> datetime:
        return self.at or _now()


def _now() -> datetime:
    return datetime.now(timezone.utc)


def describe(plan: ImportPlan, written: Written) -> list[str]:
    """What an import did, in lines: runs added or already there, trials by kind, per arm its runs, hits, samples to
    target and cost per run, notes."""
    info = plan.stored[IMPORTED_KEY]
    lines = []
    if not written.added and not written.left and written.held > len(plan.runs):  # part of a finished import's files
        lines.append(
            f"experiment {plan.name}: these files are {len(plan.runs)} of its {written.held} runs, all already "
            f"there: it is unchanged (`hpo status {plan.name}` shows the whole experiment); these files:"
        )
    lines += [f"experiment {plan.name}: {written.added} run(s) imported, {written.present} already there "
             f"({plan.configurations} configuration(s) in {len({r.arm for r in plan.runs})} arm(s)); target "
             f"masked-LM accuracy {info['target']:g} ({info['target_from']})"]  # fmt: skip
    cost = info["cost"] if written.stored_cost is None else written.stored_cost
    for label in [arm_label(fixed) for fixed in arms(plan.spec)]:
        mine = [r for r in plan.runs if r.arm == label]
        hits = [r.result.samples_to_target for r in mine if r.result.samples_to_target is not None]
        mean = f" (samples to target {statistics.fmean(hits):,.0f} on average)" if hits else ""
        spent = cost_line(cost.get(label))
        lines.append(
            f"  arm {label}: {len(mine)} run(s), {len(hits)} reached the target{mean}" + (f"; {spent}" if spent else "")
        )
    lines += [f"note: {note}" for note in plan.notes]
    if written.cost_differs:
        lines.append(
            "note: the cost above is the one stored when the experiment was imported: the system "
            "descriptions now say otherwise (import under another --name to read the runs with them)"
        )
    if written.left:
        lines.append(f"experiment {plan.name} is not finished: {written.left} run(s) of the import that created it are "
                     "in none of these files; run that import again (its files, its options) to finish it")  # fmt: skip
    return lines
