"""The verdict's numbers and its rule, against independent computations (scipy's Welch test, numbers by hand)."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from hpo.evidence.verdict import (
    ALPHA,
    ArmRuns,
    Outcome,
    _pct,
    decide,
    look_level,
    samples_between_evaluations,
    summarize,
    t_quantile,
)


def scipy_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95 % t interval, the textbook way with scipy."""
    mean = float(np.mean(values))
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    return mean, low, high


def welch_ratio(a: list[float], b: list[float], confidence: float) -> tuple[float, float, float]:
    """exp of scipy's Welch interval of mean(ln a) - mean(ln b): the ratio a/b and its interval."""
    test = stats.ttest_ind(np.log(a), np.log(b), equal_var=False)
    low, high = test.confidence_interval(confidence)
    return math.exp(np.mean(np.log(a)) - np.mean(np.log(b))), math.exp(low), math.exp(high)


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 12, 30, 120, 1000, 5.5])
def test_t_quantile_is_scipys(df):
    assert t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-12)
    assert round(t_quantile(0.975, 2), 3) == 4.303  # the printed table


def test_summary_counts_misses_as_misses_and_intervals_only_the_hits():
    summary = summarize(ArmRuns("lamb", (4096, None, 6144, 5120), 12288))
    mean, low, high = scipy_interval([4096, 6144, 5120])
    assert (summary.runs, summary.hits, summary.hit_rate) == (4, 3, 0.75)
    assert summary.mean == pytest.approx(mean) and (summary.low, summary.high) == pytest.approx((low, high))
    assert "3 of 4 run(s) reached the target" in summary.describe()
    one = summarize(ArmRuns("adamw", (4096, None), 12288))
    assert one.mean == 4096 and one.low is None and "no interval" in one.describe()


# -- the difference between two arms -------------------------------------------------------------------------

FAST = [6100.0, 6300.0, 5900.0, 6200.0, 6050.0]
SLOW = [8000.0, 8300.0, 7900.0, 8500.0, 8150.0]


def test_a_winner_is_named_when_welchs_interval_of_the_ratio_lies_below_one():
    verdict = decide([ArmRuns("adamw", tuple(SLOW), 12288), ArmRuns("lamb", tuple(FAST), 12288)])
    ratio, low, high = welch_ratio(FAST, SLOW, 0.96)  # the tests run at 4 % (a wrong winner in at most 5 %)
    assert high < 1  # the premise: scipy's test rejects a tie
    assert verdict.outcome is Outcome.WINNER and verdict.winner == "lamb"
    (c,) = verdict.comparisons
    assert (c.a, c.b) == ("lamb", "adamw")
    assert (c.ratio, c.low, c.high) == pytest.approx((ratio, low, high), rel=1e-9)
    assert verdict.line.startswith(f"lamb needs {100 * (1 - ratio):.1f} % fewer samples than adamw (96 % interval "
                                   f"{100 * (1 - high):.1f} % to {100 * (1 - low):.1f} % fewer")  # fmt: skip
    geometric_slow = math.exp(np.mean(np.log(SLOW)))
    assert f"{(1 - ratio) * geometric_slow:,.0f} fewer samples" in verdict.line and "[margin ±5 %]" in verdict.line


def test_the_p_value_and_the_interval_agree_at_the_boundary():
    """Welch's p-value below the level exactly when the interval excludes a ratio of 1 (scipy, two samples that
    differ a little: one at the edge of deciding)."""
    for shift in np.linspace(0.0, 0.12, 25):
        b = [v * math.exp(shift) for v in [6000.0, 6400.0, 5800.0]]
        a = [6000.0, 6200.0, 6100.0]
        decided = decide([ArmRuns("a", tuple(a), 12288), ArmRuns("b", tuple(b), 12288)]).outcome is Outcome.WINNER
        assert decided == (stats.ttest_ind(np.log(a), np.log(b), equal_var=False).pvalue < ALPHA)


