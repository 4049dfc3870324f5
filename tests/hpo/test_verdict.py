"""The verdict's numbers and its rule, against independent computations (scipy's Student t, numbers by hand)."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from hpo.verdict import NO_WINNER, ArmRuns, decide, summarize, t_quantile


def scipy_interval(values: list[int]) -> tuple[float, float, float]:
    """Mean and 95 % t interval, the textbook way with scipy."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 12, 30, 120, 1000])
def test_t_quantile_matches_scipy(df):
    assert t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-9)
    assert t_quantile(0.9, df) == pytest.approx(stats.t.ppf(0.9, df), rel=1e-9)


def test_t_quantile_matches_the_printed_table():
    assert round(t_quantile(0.975, 2), 3) == 4.303 and round(t_quantile(0.975, 4), 3) == 2.776


def test_summary_counts_misses_as_misses_and_intervals_only_the_hits():
    summary = summarize(ArmRuns("lamb", (4096, None, 6144, 5120), 12288))
    mean, low, high = scipy_interval([4096, 6144, 5120])
    assert (summary.runs, summary.hits, summary.hit_rate) == (4, 3, 0.75)
    assert summary.mean == pytest.approx(mean) and (summary.low, summary.high) == pytest.approx((low, high))
    assert "3 of 4 run(s) reached the target" in summary.describe()
    one = summarize(ArmRuns("adamw", (4096, None), 12288))
    assert one.mean == 4096 and one.low is None and "no interval" in one.describe()
    assert summarize(ArmRuns("adamw", (None, None), 12288)).mean is None


def test_a_winner_needs_every_run_on_target_and_an_interval_below_the_others():
    fast, slow = ArmRuns("lamb", (3000, 3100, 3200), 9000), ArmRuns("adamw", (6000, 6100, 6300), 9000)
    verdict = decide([slow, fast])
    assert verdict.winner == "lamb" and verdict.line.startswith("lamb wins")
    assert scipy_interval([3000, 3100, 3200])[2] < scipy_interval([6000, 6100, 6300])[1]  # the rule's premise


def test_overlapping_intervals_give_no_winner():
    a, b = ArmRuns("lamb", (3000, 5000, 4000), 9000), ArmRuns("adamw", (4500, 6500, 5500), 9000)
    assert scipy_interval([3000, 5000, 4000])[2] > scipy_interval([4500, 6500, 5500])[1]
    verdict = decide([a, b])
    assert verdict.winner is None and verdict.line == f"{NO_WINNER}: the intervals of lamb and adamw overlap"


def test_an_arm_that_missed_sometimes_cannot_win_and_one_without_interval_blocks_a_verdict():
    verdict = decide([ArmRuns("a", (3000, None, 3100), 9000), ArmRuns("b", (8000, 8100, 8200), 9000)])
    assert verdict.winner is None and "a needs fewer samples when it reaches the target" in verdict.line
    verdict = decide([ArmRuns("a", (3000, 3100), 9000), ArmRuns("b", (8000, None), 9000)])
    assert verdict.winner is None and "b reached the target in 1 of 2 run(s): no interval" in verdict.line
    verdict = decide([ArmRuns("a", (3000, 3100), 9000), ArmRuns("b", (), None)])  # b: every trial crashed
    assert verdict.winner is None and verdict.line.endswith("b has no completed run")
    verdict = decide([ArmRuns("a", (3000,), 9000), ArmRuns("b", (3500,), 9000)])  # no confirmation seeds
    assert verdict.winner is None and "no arm reached the target in every one of at least 2 runs" in verdict.line


def test_an_arm_that_never_reached_the_target_loses_only_to_an_interval_below_its_budget():
    never = ArmRuns("adamw", (None, None, None), 9000)
    assert decide([ArmRuns("lamb", (3000, 3100, 3200), 9000), never]).winner == "lamb"
    wide = ArmRuns("lamb", (1000, 8900), 9000)  # an interval reaching past 9000: no claim
    assert scipy_interval([1000, 8900])[2] > 9000
    assert decide([wide, never]).winner is None


def test_a_best_trial_that_stopped_at_a_lower_rung_without_the_target_is_not_a_run():
    """Multi-fidelity (Hyperband, ASHA): an arm's best tuning trial at 1/3 of the budget that missed says nothing
    about the samples its configuration needs beyond its rung; its confirmation runs (full budget) are the evidence.
    A trial that reached the target at a low rung is a run (its samples to target are exact)."""
    from types import SimpleNamespace

    from hpo.trials import TrialKind, TrialState
    from hpo.verdict import arm_runs
    from tests.hpo.test_objective import objective_spec

    spec = objective_spec(metric="samples_to_target")  # arms optimizer.name=adamw / lamb, 4,096 samples

    def trial(arm, budget, hit, kind=TrialKind.TUNING, lr=2e-3):
        return SimpleNamespace(arm=f"optimizer.name={arm}", budget=budget, samples_to_target=hit, kind=kind,
                               state=TrialState.COMPLETED, metrics={},
                               params={"optimizer.name": arm, f"optimizer.lr@{arm}": lr})  # fmt: skip

    short_miss, short_hit = trial("lamb", 1 / 3, None), trial("adamw", 1 / 3, 1000, lr=5e-4)
    confirm = [trial("lamb", 1.0, 3000, TrialKind.CONFIRMATION), trial("lamb", 1.0, 3200, TrialKind.CONFIRMATION),
               trial("adamw", 1.0, 1100, TrialKind.CONFIRMATION, lr=5e-4)]  # fmt: skip
    best = {"optimizer.name=lamb": short_miss, "optimizer.name=adamw": short_hit}
    runs = {a.label: a.samples_to_target for a in arm_runs(spec, best, [short_miss, short_hit, *confirm])}
    assert runs == {"optimizer.name=lamb": (3000, 3200), "optimizer.name=adamw": (1000, 1100)}
    full_miss = trial("lamb", 1.0, None)
    lamb = {"optimizer.name=lamb": full_miss}
    runs = {a.label: a.samples_to_target for a in arm_runs(spec, lamb, [full_miss, *confirm])}
    assert runs["optimizer.name=lamb"] == (None, 3000, 3200)
