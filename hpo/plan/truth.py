"""The truth a plan's outcomes are judged against: which arm is truly better on the learning-curve table, and by
how much, or a stated difference made true (`hpo plan --difference`).

The truth of an arm is its best configuration's, over a dense grid of the arm's space (every choice; a tuned
number at `POINTS` points, on a log scale where the space says log), each configuration run as the simulated
runner runs a full-budget trial of it (`SimulatedRunner.full_run`: the same curve, evaluations, stop and
objective) under each of the table's recorded training seeds. For a samples-to-target objective, configurations
and arms are compared as the verdict compares them: by the geometric mean over the seeds of samples to target
interpolated between evaluations (a miss counts at the budget; the stored objective is rounded to evaluations,
and its ties would let the best configuration jump); for another objective by its mean over the seeds. The truly
better arm is the one with the lower (or, maximizing, higher) figure; equal figures are a true tie.

A stated difference D (`stated_difference`) exists only for two arms that compare optimizers: the second arm's
trials read the first optimizer's curves (`runner.simulation.handicaps`), delayed by the samples that make the
first arm's truth S1 need D fewer samples than the second's: S1 / (1 - D). A delay of d samples does not add d
to the interpolated samples to target (the delayed curve is evaluated at the same points), so the delay starts at
S1 D / (1 - D) and moves by what is still missing, until the realized difference is within 0.2 points of D (at most
8 tries); the plan prints the realized one.

A repetition's outcome judged against the truth (`Truth.judged`, as the verdict's chances judge theirs,
hpo.plan.chances): right (the truly better arm named; "equivalent" where every pair's true ratio lies within the
verdict's margin, a true tie included), wrong (another arm named; at a tie, any), equivalent (said where the arms
truly differ by more than the margin), not yet. The margin applies to samples to target, what the verdict
compares; for another objective only a true tie makes "equivalent" right.
"""

from __future__ import annotations

import copy
import math
import statistics
from dataclasses import dataclass
from typing import Any

from hpo.errors import HpoError
from hpo.evidence.verdict import DEFAULT_MARGIN, samples_between_evaluations
from hpo.experiment.arms import BATCH_KEY, arm_plans, trial_config
from hpo.simulation.surrogate import Surrogate
from search_spaces.space import CategoricalParam, FloatParam, IntParam

POINTS = 121  # points of a tuned number's range
JUDGED = ("right", "wrong", "equivalent", "not yet")
DELAY_STEPS = 8  # tries at the delay that makes a stated difference
DELAY_TOLERANCE = 0.002  # how close the realized difference must come to the stated one


@dataclass(frozen=True)
class ArmTruth:
    label: str
    params: dict[str, Any]  # its best configuration
    objective: float  # that configuration's objective, the mean over the recorded seeds
    figure: float  # what the arms are compared by (samples: the geometric mean of samples to target)


@dataclass(frozen=True)
class Truth:
    arms: tuple[ArmTruth, ...]
    better: str | None  # the truly better arm's label; None: a true tie
    metric: str
    stated: float | None = None  # the stated difference, when the plan made one true
    delay_samples: int | None = None  # the second arm's delay that made it
    margin: float = DEFAULT_MARGIN  # the verdict's: "equivalent" is right where the truth lies within it

    def difference(self) -> float:
        """How much less the best arm needs than the next best (a share of the next best's figure)."""
        ordered = sorted(a.figure for a in self.arms)
        return 0.0 if len(ordered) < 2 or ordered[1] == 0 else 1 - ordered[0] / ordered[1]

    def within(self) -> bool:
        """The truth is "equivalent within ±margin": every pair's true ratio (in the arms' order, as the verdict
        takes them) lies inside, as `hpo.plan.chances.Evidence.within` says of a spread; for an objective other
        than samples to target, only a true tie."""
        if self.better is None:
            return True
        if self.metric != "samples_to_target":
            return False
        return all(1 - self.margin < a.figure / b.figure < 1 + self.margin
                   for i, a in enumerate(self.arms) for b in self.arms[i + 1 :])  # fmt: skip

    def judged(self, outcome: str, winner: str | None) -> str:
        """right / wrong / equivalent / not yet (see the module docstring)."""
        if outcome == "winner":
            return "right" if self.better is not None and winner == self.better else "wrong"
        if outcome == "equivalent":
            return "right" if self.within() else "equivalent"
        return "not yet"

    def line(self) -> str:
        """The truth in words."""
        within = (f"; within the verdict's margin of ±{self.margin:.0%}: \"equivalent\" is right too"
                  if self.better is not None and self.within() else "")  # fmt: skip
        if self.stated is not None:
            first, second = self.arms[0].label, self.arms[1].label
            return (f"the stated difference: {first} needs {self.stated:.1%} fewer samples than {second} (its trials "
                    f"read {first}'s curves {self.delay_samples:,} samples late; realized on the table: "
                    f"{self.difference():.1%}){within}")  # fmt: skip
        if self.better is None:
            return "the table's: a true tie between the arms' best configurations"
        unit = "samples to target (geometric mean over the table's seeds)" if self.metric == "samples_to_target" else (
            f"{self.metric} (mean over the table's seeds)")  # fmt: skip
        others = ", ".join(f"{a.label} {_number(a.figure)}" for a in self.arms if a.label != self.better)
        best = next(a for a in self.arms if a.label == self.better)
        return (f"the table's: {self.better} is better, {self.difference():.1%} below the next arm at each arm's best "
                f"configuration ({unit}: {_number(best.figure)}; {others}){within}")  # fmt: skip


