"""The grid tuner: asks each combination once, in order; a resume does not ask a replayed one again."""

from __future__ import annotations

import pytest

from hpo.controllers.grid import GridController
from search_spaces.space import SearchSpace

SPACE = SearchSpace.from_dict({"optimizer.lr": {"choice": [0.001, 0.00316, 0.01]}, "seed": {"choice": [0, 1]}})


def test_asks_every_combination_once_then_refuses():
    grid = GridController(SPACE)
    asked = [grid.ask().params for _ in range(6)]
    assert len({tuple(sorted(p.items())) for p in asked}) == 6
    assert asked[0] == {"optimizer.lr": 0.001, "seed": 0} and asked[-1] == {"optimizer.lr": 0.01, "seed": 1}
    with pytest.raises(IndexError, match="every combination"):
        grid.ask()


def test_a_resumed_grid_asks_only_what_was_not_replayed():
    first = GridController(SPACE)
    asked = [first.ask().params for _ in range(4)]
    resumed = GridController(SPACE)
    for params in (asked[0], asked[2]):  # trials 1 and 3 finished before the controller died; 0.. re-queued
        resumed.replay(params, 1.0, 1.0)
    rest = [resumed.ask().params for _ in range(4)]
    assert rest == [asked[1], asked[3], {"optimizer.lr": 0.01, "seed": 0}, {"optimizer.lr": 0.01, "seed": 1}]
