"""Where a batch size stops scaling: samples to target against global batch size, fitted with McCandlish et al.
2018 ("An Empirical Model of Large-Batch Training"), and the largest batch that still scales well.

The model. Optimizer steps to target S and samples to target E = S · B at global batch size B follow
S = S_min (1 + B_noise / B), equivalently E(B) = E_min (1 + B / B_crit), with B_crit = E_min / S_min: far below
B_crit a larger batch needs about as many samples (and proportionally fewer steps); far above it, as many steps
(and proportionally more samples). E_min is the samples to target at a small batch, S_min the steps to target at
an unlimited one.

Evidence. Any runs, each a (global batch size, samples to target) pair: the confirmation runs of several arms or
experiments, an import, reference points. A miss (None: the run never reached the target) has no samples to
target; it is left out of the fit and of the means and counted (`misses`, and per batch size). Leaving misses out
flatters the batch sizes where they happen (their means are over the lucky runs only), so a batch size with a miss
says so wherever it is shown.

The fit: nonlinear least squares on ln E, i.e. ln E_i = ln E_min + ln(1 + B_i / B_crit) + ε_i with ε normal of one
spread (multiplicative noise, a constant coefficient of variation, which is how samples to target scatter over
seeds). It is solved by profiling (variable projection): for a fixed c = ln B_crit the best ln E_min is the mean of
ln E_i - ln(1 + B_i / B_crit), which leaves a one-dimensional search over c (a grid from GRID_MARGIN below the
smallest to GRID_MARGIN above the largest batch, in ln units, then scipy's bounded Brent between the best grid
point's neighbours). The ends of that range are the model's two limits: c -> +inf is E flat in B (B_crit above
every batch: `B_crit = inf`, S_min = 0), c -> -inf is E proportional to B (steps constant: B_crit = E_min = 0,
S_min finite); a best fit at either end is reported as that limit, in words in `note`.

The intervals (95 %): profile likelihood with the F calibration of nonlinear regression (Bates & Watts 1988,
ch. 6): with n hits and the least residual sum of squares SSR_min, every (ln E_min, c) whose SSR is at most
T = SSR_min (1 + F(level; 1, n - 2) / (n - 2)) is in the joint region, and a quantity's interval is its range over
that region. For a fixed c the SSR is SSR(c) + n (ln E_min - â(c))², so the interval of ln E_min is the union over
c of â(c) ± √((T - SSR(c)) / n), and that of ln S_min = ln E_min - c the same shifted by -c; the interval of c is
where SSR(c) <= T. An interval is open where the region reaches a limit of the model: B_crit's high end is inf where
a flat E fits within T, its low end (and E_min's) is 0 where E proportional to B does.

Coverage, measured on runs drawn from the closed form with lognormal noise (200 draws each, numpy seed 0;
tests/hpo/evidence/test_batch_scaling.py runs the first two), E_min and B_crit:
- 7 batch sizes 256 to 16,384, 3 seeds each, CV 8 %, B_crit 2,048: 94.5 %, 94 % (1,000 draws at seed 123:
  95.4 %, 95.4 %);
- the same with B_crit 160,000, 10x above the largest batch: 94 %, 95 % (111 of the 200 B_crit intervals open
  above);
- B_crit 16, 16x below the smallest batch: 98 %, 98 %;
- 3 batch sizes (512, 2,048, 8,192) with one seed each: 96 %, 95.5 %.
Chosen over the Wald interval (t x the standard errors of curve_fit's covariance, on ln E_min and ln B_crit), which
covers as well while B_crit is inside the measured range but has no answer at the model's limits (a singular
covariance) and covered 91 % with B_crit 16x below the batches.

Scaling well: the largest batch at which E(B) <= WELL · E_min (1.5: at most 50 % more samples than a small batch
needs). From the fit that is B <= B_crit (WELL - 1) = B_crit / 2, with B_crit's interval halved. From the data,
without the model: the largest measured batch whose mean samples to target (over its hits) is within WELL x the
smallest mean of any measured batch, shown with that mean's 95 % t interval.

Pure: numbers in, numbers out; nothing is read or written. Fewer than MIN_BATCH_SIZES distinct batch sizes with a
hit (or no hit at all) is not an error: the result has no fit and says why in `reason`, and the per-batch means
and the measured rule are still given.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import special  # the t and F quantiles of scipy.stats (stdtrit, fdtri), without its import time

LEVEL = 0.95  # the intervals' confidence
WELL = 1.5  # "scaling well": E(B) <= WELL · E_min
MIN_BATCH_SIZES = 3  # distinct batch sizes with a hit that a fit needs (two parameters, and one to check them)
GRID_MARGIN = 12.0  # the profile's search reaches this far (ln units) beyond the measured batch sizes
GRID_POINTS = 2001
EXACT = 1e-12  # a residual spread of ln samples below this is rounding: the fit is exact


@dataclass(frozen=True)
class Estimate:
    """A fitted quantity and its interval; `low` 0 and `high` inf where the interval is open on that side."""

    value: float
    low: float
    high: float

    def covers(self, truth: float) -> bool:
        return self.low <= truth <= self.high


@dataclass(frozen=True)
class BatchPoint:
    """The runs at one global batch size."""

    batch: float
    runs: int
    hits: int
    mean: float | None  # mean samples to target over the hits (None: no hit)
    low: float | None  # its t interval (None with fewer than 2 hits)
    high: float | None

    @property
    def misses(self) -> int:
        return self.runs - self.hits

    @property
    def steps(self) -> float | None:
        """Mean optimizer steps to target: mean samples to target / batch size."""
        return None if self.mean is None else self.mean / self.batch


@dataclass(frozen=True)
class BatchScaling:
    """The fit of E(B) = E_min (1 + B / B_crit) to a set of runs, and where the batch stops scaling well."""

    points: tuple[BatchPoint, ...]  # per batch size, ascending
    runs: int
    misses: int  # runs that missed the target: left out of the fit and the means
    e_min: Estimate | None  # samples to target at a small batch (None: no fit, see `reason`)
    b_crit: Estimate | None  # the critical batch size
    s_min: Estimate | None  # optimizer steps to target at an unlimited batch, E_min / B_crit
    well: Estimate | None  # from the fit: the largest batch with E(B) <= WELL · E_min, B_crit (WELL - 1)
    smallest: BatchPoint | None  # the measured batch with the smallest mean samples to target
    well_measured: BatchPoint | None  # the largest measured batch whose mean is within WELL x the smallest
    sigma: float | None  # residual spread of ln samples to target (≈ the runs' coefficient of variation)
    level: float = LEVEL
    reason: str | None = None  # why there is no fit
    note: str | None = None  # a fit at a limit of the model, in words

    @property
    def fitted(self) -> bool:
        return self.e_min is not None

    def samples(self, batch: float) -> float | None:
        """The fitted samples to target E(B) (None without a fit)."""
        if self.e_min is None or self.b_crit is None:
            return None
        if self.b_crit.value == 0:  # E proportional to B: E = S_min B
            return self.s_min.value * batch
        return self.e_min.value * (1 + batch / self.b_crit.value)

    def steps(self, batch: float) -> float | None:
        """The fitted optimizer steps to target E(B) / B (None without a fit)."""
        samples = self.samples(batch)
        return None if samples is None else samples / batch


def fit_batch_scaling(runs: Iterable[tuple[float, float | None]], level: float = LEVEL) -> BatchScaling:
    """Fit E(B) = E_min (1 + B / B_crit) to runs given as (global batch size, samples to target or None for a miss);
    see the module docstring for the method. Raises ValueError only on values that are no measurement (a batch
    size or samples to target not positive and finite)."""
    pairs = [_checked(batch, samples) for batch, samples in runs]
    points = tuple(_point(b, [s for bb, s in pairs if bb == b], level) for b in sorted({b for b, _ in pairs}))
    misses = sum(p.misses for p in points)
    measured = [p for p in points if p.mean is not None]
    smallest = min(measured, key=lambda p: (p.mean, p.batch), default=None)
    well_measured = max((p for p in measured if p.mean <= WELL * smallest.mean), key=lambda p: p.batch,
                        default=None)  # fmt: skip
    common = {"points": points, "runs": len(pairs), "misses": misses, "smallest": smallest,
              "well_measured": well_measured, "level": level}  # fmt: skip
    hits = [(b, s) for b, s in pairs if s is not None]
    distinct = len({b for b, _ in hits})
    if distinct < MIN_BATCH_SIZES:
        if not pairs:
            why = "no runs"
        elif not hits:
            why = f"no run reached the target ({misses} miss{'es' if misses != 1 else ''})"
        else:
            why = (f"runs reached the target at {distinct} distinct batch size(s); the fit needs at least "
                   f"{MIN_BATCH_SIZES}")  # fmt: skip
        return BatchScaling(e_min=None, b_crit=None, s_min=None, well=None, sigma=None, reason=f"cannot fit: {why}",
                            **common)  # fmt: skip
    fit = _Profile(np.log([b for b, _ in hits]), np.log([s for _, s in hits]), level)
    return BatchScaling(e_min=fit.e_min, b_crit=fit.b_crit, s_min=fit.s_min,
                        well=Estimate(fit.b_crit.value * (WELL - 1), fit.b_crit.low * (WELL - 1),
                                      fit.b_crit.high * (WELL - 1)),
                        sigma=fit.sigma, note=fit.note, **common)  # fmt: skip


def _checked(batch: float, samples: float | None) -> tuple[float, float | None]:
    if not (isinstance(batch, (int, float)) and math.isfinite(batch) and batch > 0):
        raise ValueError(f"a global batch size must be positive and finite, not {batch!r}")
    if samples is not None and not (isinstance(samples, (int, float)) and math.isfinite(samples) and samples > 0):
        raise ValueError(f"samples to target must be positive and finite (None for a miss), not {samples!r}")
    return float(batch), None if samples is None else float(samples)


def _point(batch: float, samples: list[float | None], level: float) -> BatchPoint:
    hits = [s for s in samples if s is not None]
    mean = statistics.fmean(hits) if hits else None
    low = high = None
    if len(hits) >= 2:
        half = float(special.stdtrit(len(hits) - 1, 0.5 + level / 2)) * statistics.stdev(hits) / math.sqrt(len(hits))
        low, high = mean - half, mean + half
    return BatchPoint(batch, len(samples), len(hits), mean, low, high)


class _Profile:
    """The profile fit on ln samples (module docstring): x = ln B, y = ln E, c = ln B_crit."""

    def __init__(self, x: np.ndarray, y: np.ndarray, level: float):
        self.x, self.y, n = x, y, len(y)
        df = n - 2
        grid = np.linspace(x.min() - GRID_MARGIN, x.max() + GRID_MARGIN, GRID_POINTS)
        ssr = self.ssr(grid)
        # the model's limits: c -> +inf, E flat (ln E_min = mean y); c -> -inf, E = S_min B (ln S_min = mean(y - x))
        self.flat_a, self.flat_ssr = float(y.mean()), float(((y - y.mean()) ** 2).sum())
        self.prop_s = float((y - x).mean())
        self.prop_ssr = float(((y - x - self.prop_s) ** 2).sum())
        i = int(np.argmin(ssr))
        if i == 0:
            c_hat, ssr_min = -math.inf, self.prop_ssr
        elif i == len(grid) - 1:
            c_hat, ssr_min = math.inf, self.flat_ssr
        else:
            best = _optimize().minimize_scalar(lambda c: float(self.ssr(np.array([c]))[0]), method="bounded",
                                            bounds=(grid[i - 1], grid[i + 1]), options={"xatol": 1e-10})  # fmt: skip
            c_hat, ssr_min = (float(best.x), float(best.fun)) if best.fun <= ssr[i] else (float(grid[i]), float(ssr[i]))
        if ssr_min <= n * EXACT**2:  # an exact fit (rounding aside): a region of one point
            ssr_min = 0.0
        self.sigma = math.sqrt(ssr_min / df)
        self.threshold = ssr_min * (1 + float(special.fdtri(1, df, level)) / df)
        self.n, self.grid, self.grid_ssr, self.c_hat = n, grid, ssr, c_hat
        lo, hi = self._c_range()
        self.c_low, self.c_high = lo, hi
        if math.isfinite(c_hat):
            e_hat = float(self._a(np.array([c_hat]))[0])
            s_hat = e_hat - c_hat
        else:  # a limit: flat (E_min the geometric mean, S_min 0) or proportional (E_min 0, S_min finite)
            e_hat, s_hat = (self.flat_a, -math.inf) if c_hat > 0 else (-math.inf, self.prop_s)
        self.b_crit = Estimate(math.exp(c_hat) if c_hat < math.inf else math.inf, _exp(lo), _exp(hi))
        self.e_min = Estimate(_exp(e_hat), *map(_exp, self._range(steps=False)))
        self.s_min = Estimate(_exp(s_hat), *map(_exp, self._range(steps=True)))
        self.note = None
        if c_hat == math.inf:
            self.note = ("samples to target do not grow with the batch over the measured range: B_crit lies above "
                         "every measured batch (best fit: E flat)")  # fmt: skip
        elif c_hat == -math.inf:
            self.note = ("samples to target grow in proportion to the batch (constant steps to target): B_crit lies "
                         "below every measured batch (best fit: E = S_min B)")  # fmt: skip

    def ssr(self, c: np.ndarray) -> np.ndarray:
        """The least SSR at each c (ln E_min at its best, the mean residual)."""
        r = self.y[None, :] - np.logaddexp(0.0, self.x[None, :] - np.asarray(c, dtype=float)[:, None])
        return ((r - r.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)

    def _a(self, c: np.ndarray) -> np.ndarray:
        """â(c): the best ln E_min at each c, the mean of ln E - ln(1 + B / B_crit)."""
        return (self.y[None, :] - np.logaddexp(0.0, self.x[None, :] - np.asarray(c, dtype=float)[:, None])).mean(axis=1)

    def _c_range(self) -> tuple[float, float]:
        """The hull of {c: SSR(c) <= T}. An end at the grid's edge is open: that far out the fit cannot tell the
        curve from the model's limit."""
        c_hat, grid = self.c_hat, self.grid
        if self.threshold <= 0:  # an exact fit: the region is one point
            return c_hat, c_hat
        inside = np.flatnonzero(self.grid_ssr <= self.threshold)

        def excess(c: float) -> float:
            return float(self.ssr(np.array([c]))[0]) - self.threshold

        if c_hat == -math.inf or (len(inside) and inside[0] == 0):
            low = -math.inf
        else:
            first = min(grid[inside[0]] if len(inside) else math.inf, c_hat)
            first = grid[-1] if first == math.inf else first
            outer = grid[np.searchsorted(grid, first) - 1]
            low = float(_optimize().brentq(excess, outer, first, xtol=1e-12)) if excess(first) < 0 else float(first)
        if c_hat == math.inf or (len(inside) and inside[-1] == len(grid) - 1):
            high = math.inf
        else:
            last = max(grid[inside[-1]] if len(inside) else -math.inf, c_hat)
            last = grid[0] if last == -math.inf else last
            outer = grid[np.searchsorted(grid, last, side="right")]
            high = float(_optimize().brentq(excess, last, outer, xtol=1e-12)) if excess(last) < 0 else float(last)
        return low, high

    def _range(self, steps: bool) -> tuple[float, float]:
        """The interval of ln E_min (ln S_min = ln E_min - c with `steps`) over the region: the least of
        â(c) - r(c) and the largest of â(c) + r(c), r(c) = √((T - SSR(c)) / n), over c in it (module docstring),
        on the grid, refined by bounded Brent between the best point's neighbours; then the model's limits."""
        lo_c, hi_c = self.c_low, self.c_high
        finite = [c for c in (lo_c, self.c_hat, hi_c) if math.isfinite(c)]
        cs = np.unique(np.concatenate([self.grid[(self.grid > lo_c) & (self.grid < hi_c)], finite]))

        if len(cs):  # a region with gaps: only its points (and the estimate, the one point of an exact fit)
            cs = cs[(self.ssr(cs) <= self.threshold * (1 + 1e-9)) | (cs == self.c_hat)]

        def bound(c: np.ndarray, sign: float) -> np.ndarray:
            room = np.maximum(self.threshold - self.ssr(c), 0.0)
            return self._a(c) - (c if steps else 0.0) + sign * np.sqrt(room / self.n)

        out = []
        for sign in (-1.0, 1.0):  # minimize -sign * bound: the least lower bound, the largest upper bound
            best = math.inf
            if len(cs):
                values = -sign * bound(cs, sign)
                j = int(np.argmin(values))
                best = float(values[j])
                left, right = cs[max(j - 1, 0)], cs[min(j + 1, len(cs) - 1)]
                if right > left:
                    found = _optimize().minimize_scalar(lambda c, s=sign: float(-s * bound(np.array([c]), s)[0]),
                                                     method="bounded", bounds=(left, right),
                                                     options={"xatol": 1e-10})  # fmt: skip
                    if self.ssr(np.array([found.x]))[0] <= self.threshold:
                        best = min(best, float(found.fun))
            out.append(self._limit(-sign * best, sign, steps))
        return out[0], out[1]

    def _limit(self, value: float, sign: float, steps: bool) -> float:
        """Where the region reaches a limit of the model the bound follows it: with c -> -inf in the region,
        ln E_min -> -inf (E_min 0); with c -> +inf, ln S_min -> -inf; a limit with a finite value enters as one
        more candidate (E flat for ln E_min, E proportional to B for ln S_min)."""
        open_low, open_high = self.c_low == -math.inf, self.c_high == math.inf
        if sign < 0 and ((open_low and not steps) or (open_high and steps)):
            return -math.inf
        candidates = [value]
        if open_high and not steps:
            candidates.append(self.flat_a + sign * math.sqrt(max(self.threshold - self.flat_ssr, 0.0) / self.n))
        if open_low and steps:
            candidates.append(self.prop_s + sign * math.sqrt(max(self.threshold - self.prop_ssr, 0.0) / self.n))
        finite = [v for v in candidates if math.isfinite(v)]
        if not finite:
            return value
        return min(finite) if sign < 0 else max(finite)


def _optimize():
    """scipy.optimize, imported when a fit first needs it: every report imports this module, few fit a batch size."""
    from scipy import optimize

    return optimize


def _exp(v: float) -> float:
    return 0.0 if v == -math.inf else math.inf if v == math.inf else math.exp(v)
