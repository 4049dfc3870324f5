"""Grid search: every combination of a space of choices, once each, in order.

Its use is a pilot that records learning curves over a grid (learning rates x training seeds), which
`hpo table` turns into a curve table for `hpo plan`. Every parameter must be a choice; a parameter whose
condition is false in a combination is left out of it (as sampling does), so a conditional space gives each
branch its own grid.
"""

from __future__ import annotations

from typing import Any

from hpo.controllers.base import Suggestion
from search_spaces.grid import grid_points
from search_spaces.space import SearchSpace


class GridController:
    """Asks the grid's combinations in order; a replayed one (resume) is not asked again."""

    def __init__(self, space: SearchSpace):
        self.pending = grid_points(space)

    def ask(self) -> Suggestion:
        if not self.pending:
            raise IndexError("every combination of the grid was asked")  # the checks size the budget to the grid
        return Suggestion(self.pending.pop(0))

    def tell(self, suggestion: Suggestion, cost: float | None) -> None:
        pass  # a grid learns nothing

    def replay(self, params: dict[str, Any], budget: float, cost: float | None) -> None:
        if params in self.pending:
            self.pending.remove(params)
