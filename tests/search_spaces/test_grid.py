"""A space of choices as a grid: every combination once, inactive parameters left out."""

from __future__ import annotations

import itertools

from search_spaces.grid import grid_points, not_a_choice
from search_spaces.space import SearchSpace


def test_every_combination_once_the_first_parameter_slowest():
    space = SearchSpace.from_dict({"optimizer.lr": {"choice": [0.001, 0.01]}, "seed": {"choice": [0, 1, 2]}})
    points = grid_points(space)
    assert points == [{"optimizer.lr": lr, "seed": s} for lr, s in itertools.product([0.001, 0.01], [0, 1, 2])]


def test_a_conditional_parameter_is_left_out_where_its_condition_is_false():
    space = SearchSpace.from_dict({
        "clipping.strategy": {"choice": ["none", "global"]},
        "clipping.max_norm": {"choice": [0.5, 1.0], "when": {"clipping.strategy": "global"}},
    })  # fmt: skip
    points = grid_points(space)
    assert points == [{"clipping.strategy": "none"}, {"clipping.strategy": "global", "clipping.max_norm": 0.5},
                      {"clipping.strategy": "global", "clipping.max_norm": 1.0}]  # fmt: skip
    for point in points:
        space.validate_params(point)  # each is a valid configuration of the space


def test_a_range_is_not_a_grid():
    space = SearchSpace.from_dict({"seed": {"choice": [0, 1]}, "optimizer.lr": {"float": [1e-4, 1e-2], "log": True}})
    assert not_a_choice(space) == "optimizer.lr"
    assert not_a_choice(SearchSpace.from_dict({"seed": {"choice": [0, 1]}})) is None