def test_equivalence_is_two_one_sided_tests_inside_the_margin():
    a = [8000.0, 8100.0, 7950.0, 8050.0, 8020.0, 7990.0]
    b = [8010.0, 8080.0, 7970.0, 8060.0, 8000.0, 8030.0]
    ratio, low, high = welch_ratio(a, b, 0.92)  # TOST at 4 % a side = the 92 % interval
    assert low > 0.95 and high < 1.05
    verdict = decide([ArmRuns("a", tuple(a), 12288), ArmRuns("b", tuple(b), 12288)], margin=0.05)
    assert verdict.outcome is Outcome.EQUIVALENT and verdict.winner is None
    (c,) = verdict.comparisons
    assert (c.equivalence_low, c.equivalence_high) == pytest.approx((low, high), rel=1e-9)
    assert verdict.line.startswith("a and b are equivalent within ±5 %")
    # the same runs with a margin the interval does not fit in: not yet
    tight = decide([ArmRuns("a", tuple(a), 12288), ArmRuns("b", tuple(b), 12288)], margin=(high - 1) / 2)
    assert tight.outcome is Outcome.NOT_YET and tight.runs_needed > 6


def test_not_yet_says_how_many_runs_would_likely_decide():
    a, b = [8000.0, 8600.0, 7500.0], [7400.0, 8200.0, 7000.0]
    verdict = decide([ArmRuns("a", tuple(a), 12288), ArmRuns("b", tuple(b), 12288)])
    assert verdict.outcome is Outcome.NOT_YET
    spread = math.sqrt((np.var(np.log(a), ddof=1) + np.var(np.log(b), ddof=1)) / 2)
    d = abs(np.mean(np.log(a)) - np.mean(np.log(b)))
    by_hand = 2 * ((stats.norm.ppf(0.98) + stats.norm.ppf(0.8)) * spread / d) ** 2  # 80 % power at 4 %
    assert verdict.runs_needed == math.ceil(by_hand)
    assert f"about {verdict.runs_needed} runs per arm would likely decide (now 3)" in verdict.line


def test_a_miss_is_censored_at_the_budget_and_never_wins():
    """A miss enters as the budget (the least it would have needed): the arm that missed may lose, never win."""
    budget = 12288
    never = ArmRuns("adamw", (None, None, None), budget)
    fast = ArmRuns("lamb", (6100.0, 6300.0, 5900.0), budget)
    verdict = decide([never, fast])
    ratio, low, high = welch_ratio([6100.0, 6300.0, 5900.0], [budget] * 3 + [budget * 1.0000001], 0.96)
    assert verdict.winner == "lamb" and "adamw missed the target in 3 of 3 run(s), counted at its budget" in (
        verdict.line
    )  # fmt: skip
    assert verdict.comparisons[0].ratio == pytest.approx(ratio, rel=1e-6)
    sometimes = ArmRuns("lamb", (3000.0, None, 3100.0), budget)
    slow = ArmRuns("adamw", (8000.0, 8100.0, 8200.0), budget)
    verdict = decide([sometimes, slow])
    assert verdict.winner is None and "lamb missed the target in some runs" in verdict.line
    both_missed = decide([ArmRuns("a", (None, None), budget), ArmRuns("b", (None, None), budget)])
    assert both_missed.outcome is Outcome.NOT_YET and both_missed.line == "not yet: no arm reached the target"


