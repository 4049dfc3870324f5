"""Which hyperparameters mattered in an arm: permutation importance on a random-forest surrogate.

The surrogate (scikit-learn's RandomForestRegressor, 100 trees, fixed seed) maps an arm's tuned parameters to
the rank of each trial's stored objective, best = 0. Ranks, not objective values: a miss of a "to target" metric
stores a penalty (penalty_factor x cap x (1 + gap)) that must order it after every hit, closer misses first,
without its size stretching the fit. Failed and unfinished trials and trials that failed on bad data are left
out. Log-scale parameters enter as log10, choices as their index, a parameter inactive in a trial (a condition)
as one value below its range.

Importance of a parameter: how much the surrogate's R² on the trials drops when that parameter's column is
shuffled (scikit-learn's permutation importance, 5 repeats; `permutation_drops`), with the spread over the repeats. The
surrogate's own out-of-bag R² says whether it explains anything: at or below 0 it does not, and the ranking
is noise. With fewer than `MIN_TRIALS` usable trials (or 3 per parameter) there is no ranking at all.

An arm with more than `MAX_TRIALS` usable trials is ranked on `MAX_TRIALS` of them, a fixed stride in trial order
(the same trials every time): fitting and permuting cost about a millisecond per trial, 5 s for an arm of 5,000,
and 500 trials are ample for at most a dozen parameters. The ranks are those within the subset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hpo.report.data import Dimension, TrialRow

MIN_TRIALS = 10
PER_DIMENSION = 3
TREES = 100
REPEATS = 5
MAX_TRIALS = 500


@dataclass(frozen=True)
class Importance:
    """An arm's ranking (most important first), or why there is none (`reason`)."""

    ranking: tuple[tuple[str, float, float], ...]  # (parameter, mean R² drop, its std over repeats)
    oob_r2: float | None
    trials: int  # the trials the surrogate was fitted on
    reason: str | None = None
    usable: int | None = None  # the arm's usable trials, when more than were fitted (see `subsample`)


def usable(rows: Sequence[TrialRow]) -> list[TrialRow]:
    """Trials the surrogate learns from: those with a stored objective that ended normally or diverged/timed out."""
    keep = ("reached", "missed", "diverged", "timeout")
    return [r for r in rows if r.outcome in keep and r.objective is not None and math.isfinite(r.objective)]


def subsample(rows: Sequence[TrialRow], most: int = MAX_TRIALS) -> list[TrialRow]:
    """At most `most` of `rows`, a fixed stride over them in their order (all of them when they fit)."""
    return list(rows) if len(rows) <= most else [rows[i * len(rows) // most] for i in range(most)]


def rank_importance(rows: Sequence[TrialRow], dims: Sequence[Dimension], direction: str) -> Importance:
    """The permutation importance of every varying dimension over the arm's tuning trials (at most MAX_TRIALS of
    them, see the module docstring)."""
    every = usable(rows)
    rows = subsample(every)
    of = len(every) if len(every) > len(rows) else None
    varying = [d for d in dims if len({repr(r.params.get(d.name)) for r in rows}) > 1]
    needed = max(MIN_TRIALS, PER_DIMENSION * len(varying))
    if varying == [] and len(rows) >= MIN_TRIALS:
        return Importance((), None, len(rows), "no tuned parameter varies between these trials")
    if len(rows) < needed:
        return Importance((), None, len(rows), f"too few trials to rank: {len(rows)} usable, {needed} needed "
                                               f"({MIN_TRIALS} at least, {PER_DIMENSION} per parameter)")  # fmt: skip
    from sklearn.ensemble import RandomForestRegressor

    x = np.array([[_encode(r.params.get(d.name), d) for d in varying] for r in rows], dtype=float)
    x = np.where(np.isnan(x), np.nanmin(x, axis=0, initial=np.inf) - 1.0, x)  # inactive: below the range
    y = _ranks([r.objective for r in rows], direction)
    forest = RandomForestRegressor(n_estimators=TREES, oob_score=True, random_state=0, min_samples_leaf=2)
    forest.fit(x, y)
    drops = permutation_drops(forest, x, y, REPEATS, seed=0)
    mean, std = drops.mean(axis=1), drops.std(axis=1)
    order = np.argsort(-mean, kind="stable")
    ranking = tuple((varying[i].name, float(mean[i]), float(std[i])) for i in order)
    return Importance(ranking, float(forest.oob_score_), len(rows), usable=of)


def permutation_drops(forest, x: np.ndarray, y: np.ndarray, repeats: int, seed: int) -> np.ndarray:
    """The drop in the forest's R² when each column is shuffled, `repeats` times per column: an array (columns,
    repeats) equal to `sklearn.inspection.permutation_importance(forest, x, y, n_repeats=repeats,
    random_state=seed).importances` (the same shuffles: one seed drawn from `seed`, each column's shuffles drawn
    from it again, each repeat shuffling the column further), with one `predict` over all the shuffled copies
    instead of one per copy: a 100-tree forest's predict costs about 15 ms of overhead whatever the rows, and a
    10,000-trial report asked 52 of them (tests/hpo/test_report_importance.py checks the equality)."""
    from sklearn.metrics import r2_score

    n, columns = x.shape
    column_seed = np.random.RandomState(seed).randint(np.iinfo(np.int32).max + 1)
    copies = []
    for column in range(columns):
        rng, shuffled, order = np.random.RandomState(column_seed), x.copy(), np.arange(n)
        for _ in range(repeats):
            rng.shuffle(order)
            shuffled[:, column] = shuffled[order, column]
            copies.append(shuffled.copy())
    predicted = forest.predict(np.vstack([x, *copies])).reshape(-1, n)
    baseline = r2_score(y, predicted[0])
    scores = np.array([r2_score(y, p) for p in predicted[1:]]).reshape(columns, repeats)
    return baseline - scores


def _ranks(objectives: Sequence[float], direction: str) -> np.ndarray:
    """0 for the best objective, ties sharing the mean of their ranks."""
    signed = np.array(objectives, dtype=float) * (-1.0 if direction == "maximize" else 1.0)
    values, inverse = np.unique(signed, return_inverse=True)
    counts = np.bincount(inverse, minlength=len(values))
    first = np.cumsum(counts) - counts  # the rank of each distinct value's first occurrence
    return (first + (counts - 1) / 2.0)[inverse]


def _encode(value, dim: Dimension) -> float:
    """A number the forest can split on (see the module docstring)."""
    if dim.kind == "choice":
        return float(dim.choices.index(value)) if value in dim.choices else -1.0
    if value is None:
        return math.nan  # inactive: placed below the column's range by `rank_importance`
    return math.log10(value) if dim.log and value > 0 else float(value)
