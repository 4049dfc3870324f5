"""bench/verdict_power.py: its confirmation power against an exact enumeration with an independent interval rule,
and its good-pick test against the committed table's recorded seeds."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest
from scipy import stats

from bench import verdict_power as power
from hpo.simulation.surrogate import Config, Surrogate
from hpo.simulation.table import load_table
from trainer.config import config_from_dict

BETTER = [4096, 4096, 4096, 5120, 5120]


def interval(runs):
    hits = [s for s in runs if s is not None]
    half = stats.t.ppf(0.975, len(hits) - 1) * statistics.stdev(hits) / math.sqrt(len(hits))
    return statistics.fmean(hits) - half, statistics.fmean(hits) + half


def outcome(better, worse):
    """The verdict's rule written out for these arms (the better arm always hits; the worse has >= 2 hits)."""
    if None in better:
        return "none"
    low_b, high_b = interval(better)
    low_w, high_w = interval(worse)
    if None not in worse and high_w < low_b:
        return "wrong"
    return "right" if high_b < low_w else "none"


@pytest.mark.parametrize(
    ("worse", "varies"),
    [([6144, 6144, 6144, 7168, None], "right"), ([3072, 3072, 3072, 7168, 7168], "wrong")],
    ids=["right-or-none", "wrong-or-none"],
)
def test_confirmation_power_matches_an_exact_enumeration_of_the_seed_draws(worse, varies):
    draws = list(itertools.product(itertools.combinations(BETTER, 3), itertools.combinations(worse, 3)))
    exact = {k: sum(outcome(b, w) == k for b, w in draws) / len(draws) for k in ("right", "wrong", "none")}
    assert 0.0 < exact[varies] < 1.0  # a case where the draw matters (right 31 %, wrong 4 %)

    measured = power.confirmation_power(BETTER, worse, 2, 4000, 12_288, random.Random(0))

    for key, p in exact.items():
        assert abs(measured[key] - p) <= 4 * math.sqrt(p * (1 - p) / 4000) + 1e-9, (key, measured, exact)


def test_paired_draws_give_both_arms_the_same_seeds():
    worse = [6144, 6144, 6144, 7168, None]  # seed i of the worse arm is worse[i]
    seeds = list(itertools.combinations(range(5), 3))
    exact = {k: sum(outcome([BETTER[i] for i in s], [worse[i] for i in s]) == k for s in seeds) / len(seeds)
             for k in ("right", "wrong", "none")}  # fmt: skip
    assert 0.0 < exact["right"] < 1.0  # 4 of the 10 seed sets

    measured = power.confirmation_power(BETTER, worse, 2, 4000, 12_288, random.Random(0), paired=True)

    for key, p in exact.items():
        assert abs(measured[key] - p) <= 4 * math.sqrt(p * (1 - p) / 4000) + 1e-9, (key, measured, exact)


def test_a_good_pick_reaches_the_target_on_every_seed_near_the_arms_best_truth():
    table = load_table(power.TABLE)
    spec = power.demo_spec(power.TABLE)
    cfg = config_from_dict(spec.resolved_base())
    surrogate = Surrogate(table)
    # the table's AdamW at lr 1e-3, warmup 0, batch 32: 8,192, 8,192 and 9,216 samples (bench/curves/README.md)
    assert sorted(power.seed_samples(surrogate, spec, "adamw", 0.001)) == [8192, 8192, 9216]
    assert power.good_pick(surrogate, spec, cfg, Config("adamw", 0.001, 0, 32), 8533 + 1)
    assert not power.good_pick(surrogate, spec, cfg, Config("adamw", 0.001, 0, 32), 8533 - 1)
    assert not power.good_pick(surrogate, spec, cfg, Config("adamw", 0.1, 0, 32), math.inf)  # stays at chance