def test_when_every_arm_missed_in_some_run_more_runs_cannot_decide():
    """A winner must reach the target in every run and "equivalent" needs every arm to: once every arm has missed,
    no number of further runs can give either, so the verdict asks for none (runs_needed None) and says why. While
    one arm always hit, it may still become the leader: more runs may decide."""
    budget = 12288
    adamw, lamb = [5200.0, 5400.0, None], [4300.0, 4500.0, None]
    verdict = decide([ArmRuns("adamw", tuple(adamw), budget), ArmRuns("lamb", tuple(lamb), budget)], look=1, looks=4)
    assert verdict.outcome is Outcome.NOT_YET and verdict.runs_needed is None
    censored = lambda runs: [budget if s is None else s for s in runs]  # noqa: E731 - a miss at its budget
    ratio, low, high = welch_ratio(censored(lamb), censored(adamw), 1 - look_level(1, 4))
    (c,) = verdict.comparisons
    assert (c.a, c.b) == ("lamb", "adamw") and (c.ratio, c.low, c.high) == pytest.approx((ratio, low, high), rel=1e-9)
    assert verdict.line.startswith(f"not yet: lamb vs adamw: {100 * (ratio - 1):+.1f} % (98.6 % interval "
                                   f"{100 * (low - 1):+.1f} % to {100 * (high - 1):+.1f} %")  # fmt: skip
    assert ("every arm missed the target in some run (adamw 1 of 3, lamb 1 of 3), and a winner must reach it in every "
            "run (equivalence: every arm): more confirmation runs cannot decide") in verdict.line  # fmt: skip
    assert "runs per arm would likely decide" not in verdict.line
    # lamb missed once, adamw never: adamw may yet lead (and win) with more runs, so they are counted
    one = decide([ArmRuns("adamw", (5200.0, 5400.0, 5300.0), budget), ArmRuns("lamb", tuple(lamb), budget)])
    assert one.outcome is Outcome.NOT_YET and one.runs_needed is not None and one.runs_needed > 3


def test_a_loser_whose_pick_was_a_lucky_seed_is_not_beaten_by_its_tuning():
    """The loser's tuning run reached the target sooner than the leader's runs (so the tuning ranked its configuration
    ahead of the leader), or never reached it (picked on accuracy short of the target), yet its confirmation runs
    missed the target: a winner would be about the configuration picked, not the optimizer tuned. Not yet, and more
    confirmation runs would not decide (runs_needed None). The same runs after an honest pick (its tuning run
    slower than the leader) decide."""
    budget = 12288
    adamw = ArmRuns("adamw", (7000.0, 7100.0, 6900.0, 7050.0), budget)
    for picked in (4096.0, 6000.0):  # both sooner than adamw's 7,000
        lamb = ArmRuns("lamb", (None, 9000.0, None, 9100.0), budget, picked=picked)
        verdict = decide([adamw, lamb])
        assert verdict.outcome is Outcome.NOT_YET and verdict.winner is None and verdict.runs_needed is None
        assert verdict.line.startswith("not yet: lamb's configuration missed the target in 2 of 4 confirmation run(s) "
                                       "and its tuning run reached it sooner than adamw does (a lucky seed): adamw "
                                       "beat a configuration, not lamb tuned")  # fmt: skip
        assert "more tuning trials (budget.trials) would decide" in verdict.line
    # picked on accuracy short of the target (a multi-fidelity tuner's short trial): its misses say the pick is poor
    short = decide([adamw, ArmRuns("lamb", (None, 9000.0, None, 9100.0), budget, picked=math.inf)])
    assert short.outcome is Outcome.NOT_YET and short.runs_needed is None
    assert "and its tuning run never reached it (picked on its accuracy short of the target)" in short.line
    honest = decide([adamw, ArmRuns("lamb", (None, 9000.0, None, 9100.0), budget, picked=7200.0)])
    unknown = decide([adamw, ArmRuns("lamb", (None, 9000.0, None, 9100.0), budget)])  # no tuning run known: as before
    always = decide([adamw, ArmRuns("lamb", (9000.0, 9100.0, 8900.0, 9050.0), budget, picked=4096.0)])  # no miss
    assert honest.winner == unknown.winner == always.winner == "adamw"


def test_an_arm_whose_tuning_found_nothing_on_target_is_not_compared():
    """Its best tuning trial missed: a winner against it would be about its tuning; the verdict says so, and that
    more confirmation runs would not decide (runs_needed None: sequential confirmations stop)."""
    budget = 12288
    untuned = ArmRuns("lamb", (None, None, None), budget, found=False)
    fast = ArmRuns("adamw", (6100.0, 6300.0, 5900.0), budget)
    verdict = decide([fast, untuned])
    assert verdict.outcome is Outcome.NOT_YET and verdict.runs_needed is None and not verdict.comparisons
    assert "the tuning of lamb has found no configuration that reaches the target yet" in verdict.line
    assert decide([fast, ArmRuns("lamb", (None, None, None), budget)]).winner == "adamw"  # a trial of it had hit


