"""Several experiments side by side: samples to target against global batch size per optimizer, next to the
gradient noise scale measured at each batch size (e.g. the runs of the `batch_scaling` presets).

One point per arm of every experiment: its optimizer and global batch size (those of the arm's best trial), the
verdict's evidence for the arm (mean samples to target over the runs that reached the target, its 95 % t
interval, and the hit rate, from the best configuration's confirmation seeds), and the noise scale: the
median, minimum and maximum over the arm's trials at that batch size of each trial's late-training noise scale
(see data.py), flagged as a lower bound when any of those trials' estimates is one. Reading it: where the
measured noise scale is far below the batch size, a larger batch buys little, and samples to target grows with
the batch instead of staying flat.

Per optimizer, the fit of hpo.evidence.batch_scaling to all its points' runs (E(B) = E_min (1 + B / B_crit),
McCandlish et
al. 2018): a point carries its runs' samples to target as the verdict counts them (`confirmation_runs`: the best
configuration's confirmation runs, interpolated between evaluations, None for a miss), and its evidence is the
verdict's summary of those very runs, so the table's means and the fit read the same numbers. Points of one
optimizer from several experiments are pooled as runs at their batch sizes: the fit assumes the experiments differ
in the batch size only (the same model, data and target).

An imported experiment (`hpo import`, hpo.mlperf) is a series of its own, never pooled with the experiments that ran
here (other model, data and systems): `lamb (NAME, imported)`, and an RCP import (`hpo import rcp`: MLPerf's
reference convergence points, BERT-large on MLPerf's data, target 0.720) `lamb (NAME, MLPerf reference)`, drawn as
the reference curve beside the user's experiments (`reference` on its points).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from hpo.evidence.batch_scaling import BatchScaling, fit_batch_scaling
from hpo.evidence.verdict import (
    DEFAULT_MARGIN,
    ArmRuns,
    ArmSummary,
    Verdict,
    batch_size_verdicts,
    look_level,
    summarize,
)
from hpo.report.data import ExperimentData, load_experiment
from hpo.storage.base import Storage

Runs = tuple[float | None, ...]  # samples to target per run, None for a miss


@dataclass(frozen=True)
class ScalingPoint:
    experiment: str
    arm: str
    optimizer: str
    global_batch_size: int
    evidence: ArmSummary
    noise_scale: float | None  # the median over the arm's trials at this batch size (None: not measured)
    noise_low: float | None
    noise_high: float | None
    noise_trials: int  # trials with a measured noise scale
    noise_lower_bounds: int = 0  # of those, the trials whose estimate is only a lower bound (see data.py)
    runs: Runs = ()  # its runs' samples to target, as the verdict counts them (None: a miss); () when not read
    reference: bool = False  # an RCP import: MLPerf's reference curve
    resolution: float = 0.0  # the verdict's floor of the runs' spread (ExperimentData.confirmation_resolution)
    # the arm's evidence as its experiment's verdict reads it at its current look (ExperimentData.verdict_runs), and
    # that look (look, looks); None: no verdict of its experiment reads it
    verdict_runs: ArmRuns | None = None
    look: tuple[int, int] = (1, 1)


def confirmation_runs(storage: Storage, name: str) -> dict[str, Runs]:
    """Arm label -> the samples to target of its best configuration's confirmation runs, as the verdict reads them
    (hpo.evidence.verdict.arm_runs on the stored trials and their evaluation curves;
    `ExperimentData.confirmation_runs`)."""
    return load_experiment(storage, name, with_noise=False).confirmation_runs


def scaling_points(experiments: Sequence[ExperimentData],
                   runs: Mapping[tuple[str, str], Runs] | None = None) -> list[ScalingPoint]:  # fmt: skip
    """Every arm with a global batch size and evidence, ordered by optimizer, then batch size. `runs` maps
    (experiment, arm label) to the arm's runs (`confirmation_runs`); a point with runs has the verdict's summary of
    them as its evidence."""
    points = []
    for data in experiments:
        for arm in data.arms:
            batch = arm.best.global_batch_size if arm.best else None
            if batch is None or arm.evidence is None:
                continue
            rows = [t for t in arm.trials if t.global_batch_size == batch and t.noise_scale is not None]
            noise = [t.noise_scale for t in rows]
            median = statistics.median(noise) if noise else None
            bounds = sum(1 for t in rows if t.noise_lower_bound)
            mine = tuple((runs or {}).get((data.name, arm.label), ()))
            resolution = data.confirmation_resolution.get(arm.label, 0.0) if mine else 0.0
            evidence = summarize(ArmRuns(arm.label, mine, arm.evidence.max_samples, resolution)) if mine else \
                arm.evidence  # fmt: skip
            look = (data.verdict.look, data.verdict.looks) if data.verdict else (1, 1)
            points.append(ScalingPoint(data.name, arm.label, series(data, arm.optimizer or "?"), batch, evidence,
                                       median, min(noise, default=None), max(noise, default=None), len(noise),
                                       bounds, mine, is_reference(data), resolution, data.verdict_runs.get(arm.label),
                                       look))  # fmt: skip
    return sorted(points, key=lambda p: (p.optimizer, p.global_batch_size, p.experiment, p.arm))


def is_reference(data: ExperimentData) -> bool:
    """Whether an experiment is MLPerf's reference curve (an RCP import)."""
    return bool(data.imported) and data.imported.get("kind") == "rcp"


