"""The surrogate over the learning-curve table: one training seed's curve for any configuration in its ranges.

A configuration is the table's dimensions (`hpo.simulation.table.DIMENSIONS`) plus a training seed:

- optimizer, warmup steps and global batch size must be grid values (they are discrete in the table);
- the learning rate may lie anywhere in the grid's range: the curve is interpolated linearly in log(lr)
  between the two neighbouring grid learning rates, evaluation by evaluation, with the *same recorded seed* on
  both sides (so a curve between grid points is a blend of two real curves of one seed, and at a grid point it
  is the recorded curve exactly). A neighbour that diverged counts with its last evaluated accuracy after its
  end; the blend diverges where its nearer neighbour did (w >= 0.5 towards it), at that neighbour's point.
  The loss and noise-scale series are the nearer neighbour's;
- the training seed picks a recorded seed: `seeds[seed % len(seeds)]`, so another seed gives another recorded
  curve (with 3 recorded seeds, seeds s and s + 3 give the same one);
- along samples, the accuracy between two evaluations is interpolated linearly, so an experiment may evaluate
  at any multiple of the table's interval, up to the table's budget. A table with a budget per global batch size
  (hpo/simulation/tables/large_batch.jsonl) has an interval and a budget per batch size: a curve at batch B ends at
  `table.max_samples_for(B)`, its evaluations `table.eval_every_for(B)` apart.

The truth of a configuration (`truths`) is its objective averaged over all recorded seeds; the truth of an arm is
its best configuration's truth (computed by the benchmarks that need it).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from hpo.errors import HpoError
from hpo.simulation.table import CurveTable, Run, Series, point_label


@dataclass(frozen=True)
class Config:
    """A point of the table's space, and the training seed."""

    optimizer: str
    lr: float
    warmup_steps: int
    global_batch_size: int
    seed: int = 0


@dataclass(frozen=True)
class Curve:
    """One simulated run to the table's full budget at its batch size (or its divergence)."""

    evals: Series  # (samples, mlm_accuracy) at the table's evaluations
    loss: Series
    noise_scale: Series
    end: int  # samples trained: the budget, or where the run diverged
    diverged: bool

    def accuracy_at(self, samples: int) -> float:
        """The accuracy after `samples` (linear between evaluations; before the first one: the first one)."""
        points = [s for s, _ in self.evals]
        i = bisect.bisect_left(points, samples)
        if i < len(points) and points[i] == samples:
            return self.evals[i][1]
        if i == 0:
            return self.evals[0][1]
        if i == len(points):
            return self.evals[-1][1]
        (s0, a0), (s1, a1) = self.evals[i - 1], self.evals[i]
        return a0 + (a1 - a0) * (samples - s0) / (s1 - s0)

    def evaluations(self, every: int, until: int) -> Series:
        """(samples, accuracy) where a run evaluating every `every` samples up to `until` evaluates: each
        multiple of `every`, and the last sample trained (as the trainer evaluates at the end of its budget)."""
        stop = min(until, self.end)
        points = list(range(every, stop + 1, every))
        if not self.diverged and (not points or points[-1] != stop):
            points.append(stop)
        if self.diverged:  # the trainer stops at the step it diverges, without evaluating
            points = [s for s in points if s < self.end]
        return tuple((s, self.accuracy_at(s)) for s in points)