def test_arms_whose_tuning_found_nothing_are_named_as_a_list_and_not_as_optimizers():
    """Four clipping strategies none of whose tuning reached the target: the line said "the tuning of A and B and C
    and D has found ... (none of its finished tuning trials ...): a claim against it would be about its tuning, not
    its optimizer", an optimizer where the arms are clipping strategies, and one "it" for four arms."""
    budget = 6144
    labels = [f"clipping.strategy={s}" for s in ("none", "after_allreduce", "before_allreduce", "bucketwise")]
    line = decide([ArmRuns(label, (None, None), budget, found=False) for label in labels]).line
    assert (
        "the tuning of clipping.strategy=none, clipping.strategy=after_allreduce, clipping.strategy=before_allreduce "
        "and clipping.strategy=bucketwise has found no configuration that reaches the target yet (for each, none of "
        "its finished tuning trials nor of its best configuration's runs reached it): a claim against any of them "
        "would be about its tuning, not about the arm" in line
    )
    assert "optimizer" not in line
    one = decide([ArmRuns("lamb", (None, None), budget, found=False), ArmRuns("adamw", (4000.0, 4100.0), budget)])
    assert "a claim against it would be about its tuning, not about the arm; " in one.line
    assert "optimizer" not in one.line


def test_found_is_a_hit_among_the_arms_tuning_trials_or_its_best_configurations_runs():
    """Under asha every tuning trial may be short (no hit): the confirmations at the full budget show the arm's
    best configuration reaches the target, so it is compared; with neither, it is not."""
    from hpo.evidence.verdict import arm_runs
    from hpo.trials import TrialKind, TrialState
    from tests.hpo.test_objective import objective_spec

    spec = objective_spec(metric="samples_to_target")

    def trial(id, arm, hit, kind=TrialKind.TUNING, budget=1 / 3):
        params = {"optimizer.name": arm, f"optimizer.lr@{arm}": 2e-3}
        return SimpleNamespace(id=id, arm=f"optimizer.name={arm}", budget=budget, samples_to_target=hit, kind=kind,
                               state=TrialState.COMPLETED, metrics={}, params=params)  # fmt: skip

    best = {"optimizer.name=lamb": trial(1, "lamb", None), "optimizer.name=adamw": trial(2, "adamw", None)}
    confirm = TrialKind.CONFIRMATION
    runs = [trial(3, "lamb", 3000, confirm, 1.0), trial(4, "lamb", None, confirm, 1.0),
            trial(5, "adamw", None, confirm, 1.0), trial(6, "adamw", None, confirm, 1.0)]  # fmt: skip
    found = {a.label: a.found for a in arm_runs(spec, best, [*best.values(), *runs])}
    assert found == {"optimizer.name=lamb": True, "optimizer.name=adamw": False}


def test_an_arm_none_of_whose_tuning_trials_completed_is_one_whose_tuning_found_nothing():
    """Every tuning trial of adamw diverged (no best trial): the verdict said "adamw has 0 run(s); a comparison
    needs at least 2 per arm" and "about 2 runs per arm would likely decide", of a finished experiment where no
    confirmation run could start."""
    from hpo.evidence.verdict import arm_runs
    from hpo.trials import TrialKind, TrialState
    from tests.hpo.test_objective import objective_spec

    spec = objective_spec(metric="samples_to_target")
    params = {"optimizer.name": "lamb", "optimizer.lr@lamb": 2e-3}
    lamb = SimpleNamespace(id=1, arm="optimizer.name=lamb", budget=1.0, samples_to_target=3000, params=params,
                           kind=TrialKind.TUNING, state=TrialState.COMPLETED, metrics={})  # fmt: skip
    evidence = arm_runs(spec, {"optimizer.name=lamb": lamb}, [lamb])
    assert {a.label: a.found for a in evidence} == {"optimizer.name=lamb": True, "optimizer.name=adamw": False}
    verdict = decide(evidence)
    assert verdict.outcome is Outcome.NOT_YET and verdict.runs_needed is None
    assert "the tuning of optimizer.name=adamw has found no configuration that reaches the target yet" in verdict.line


