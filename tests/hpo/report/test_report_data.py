"""The report's row selection against the definition written out here: `top_trials` is the first k of all rows
sorted (measured values best first, ties by number, then the unmeasured finished ones by best accuracy), for either
direction, with ties, missing values and unfinished trials, on rows drawn from a fixed seed."""

from __future__ import annotations

import random

import pytest

from hpo.report.data import TrialRow, top_trials


def rows(n: int, seed: int) -> list[TrialRow]:
    rng = random.Random(seed)
    out = []
    for number in rng.sample(range(10 * n), n):
        value = rng.choice([None, None, float(rng.randint(0, 5)), rng.random()])
        outcome = rng.choice(["reached", "missed", "unfinished", "failed"])
        accuracy = rng.choice([None, round(rng.random(), 1)])
        out.append(TrialRow(number, "arm", "tuning", None, outcome, value, value, None, accuracy, None, None, 0, None,
                            {}, None))  # fmt: skip
    return out


def sorted_definition(rows: list[TrialRow], direction: str, k: int) -> list[TrialRow]:
    sign = -1.0 if direction == "maximize" else 1.0
    measured = sorted((r for r in rows if r.value is not None), key=lambda r: (sign * r.value, r.number))
    others = sorted((r for r in rows if r.value is None and r.outcome != "unfinished"),
                    key=lambda r: (-(r.best_mlm_accuracy or 0.0), r.number))  # fmt: skip
    return (measured + others)[:k]


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
@pytest.mark.parametrize("seed", range(5))
def test_top_trials_is_the_head_of_the_sorted_rows(direction, seed):
    drawn = rows(300, seed)
    for k in (0, 1, 10, 150, 299, 300, 400):
        assert top_trials(drawn, direction, k) == sorted_definition(drawn, direction, k), k
