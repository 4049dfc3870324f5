"""The ask/tell vocabulary of controllers, and the factory that picks one from the experiment's tuner."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from search_spaces.space import SearchSpace


@dataclass(frozen=True)
class Suggestion:
    """Parameters (search-space names) to try on a fraction `budget` of the training samples."""

    params: dict[str, Any]
    budget: float = 1.0
    handle: Any = field(default=None, compare=False)  # the tuner's own token (e.g. SMAC's TrialInfo)


class Controller(Protocol):
    def ask(self) -> Suggestion:
        """The next parameters to try."""

    def tell(self, suggestion: Suggestion, cost: float | None) -> None:
        """The cost of a suggestion (lower is better); None when the trial produced no usable result."""

    def replay(self, params: dict[str, Any], budget: float, cost: float | None) -> None:
        """A result of an earlier controller (resume): learn from it as if it had been asked here."""


def build_controller(
    tuner: str, space: SearchSpace, seed: int, n_trials: int, output_dir: Path, options: dict[str, Any], **budget
) -> Controller:
    """The controller for `tuner.name` (random, smac_bo, smac_hyperband); NNI tuners run under the nni engine."""
    if tuner == "random":
        from hpo.controllers.random_search import RandomController

        return RandomController(space, seed)
    if tuner in ("smac_bo", "smac_hyperband"):
        from hpo.controllers.smac import SmacController

        return SmacController(space, seed, n_trials, output_dir, multi_fidelity=tuner == "smac_hyperband",
                              options=options, **budget)  # fmt: skip
    raise ValueError(f"tuner.name {tuner!r} runs only under `engine: nni`; use random, smac_bo or smac_hyperband")
