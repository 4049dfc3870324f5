"""Random search: the dependency-free reference controller."""

from __future__ import annotations

import random
from typing import Any

from hpo.controllers.base import Suggestion
from search_spaces.space import SearchSpace


class RandomController:
    def __init__(self, space: SearchSpace, seed: int):
        self.space = space
        self.rng = random.Random(seed)

    def ask(self) -> Suggestion:
        return Suggestion(self.space.sample(self.rng))

    def tell(self, suggestion: Suggestion, cost: float | None) -> None:
        pass  # random search learns nothing

    def replay(self, params: dict[str, Any], budget: float, cost: float | None) -> None:
        self.rng.random()  # keep the stream moving so a resumed run does not repeat earlier samples