def test_fewer_than_two_runs_in_an_arm_is_not_yet():
    verdict = decide([ArmRuns("a", (3000.0, 3100.0), 9000), ArmRuns("b", (3500.0,), 9000)])
    assert verdict.outcome is Outcome.NOT_YET and "b has 1 run(s); a comparison needs at least 2 per arm" in (
        verdict.line
    )  # fmt: skip
    assert decide([ArmRuns("a", (3000.0, 3100.0), 9000), ArmRuns("b", (), None)]).outcome is Outcome.NOT_YET


def test_runs_that_hit_at_one_evaluation_get_the_spread_of_one_interval():
    """Three runs at the same evaluation are not identical measurements: their spread is at least every / √12."""
    same = ArmRuns("a", (6144.0, 6144.0, 6144.0), 12288, resolution=1024)
    other = ArmRuns("b", (7168.0, 7168.0, 7168.0), 12288, resolution=1024)
    (c,) = decide([same, other]).comparisons
    floor = lambda mean: (1024 / math.sqrt(12) / mean) ** 2  # noqa: E731 - the variance of ln samples, by hand
    se = math.sqrt(floor(6144) / 3 + floor(7168) / 3)
    assert c.se == pytest.approx(se, rel=1e-12)
    df = (floor(6144) / 3 + floor(7168) / 3) ** 2 / ((floor(6144) / 3) ** 2 / 2 + (floor(7168) / 3) ** 2 / 2)
    assert c.high == pytest.approx(6144 / 7168 * math.exp(stats.t.ppf(0.98, df) * se), rel=1e-12)


def test_three_arms_share_the_error_over_their_pairs():
    """Bonferroni over the 3 pairs: each pair's interval is at 1 - 0.04/3, the winner must beat both others."""
    a, b, c = [6000.0, 6100.0, 5950.0, 6050.0], [8000.0, 8100.0, 7900.0, 8050.0], [6200.0, 6500.0, 6000.0, 6400.0]
    verdict = decide([ArmRuns("a", tuple(a), 12288), ArmRuns("b", tuple(b), 12288), ArmRuns("c", tuple(c), 12288)])
    assert [x.level for x in verdict.comparisons] == pytest.approx([ALPHA / 3] * 2)
    assert [(x.a, x.b) for x in verdict.comparisons] == [("a", "b"), ("a", "c")]
    for x, other in zip(verdict.comparisons, (b, c), strict=True):
        assert (x.low, x.high) == pytest.approx(welch_ratio(a, other, 1 - ALPHA / 3)[1:], rel=1e-9)
    expected = all(x.high < 1 for x in verdict.comparisons)
    assert (verdict.winner == "a") == expected
    p_values = [stats.ttest_ind(np.log(a), np.log(o), equal_var=False).pvalue for o in (b, c)]
    assert expected == all(p < ALPHA / 3 for p in p_values)


def test_the_looks_spend_alpha_by_the_pocock_type_function_and_add_up_to_it():
    spent = [ALPHA * math.log(1 + (math.e - 1) * j / 4) for j in range(5)]
    assert [look_level(j, 4) for j in range(1, 5)] == pytest.approx(np.diff(spent).tolist(), rel=1e-12)
    assert sum(look_level(j, 4) for j in range(1, 5)) == pytest.approx(ALPHA)
    assert look_level(1, 1) == pytest.approx(ALPHA)
    verdict = decide([ArmRuns("a", tuple(FAST), 12288), ArmRuns("b", tuple(SLOW), 12288)], look=2, looks=4)
    assert verdict.comparisons[0].level == pytest.approx(look_level(2, 4))
    assert "(98.9 % interval" in verdict.line  # 1 - 0.04 (ln(1 + (e - 1) / 2) - ln(1 + (e - 1) / 4)) = 98.95 %
    with pytest.raises(ValueError, match="look 5 of 4"):
        look_level(5, 4)


