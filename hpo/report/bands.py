"""Best-so-far curves of an arm's tuning trials, and a bootstrap band over trial order.

The observed curve is the best measured value after each trial, in the order the trials ran (a miss changes
nothing; before the first measured value there is no curve). It is one draw of a random process: another order
of the same trials, or other trials from the same tuner, would give another curve. The band says how much:
each of `B` resamples draws the arm's n trials with replacement, in random order, and takes its best-so-far
curve; the band is the 2.5 % and 97.5 % quantiles of those curves at each point (quantiles of actual draws, no
interpolation). Where some resamples have no measured value yet, the band is open on the bad side (drawn up to
the edge of the plot): a resample of misses only has no best.

Against training samples the x-axis is the samples the arm's trials used, added up in trial order; each
resample's curve is read on a common grid of 100 points up to the arm's total.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 200
GRID_POINTS = 100
LEVEL = 0.95


@dataclass(frozen=True)
class Band:
    """A best-so-far curve at positions `x`, with the band's low and high (NaN: no value; ±inf: open)."""

    x: np.ndarray
    best: np.ndarray  # the observed curve (NaN before the first measured value)
    low: np.ndarray
    high: np.ndarray


def best_so_far(values: Sequence[float | None], direction: str) -> np.ndarray:
    """The best measured value after each trial (NaN until the first one)."""
    signed = _signed(values, direction)
    if not len(signed):
        return signed
    running = np.minimum.accumulate(np.where(np.isnan(signed), np.inf, signed))
    return _unsigned(np.where(np.isinf(running), np.nan, running), direction)


def band_over_trials(values: Sequence[float | None], direction: str, seed: int = 0) -> Band:
    """The observed best-so-far after 1..n trials and its bootstrap band (see the module docstring)."""
    signed = np.where(np.isnan(s := _signed(values, direction)), np.inf, s)
    n = len(signed)
    x = np.arange(1, n + 1, dtype=float)
    if n == 0:
        return Band(x, x, x, x)
    rng = np.random.default_rng(seed)
    draws = signed[rng.integers(0, n, size=(RESAMPLES, n))]
    curves = np.minimum.accumulate(draws, axis=1)
    return _band(x, best_so_far(values, direction), curves, direction)


def band_over_cost(values: Sequence[float | None], costs: Sequence[float | None], direction: str,
                   seed: int = 0) -> Band:  # fmt: skip
    """The best-so-far against the cost used so far (training samples, GPU-hours), with its bootstrap band."""
    signed = np.where(np.isnan(s := _signed(values, direction)), np.inf, s)
    cost = np.array([c or 0.0 for c in costs], dtype=float)
    n = len(signed)
    if n == 0 or cost.sum() <= 0:
        empty = np.array([], dtype=float)
        return Band(empty, empty, empty, empty)
    grid = np.linspace(0.0, cost.sum(), GRID_POINTS)
    observed = _read_on_grid(np.cumsum(cost), np.minimum.accumulate(signed), grid)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n, size=(RESAMPLES, n))
    curves = np.stack([_read_on_grid(np.cumsum(cost[p]), np.minimum.accumulate(signed[p]), grid) for p in picks])
    return _band(grid, _unsigned(np.where(np.isinf(observed), np.nan, observed), direction), curves, direction)


def _read_on_grid(cum_cost: np.ndarray, running: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The running best at each grid point: the best of the trials whose cost was all used by then."""
    index = np.searchsorted(cum_cost, grid, side="right") - 1
    return np.where(index >= 0, running[np.clip(index, 0, None)], np.inf)


def _band(x: np.ndarray, observed: np.ndarray, curves: np.ndarray, direction: str) -> Band:
    tail = (1 - LEVEL) / 2
    low = np.quantile(curves, tail, axis=0, method="inverted_cdf")
    high = np.quantile(curves, 1 - tail, axis=0, method="inverted_cdf")
    if direction == "maximize":  # the best side (signed low) is the high value once the sign is undone
        low, high = -high, -low
    return Band(x, observed, low, high)


def _signed(values: Sequence[float | None], direction: str) -> np.ndarray:
    """Values to minimize (NaN for None)."""
    array = np.array([np.nan if v is None else float(v) for v in values], dtype=float)
    return -array if direction == "maximize" else array


def _unsigned(array: np.ndarray, direction: str) -> np.ndarray:
    return -array if direction == "maximize" else array