class Surrogate:
    """Curves for configurations of one table. `handicaps` (for calibration benchmarks): optimizer -> (the
    optimizer whose curves it reads, samples they are delayed by), so the truth of a comparison is known."""

    def __init__(self, table: CurveTable, handicaps: dict[str, tuple[str, int]] | None = None):
        self.table = table
        self.seeds = table.seeds()
        self.handicaps = dict(handicaps or {})

    def recorded_seed(self, seed: int) -> int:
        return self.seeds[seed % len(self.seeds)]

    def curve(self, config: Config) -> Curve:
        """The curve of `config` trained with its seed (see the module docstring)."""
        if config.optimizer in self.handicaps:
            source, delay = self.handicaps[config.optimizer]
            original = Config(source, config.lr, config.warmup_steps, config.global_batch_size, config.seed)
            batch = config.global_batch_size
            budget, every = self.table.max_samples_for(batch), self.table.eval_every_for(batch)
            return _delayed(Surrogate(self.table).curve(original), delay, budget, every)
        point = (config.optimizer, config.warmup_steps, config.global_batch_size)
        line = self.table.line(*point)
        lrs = sorted(line)
        low, high = lrs[0], lrs[-1]
        if not low * (1 - 1e-9) <= config.lr <= high * (1 + 1e-9):
            raise HpoError(f"optimizer.lr {config.lr:g} is outside the curve table's range [{low:g}, {high:g}] at "
                           f"{point_label(*point)} ({self.table.path})")  # fmt: skip
        seed = self.recorded_seed(config.seed)
        i = min(bisect.bisect_left(lrs, config.lr), len(lrs) - 1)
        if i > 0 and math.isclose(lrs[i - 1], config.lr, rel_tol=1e-9):
            i -= 1  # a rounding error above a grid learning rate is that learning rate
        if math.isclose(lrs[i], config.lr, rel_tol=1e-9) or i == 0:
            return _recorded(self._run(line, lrs[i], seed, point))
        left, right = self._run(line, lrs[i - 1], seed, point), self._run(line, lrs[i], seed, point)
        w = (math.log(config.lr) - math.log(left.lr)) / (math.log(right.lr) - math.log(left.lr))
        return _blend(left, right, w)

    def curves(self, config: Config) -> list[Curve]:
        """The curve of `config` under every recorded seed (for its truth)."""
        return [self.curve(Config(config.optimizer, config.lr, config.warmup_steps, config.global_batch_size, s))
                for s in range(len(self.seeds))]  # fmt: skip

    def _run(self, line: dict[float, dict[int, Run]], lr: float, seed: int, point: tuple) -> Run:
        try:
            return line[lr][seed]
        except KeyError:
            raise HpoError(f"{self.table.path}: no run at {point_label(*point)}, optimizer.lr={lr:g} with seed {seed}; "
                           f"{self.table.resume_hint()}") from None  # fmt: skip


def _recorded(run: Run) -> Curve:
    return Curve(run.curve, run.loss, run.noise_scale, run.samples, run.diverged)


def _blend(left: Run, right: Run, w: float) -> Curve:
    """Left and right curves of one seed mixed (1 - w) : w at every evaluation of the longer one."""
    near, far = (right, left) if w >= 0.5 else (left, right)
    points = sorted({s for s, _ in left.curve} | {s for s, _ in right.curve})
    a, b = dict(left.curve), dict(right.curve)
    evals = tuple((s, (1 - w) * _held(a, left.curve, s) + w * _held(b, right.curve, s)) for s in points)
    end = near.samples if near.diverged else max(left.samples, right.samples)
    if near.diverged:
        evals = tuple((s, v) for s, v in evals if s < near.samples)
    return Curve(evals, near.loss, near.noise_scale, end, near.diverged)


def _delayed(curve: Curve, delay: int, budget: int, every: int) -> Curve:
    """`curve` as if training started `delay` samples late: the accuracy at s is the original's at s - delay (its
    first evaluation before that), up to the table's budget at its batch size; samples to target grow by exactly
    `delay` when it is a multiple of the evaluation interval."""
    if delay == 0:
        return curve
    first = curve.evals[0][1] if curve.evals else 0.0
    diverges = curve.diverged and curve.end + delay <= budget
    points = [s for s in range(every, budget + 1, every) if not (diverges and s >= curve.end + delay)]
    evals = tuple((s, first if s <= delay else curve.accuracy_at(s - delay)) for s in points)

    def shift(series: Series) -> Series:
        return tuple((s + delay, v) for s, v in series if s + delay <= budget)

    end = curve.end + delay if diverges else budget
    return Curve(evals, shift(curve.loss), shift(curve.noise_scale), end, diverges)


def _held(values: dict[int, float], curve: Series, samples: int) -> float:
    """A run's accuracy at an evaluation point: recorded, or after its end (it diverged) its last one."""
    if samples in values:
        return values[samples]
    before = [v for s, v in curve if s <= samples]
    return before[-1] if before else (curve[0][1] if curve else 0.0)