def test_samples_between_evaluations_interpolate_the_curve_to_the_target():
    curve = [(1024, 0.08), (2048, 0.10), (3072, 0.13), (4096, 0.15)]
    assert samples_between_evaluations(curve, 0.12, 3072) == pytest.approx(2048 + (0.02 / 0.03) * 1024)
    assert samples_between_evaluations(curve[2:], 0.12, 3072) == 3072  # hit at the first evaluation: as stored
    assert samples_between_evaluations([], 0.12, 3072) == 3072  # no curve stored
    assert samples_between_evaluations(curve, 0.13, 3072) == 3072  # exactly on target at the evaluation


def test_the_evidence_is_the_confirmation_runs_interpolated_on_their_curves():
    """The best tuning trial was selected: it is not a run. Confirmation runs count at samples interpolated on
    their curves; a miss is None; another configuration's confirmations are not this arm's."""
    from hpo.evidence.verdict import arm_runs
    from hpo.trials import TrialKind, TrialState
    from tests.hpo.test_objective import objective_spec

    spec = objective_spec(metric="samples_to_target")  # arms optimizer.name=adamw / lamb, 4,096 samples

    def trial(id, arm, hit, kind=TrialKind.CONFIRMATION, lr=2e-3, state=TrialState.COMPLETED):
        params = {"optimizer.name": arm, f"optimizer.lr@{arm}": lr}
        return SimpleNamespace(id=id, arm=f"optimizer.name={arm}", budget=1.0, samples_to_target=hit, kind=kind,
                               state=state, metrics={}, params=params)  # fmt: skip

    best = {"optimizer.name=lamb": trial(1, "lamb", 2048, TrialKind.TUNING),
            "optimizer.name=adamw": trial(2, "adamw", 1024, TrialKind.TUNING, lr=5e-4)}  # fmt: skip
    confirm = [trial(3, "lamb", 3072), trial(4, "lamb", None, state=TrialState.DIVERGED),
               trial(5, "adamw", 2048, lr=5e-4), trial(6, "adamw", 1024, lr=9e-4)]  # fmt: skip
    target = 0.5  # objective_spec's target MLM accuracy
    curves = {3: [(2048, target - 0.02), (3072, target + 0.02)], 1: [(1024, target - 0.04), (2048, target + 0.04)]}
    evidence = arm_runs(spec, best, [*best.values(), *confirm], curves)
    runs = {a.label: a.samples_to_target for a in evidence}
    assert runs == {"optimizer.name=lamb": (2560.0, None), "optimizer.name=adamw": (2048,)}
    # the tuning run that picked each configuration, read the same way (the verdict's test of a lucky pick)
    assert {a.label: a.picked for a in evidence} == {
        "optimizer.name=lamb": pytest.approx(1536),
        "optimizer.name=adamw": 1024,
    }


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -5.0])
def test_samples_to_target_that_is_not_a_positive_count_is_refused_naming_the_arm(value):
    """ln of each run's samples: nan and inf raised AttributeError from statistics, 0 a math domain error."""
    with pytest.raises(ValueError, match=r"arm A: samples to target must be finite and positive"):
        ArmRuns("A", (value, 5000.0, 5100.0), 100_000)
    assert ArmRuns("A", (None, 5000.0), 100_000).samples_to_target == (None, 5000.0)  # a miss is None


def test_two_runs_far_apart_give_an_interval_that_starts_at_zero_samples_and_a_readable_ratio():
    """The batch-scaling demo's LAMB at 32 (7,767 mean of two runs, t(0.975, 1) = 12.7): mean - half is below 0,
    which no count of samples is; a ratio interval of two arms with a miss each can reach 1e20 and more."""
    hits = (4_333.0, 11_201.0)
    summary = summarize(ArmRuns("lamb", hits, 49_152))
    half = stats.t.ppf(0.975, 1) * statistics.stdev(hits) / math.sqrt(2)
    assert statistics.fmean(hits) - half < 0
    assert (summary.low, summary.high) == (0.0, pytest.approx(statistics.fmean(hits) + half))
    assert summary.describe().endswith(f"(95 % interval 0 to {statistics.fmean(hits) + half:,.0f})")
    assert _pct(3.1115747620550456e20) == "+3.1e+22 %" and _pct(1.5) == "+50.0 %" and _pct(0.5) == "-50.0 %"