def batch_truths(truth: Truth, spec) -> dict[int, Truth]:
    """A batch-size study's truth at each batch size where two or more optimizers are compared, as the verdict at
    each batch size compares them (`hpo.evidence.verdict.batch_size_verdicts`): its arms there by optimizer (one
    optimizer's arms there: the best of them), the truly better the one with the lower figure. Ascending."""
    by_batch: dict[int, dict[str, ArmTruth]] = {}
    for arm in truth.arms:
        batch = arm.params.get(BATCH_KEY)
        optimizer = trial_config(spec, arm.params).optimizer.name
        mine = by_batch.setdefault(int(batch), {}) if batch is not None else {}
        if optimizer not in mine or arm.figure < mine[optimizer].figure:
            mine[optimizer] = ArmTruth(optimizer, arm.params, arm.objective, arm.figure)
    truths = {}
    for batch, found in sorted(by_batch.items()):
        if len(found) < 2:
            continue
        ordered = sorted(found.values(), key=lambda a: a.figure)
        tie = math.isclose(ordered[0].figure, ordered[1].figure, rel_tol=1e-9)
        truths[batch] = Truth(tuple(found[o] for o in sorted(found)), None if tie else ordered[0].label, truth.metric,
                              margin=truth.margin)  # fmt: skip
    return truths


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}"


def table_truth(runner, spec) -> Truth:
    """The truth of `spec`'s arms on the table the simulated `runner` reads (its handicaps included)."""
    arms = tuple(_arm_truth(runner, spec, plan.label or "all", plan.fixed, plan.space) for plan in arm_plans(spec))
    sign = -1.0 if spec.direction == "maximize" and spec.objective.metric != "samples_to_target" else 1.0
    ordered = sorted(arms, key=lambda a: sign * a.figure)
    tie = len(ordered) < 2 or math.isclose(ordered[0].figure, ordered[1].figure, rel_tol=1e-9)
    return Truth(arms, None if tie else ordered[0].label, spec.objective.metric, margin=spec.verdict.margin)


