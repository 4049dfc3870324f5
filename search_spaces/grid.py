"""A space of choices as a grid: every combination of its values (the grid tuner's, hpo.controllers.grid)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from search_spaces.space import CategoricalParam, SearchSpace


def grid_points(space: SearchSpace) -> list[dict[str, Any]]:
    """Every active combination of the space's choices, the earlier parameters varying slowest."""

    def extend(config: dict[str, Any], names: list[str]) -> Iterator[dict[str, Any]]:
        if not names:
            yield dict(config)
            return
        name, rest = names[0], names[1:]
        if not space.is_active(name, config):
            yield from extend(config, rest)
            return
        for value in space[name].choices:
            config[name] = value
            yield from extend(config, rest)
            del config[name]

    return list(extend({}, space.names))


def not_a_choice(space: SearchSpace) -> str | None:
    """The first parameter that is not a choice (a grid needs finite values), or None."""
    return next((name for name in space.names if not isinstance(space[name], CategoricalParam)), None)