def series(data: ExperimentData, optimizer: str) -> str:
    """The line an arm's point belongs to: its optimizer, or for an imported experiment one of its own."""
    if not data.imported:
        return optimizer
    return f"{optimizer} ({data.name}, {'MLPerf reference' if is_reference(data) else 'imported'})"


def experiment_runs(experiments: Sequence[ExperimentData]) -> dict[tuple[str, str], Runs]:
    """(experiment, arm label) -> the arm's runs as `confirmation_runs` gives them, from the experiments as
    `load_experiment` read them (no second read of their trials and curves)."""
    return {(data.name, label): runs for data in experiments for label, runs in data.confirmation_runs.items()}


def experiment_fits(storage: Storage, name: str) -> dict[str, BatchScaling]:
    """The fits the comparison page draws for one experiment's points (e.g. an RCP import's reference curve)."""
    experiments = [load_experiment(storage, name, with_noise=False)]
    return scaling_fits(scaling_points(experiments, experiment_runs(experiments)))


def scaling_fits(points: Sequence[ScalingPoint]) -> dict[str, BatchScaling]:
    """Optimizer -> hpo.evidence.batch_scaling's fit to the runs of all its points, each run at its point's batch
    size."""
    return {name: fit_batch_scaling([(p.global_batch_size, s) for p in points if p.optimizer == name for s in p.runs])
            for name in optimizers(points)}  # fmt: skip


def optimizers(points: Sequence[ScalingPoint]) -> list[str]:
    return sorted({p.optimizer for p in points})


def batch_verdicts(points: Sequence[ScalingPoint], margin: float = DEFAULT_MARGIN,
                   declared: Collection[int] = ()) -> dict[int, Verdict]:  # fmt: skip
    """Global batch size -> the verdict between the optimizers measured there (two or more, with runs; never a
    reference): `hpo.evidence.verdict.batch_size_verdicts` of the points' evidence as their experiment's verdict reads
    it at its current look (the runs of the rounds up to it, the pick a lucky seed is judged by), the error shared
    over the batch sizes compared and those `declared` (`ExperimentData.declared_batch_sizes`) and spent over the
    looks as the experiment's verdict spends it. Points pooled from several experiments at other looks are tested at
    the smallest of their looks' levels; runs read at an evaluation keep the verdict's floor of one evaluation
    interval (pooled: the widest). Ascending by batch size."""
    used = [p for p in points if p.runs and not p.reference]
    at, looks = min({p.look for p in used}, key=lambda pair: look_level(*pair), default=(1, 1))
    return batch_size_verdicts(((p.global_batch_size, p.optimizer, p.verdict_runs or
                                 ArmRuns(p.optimizer, p.runs, p.evidence.max_samples, p.resolution)) for p in used),
                               margin, at, looks, declared)  # fmt: skip