def stated_handicap(runner, spec, difference: float) -> dict[str, dict[str, Any]]:
    """`runner.simulation.handicaps` that make the first arm need `difference` fewer samples than the second (see
    the module docstring); HpoError where a stated difference cannot be made."""
    where = f"{spec.source}: --difference"
    if spec.compare != ["optimizer.name"] or len(arm_plans(spec)) != 2:
        several = len(arm_plans(spec)) > 1
        alone = "; the verdict's chances at a stated spread alone: add --verdict-only" if several else ""
        raise HpoError(f"{where} makes a true difference between two arms that compare optimizers (compare: "
                       f"[optimizer.name] with two choices); this file compares {spec.compare or 'nothing'}; without "
                       f"--difference the plan judges its outcomes against the table's own truth{alone}")  # fmt: skip
    if spec.objective.metric != "samples_to_target":
        raise HpoError(f"{where}: a stated difference is in samples to target; this file's objective is "
                       f"{spec.objective.metric}")  # fmt: skip
    if spec.runner.simulation.handicaps:
        raise HpoError(f"{where}: the file already sets runner.simulation.handicaps; drop them or --difference")
    if not 0 <= difference < 1:
        raise HpoError(f"{where} must be at least 0 and below 100 %, got {difference:.0%}")
    first, second = arm_plans(spec)
    goal = _arm_truth(runner, spec, first.label, first.fixed, first.space).figure
    source, handicapped = first.fixed["optimizer.name"], second.fixed["optimizer.name"]
    delay, tried, realized = round(goal * difference / (1 - difference)), {}, {}
    for _ in range(DELAY_STEPS):  # the realized difference moves with the delay, but not one for one
        delayed = copy.copy(runner)
        delayed.surrogate = Surrogate(runner.table, {handicapped: (source, delay)})
        figure = _arm_truth(delayed, spec, second.label, second.fixed, second.space).figure
        realized[delay] = 1 - goal / figure
        tried[delay] = abs(realized[delay] - difference)
        if tried[delay] <= DELAY_TOLERANCE:
            break
        delay = max(round(delay + (goal / (1 - difference) - figure)), 0)
        if delay in tried:
            break
    closest = min(tried, key=tried.get)
    if tried[closest] > DELAY_TOLERANCE:  # the plan would be judged against a difference it does not simulate
        raise HpoError(f"{where} {difference:.1%}: on this table the nearest the file's arms come to it is "
                       f"{realized[closest]:.1%} (with {second.label} {closest:,} samples late): state a difference "
                       "the table can make, or plan without --difference against the table's own truth")  # fmt: skip
    return {handicapped: {"curves_of": source, "delay_samples": closest}}


def _arm_truth(runner, spec, label: str, fixed: dict[str, Any], space) -> ArmTruth:
    seeds = range(len(runner.surrogate.seeds))
    samples = spec.objective.metric == "samples_to_target"
    sign = -1.0 if spec.direction == "maximize" and not samples else 1.0
    best: ArmTruth | None = None
    for params in _grid(space):
        params = {**fixed, **params}
        try:
            runs = runner.full_runs(params, seeds)
        except HpoError as e:
            raise HpoError(f"{spec.source}: the truth of arm {label}: {e}") from None
        objectives = [r.objective for r, _, _ in runs]
        if any(o is None for o in objectives):
            continue  # a failed configuration is never the best
        mean = statistics.fmean(objectives)
        truth = ArmTruth(label, params, mean, _samples_figure(runs) if samples else mean)
        if best is None or sign * truth.figure < sign * best.figure:
            best = truth
    if best is None:
        raise HpoError(f"{spec.source}: the truth of arm {label}: no configuration of its space finished on the table")
    return best


def _samples_figure(runs) -> float:
    """The geometric mean over the seeds' runs of samples to target interpolated between evaluations (a miss: the
    budget), what the verdict estimates."""
    logs = []
    for result, evals, cfg in runs:
        hit = result.samples_to_target
        value = cfg.budget.max_samples if hit is None else samples_between_evaluations(
            evals, cfg.eval.target_mlm_accuracy, hit)  # fmt: skip
        logs.append(math.log(value))
    return math.exp(statistics.fmean(logs))


def _grid(space) -> list[dict[str, Any]]:
    """Every configuration of a dense grid of `space`: each choice, each tuned number at POINTS points (integers:
    every value when there are at most POINTS), a condition's parameters only where it holds."""
    configs: list[dict[str, Any]] = [{}]
    for name in space.names:
        param, grown = space[name], []
        for config in configs:
            if not space.is_active(name, config):
                grown.append(config)
                continue
            grown += [{**config, name: value} for value in _values(param)]
        configs = grown
    return configs


def _values(param) -> list[Any]:
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    if isinstance(param, IntParam) and param.high - param.low < POINTS:
        return list(range(int(param.low), int(param.high) + 1))
    if isinstance(param, FloatParam | IntParam):
        low, high = (math.log(param.low), math.log(param.high)) if param.log else (param.low, param.high)
        points = [low + (high - low) * k / (POINTS - 1) for k in range(POINTS)]
        values = [math.exp(p) for p in points] if param.log else points
        values[0], values[-1] = param.low, param.high  # the ends exactly (no rounding off the range)
        return [round(v) for v in values] if isinstance(param, IntParam) else values
    raise HpoError(f"no grid for parameter {param!r}")
