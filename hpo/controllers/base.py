"""The ask/tell vocabulary of controllers: what a controller suggests and what it must answer to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


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
