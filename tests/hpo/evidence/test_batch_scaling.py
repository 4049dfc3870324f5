"""hpo.evidence.batch_scaling against closed forms: runs drawn from E(B) = E_min (1 + B / B_crit) with known E_min and
B_crit (with and without multiplicative noise), the 1.5x rule computed by hand, and the cases without a fit."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import optimize, stats

from hpo.evidence.batch_scaling import MIN_BATCH_SIZES, WELL, fit_batch_scaling

E_MIN, B_CRIT = 2.0e6, 2048.0
BATCHES = (256, 512, 1024, 2048, 4096, 8192, 16384)  # 7 sizes, B_crit inside the range
DRAWS = 200


def closed_form(batch: float, e_min: float = E_MIN, b_crit: float = B_CRIT) -> float:
    return e_min * (1 + batch / b_crit)


def noisy_runs(rng, b_crit: float, seeds: int = 3, cv: float = 0.08, batches=BATCHES) -> list[tuple[int, float]]:
    """Runs with lognormal noise of coefficient of variation `cv` around the closed form (its median)."""
    sigma = math.sqrt(math.log1p(cv * cv))
    return [
        (b, closed_form(b, b_crit=b_crit) * math.exp(rng.normal(0.0, sigma))) for b in batches for _ in range(seeds)
    ]


def test_without_noise_the_fit_is_the_closed_form():
    runs = [(b, closed_form(b)) for b in BATCHES for _ in range(3)]
    fit = fit_batch_scaling(runs)
    assert fit.reason is None and fit.note is None and fit.misses == 0 and fit.runs == 21
    assert fit.e_min.value == pytest.approx(E_MIN, rel=1e-6)
    assert fit.b_crit.value == pytest.approx(B_CRIT, rel=1e-6)
    assert fit.s_min.value == pytest.approx(E_MIN / B_CRIT, rel=1e-6)  # optimizer steps to target, unlimited batch
    for estimate in (fit.e_min, fit.b_crit, fit.s_min):  # an exact fit: the intervals are the point
        assert estimate.low == pytest.approx(estimate.value, rel=1e-6)
        assert estimate.high == pytest.approx(estimate.value, rel=1e-6)
    assert fit.sigma == pytest.approx(0.0, abs=1e-9)
    assert fit.well.value == pytest.approx(B_CRIT / 2, rel=1e-6)  # E(B_crit / 2) = 1.5 E_min
    for b in BATCHES:
        assert fit.samples(b) == pytest.approx(closed_form(b), rel=1e-6)
        assert fit.steps(b) == pytest.approx(closed_form(b) / b, rel=1e-6)
    assert [p.batch for p in fit.points] == list(BATCHES)
    for p in fit.points:
        assert p.mean == pytest.approx(closed_form(p.batch)) and p.steps == pytest.approx(
            closed_form(p.batch) / p.batch
        )


def test_the_fit_is_scipys_nonlinear_least_squares_on_ln_samples():
    runs = noisy_runs(np.random.default_rng(7), B_CRIT)
    fit = fit_batch_scaling(runs)
    x, y = np.log([b for b, _ in runs]), np.log([s for _, s in runs])
    (a, c), _ = optimize.curve_fit(lambda x, a, c: a + np.logaddexp(0.0, x - c), x, y, p0=[y.min(), np.median(x)])
    assert fit.e_min.value == pytest.approx(math.exp(a), rel=1e-5)
    assert fit.b_crit.value == pytest.approx(math.exp(c), rel=1e-5)
    residuals = y - (a + np.logaddexp(0.0, x - c))
    assert fit.sigma == pytest.approx(math.sqrt((residuals**2).sum() / (len(y) - 2)), rel=1e-5)


@pytest.mark.parametrize("b_crit", [B_CRIT, 160_000.0], ids=["inside the batches", "10x above the largest batch"])
def test_the_95_percent_intervals_cover_the_truth(b_crit):
    """200 draws of 7 batch sizes x 3 seeds, CV 8 %: measured 94.5 % (E_min) and 94 % (B_crit) with B_crit inside
    the batches, 94 % and 95 % with B_crit 10x above them."""
    rng = np.random.default_rng(0)
    fits = [fit_batch_scaling(noisy_runs(rng, b_crit)) for _ in range(DRAWS)]
    e_min = sum(f.e_min.covers(E_MIN) for f in fits) / DRAWS
    crit = sum(f.b_crit.covers(b_crit) for f in fits) / DRAWS
    steps = sum(f.s_min.covers(E_MIN / b_crit) for f in fits) / DRAWS
    assert 0.90 <= e_min <= 0.99 and 0.90 <= crit <= 0.99 and 0.90 <= steps <= 0.99, (e_min, crit, steps)
    assert all(f.e_min.low <= f.e_min.value <= f.e_min.high and f.b_crit.low <= f.b_crit.value <= f.b_crit.high
               for f in fits)  # fmt: skip
    if b_crit == B_CRIT:  # the batches reach B_crit: the intervals are closed and narrow
        assert all(math.isfinite(f.b_crit.high) and f.b_crit.low > 0 for f in fits)
        assert statistics.median(f.b_crit.high / f.b_crit.low for f in fits) < 1.5


def test_the_1_5x_rule_by_hand():
    # means 1,100, 1,200, 1,600, 2,500 at 256 to 2,048: within 1.5 x 1,100 = 1,650 the largest is 1,024
    runs = [(256, 1000), (256, 1200), (512, 1100), (512, 1300), (1024, 1500), (1024, 1700), (2048, 2400),
            (2048, 2600)]  # fmt: skip
    fit = fit_batch_scaling(runs)
    assert fit.smallest.batch == 256 and fit.smallest.mean == 1100
    well = fit.well_measured
    assert (well.batch, well.mean, well.hits) == (1024, 1600, 2)
    half = 12.706204736174703 * math.sqrt(2 * 100**2) / math.sqrt(2)  # t(0.975; 1) x sd / √2, sd = 141.4
    assert well.low == pytest.approx(1600 - half) and well.high == pytest.approx(1600 + half)
    assert well.steps == pytest.approx(1600 / 1024)
    # from the fit: E(B) <= 1.5 E_min  <=>  B <= B_crit / 2, and the fitted curve is at 1.5 E_min there
    assert fit.well.value == pytest.approx(fit.b_crit.value / 2)
    assert fit.well.low == pytest.approx(fit.b_crit.low / 2) and fit.well.high == pytest.approx(fit.b_crit.high / 2)
    assert fit.samples(fit.well.value) == pytest.approx(WELL * fit.e_min.value)


def test_the_1_5x_rule_on_the_closed_form_agrees_from_the_data_and_from_the_fit():
    # E_min 1,000, B_crit 1,000: E = 1,250, 1,500, 2,000, 3,000 at 250 to 2,000; 1.5 x 1,250 = 1,875 -> 500
    runs = [(b, 1000 * (1 + b / 1000)) for b in (250, 500, 1000, 2000)]
    fit = fit_batch_scaling(runs)
    assert fit.well_measured.batch == 500 and fit.well_measured.low is None  # one run: no interval
    assert fit.well.value == pytest.approx(500, rel=1e-6)


def test_the_largest_batch_within_1_5x_counts_even_past_a_slower_one():
    runs = [(256, 1000), (512, 1700), (1024, 1400)]  # 512 is above 1.5x, 1,024 is within again
    assert fit_batch_scaling(runs).well_measured.batch == 1024


def test_misses_are_left_out_and_counted():
    rng = np.random.default_rng(3)
    runs = noisy_runs(rng, B_CRIT)
    with_misses = fit_batch_scaling(runs + [(16384, None), (16384, None), (8192, None)])
    without = fit_batch_scaling(runs)
    assert with_misses.misses == 3 and with_misses.runs == len(runs) + 3
    assert with_misses.e_min == without.e_min and with_misses.b_crit == without.b_crit
    assert {p.batch: p.misses for p in with_misses.points}[16384] == 2
    assert {p.batch: (p.hits, p.runs) for p in with_misses.points}[8192] == (3, 4)


def test_fewer_than_three_batch_sizes_cannot_fit():
    for runs in ([(512, 1000.0)], [(512, 1000.0), (512, 1100.0), (1024, 1500.0), (2048, None)]):
        fit = fit_batch_scaling(runs)
        assert not fit.fitted and fit.e_min is fit.b_crit is fit.s_min is fit.well is fit.sigma is None
        distinct = len({b for b, s in runs if s is not None})
        assert fit.reason == (f"cannot fit: runs reached the target at {distinct} distinct batch size(s); the fit "
                              f"needs at least {MIN_BATCH_SIZES}")  # fmt: skip
        assert fit.samples(512) is None and fit.steps(512) is None
    # the per-batch means and the measured rule do not need the fit
    fit = fit_batch_scaling([(512, 1000.0), (512, 1100.0), (1024, 1500.0)])
    assert fit.well_measured.batch == 1024 and fit.smallest.mean == 1050


def test_all_misses_and_no_runs_cannot_fit():
    fit = fit_batch_scaling([(256, None), (512, None), (1024, None)])
    assert fit.reason == "cannot fit: no run reached the target (3 misses)"
    assert fit.misses == 3 and fit.smallest is None and fit.well_measured is None
    assert [p.mean for p in fit.points] == [None, None, None]
    assert fit_batch_scaling([]).reason == "cannot fit: no runs"


def test_degenerate_data_gives_the_models_limits():
    # the same samples at every batch: E flat, B_crit above every batch
    flat = fit_batch_scaling([(b, 5000.0) for b in (256, 512, 1024)])
    assert flat.b_crit.value == math.inf and flat.e_min.value == pytest.approx(5000.0)
    assert flat.s_min.value == 0.0 and flat.well.value == math.inf and "E flat" in flat.note
    # samples in proportion to the batch (constant steps): B_crit and E_min 0, S_min the steps
    steady = fit_batch_scaling([(b, 3.0 * b) for b in (256, 512, 1024, 2048)])
    assert steady.b_crit.value == 0.0 and steady.e_min.value == 0.0 and "E = S_min B" in steady.note
    assert steady.s_min.value == pytest.approx(3.0) and steady.samples(4096) == pytest.approx(3.0 * 4096)
    # fewer samples at larger batches (the model cannot go down): the flat limit, with an interval
    down = fit_batch_scaling([(b, 1e5 / b**0.3) for b in (256, 512, 1024, 2048)])
    assert down.b_crit.value == math.inf and down.b_crit.high == math.inf and 0 < down.b_crit.low < math.inf
    assert down.e_min.low < down.e_min.value < down.e_min.high


def test_scattered_samples_without_a_trend_give_an_open_interval():
    runs = [(256, 1050.0), (256, 950.0), (512, 950.0), (512, 1050.0), (1024, 1040.0), (1024, 950.0)]
    fit = fit_batch_scaling(runs)  # no growth with the batch: B_crit at least some value, perhaps unlimited
    assert fit.b_crit.value == math.inf and fit.b_crit.high == math.inf and 256 < fit.b_crit.low < math.inf
    assert fit.s_min.low == 0.0 and math.isfinite(fit.s_min.high)
    assert fit.e_min.low < 1000 < fit.e_min.high and math.isfinite(fit.e_min.high)


def test_values_that_are_no_measurement_are_refused():
    for runs in ([(0, 1.0)], [(-4, 1.0)], [(math.inf, 1.0)], [(8, 0.0)], [(8, -1.0)], [(8, math.nan)]):
        with pytest.raises(ValueError):
            fit_batch_scaling(runs)


def test_the_means_interval_is_students_t():
    fit = fit_batch_scaling([(64, 900.0), (64, 1000.0), (64, 1300.0)])
    point = fit.points[0]
    half = stats.t.ppf(0.975, 2) * statistics.stdev([900, 1000, 1300]) / math.sqrt(3)
    assert (point.low, point.high) == pytest.approx((point.mean - half, point.mean + half))
