"""Asynchronous successive halving (ASHA; Li et al., "A System for Massively Parallel Hyperparameter Tuning",
MLSys 2020) as an ask/tell controller, with model-based or random sampling of new configurations.

Rungs are budgets r_0 < r_1 < ... < r_K = the largest (fractions of the full `budget.max_samples`; see
`hpo.experiment.rungs`). Every `ask` answers at once, never waiting for a rung to fill:

1. a **promotion**, if there is one: from the highest rung below the top down to rung 0, a configuration whose
   result at rung k is among the best floor(n_k / eta) of the n_k results seen at rung k, that has not been
   promoted yet, did not crash, and did not already reach the target (a trial that reached the target at a low
   rung is finished: its samples to target are known and exact). The best such configuration continues to rung
   k + 1 (the trial entry resumes it from its checkpoint, so only the new samples are trained and charged);
2. otherwise a **new configuration** at rung 0, from the sampler: SMAC3's random forest with expected
   improvement, fitted on the results of the highest rung that has at least `min_points_in_model` of them (as
   BOHB and Hyper-Tune do), or at random (`sampler: random`, the first configurations, and a `random_fraction`
   of the rest).

Ties rank by the order results arrived. Everything is a function of the sequence of asks and tells and the seed,
so a resumed controller, replayed the stored history in the order it happened, makes the same promotions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpo.controllers.base import Suggestion
from search_spaces.space import SearchSpace

SAMPLERS = ("model", "random")
RANDOM_FRACTION = 1 / 3  # BOHB's share of random configurations among model-based ones
# A model-based sampler: the (params, cost) results of one rung -> the parameters of a new configuration
ModelSampler = Callable[[list[tuple[dict[str, Any], float]]], dict[str, Any]]


@dataclass
class _Configuration:
    params: dict[str, Any]
    rung: int  # the highest rung it was asked at
    results: dict[int, float | None] = field(default_factory=dict)  # rung -> cost (None: crashed)
    finished: bool = False  # reached the target: nothing more to learn by training it longer


class AshaController:
    def __init__(
        self,
        space: SearchSpace,
        seed: int,
        budgets: Sequence[float],
        eta: int = 3,
        sampler: str = "model",
        model: ModelSampler | None = None,
        min_points_in_model: int | None = None,
        random_fraction: float = RANDOM_FRACTION,
        reached_target_at_most: float | None = None,
    ):
        """`budgets`: the rungs as fractions of the full budget, increasing. `model`: fits and proposes (needed
        for sampler model). `reached_target_at_most`: a cost at or below it says the trial reached the target
        (None: the objective has no target)."""
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        if sampler == "model" and model is None:
            raise ValueError("sampler model needs a model")
        self.space, self.budgets, self.eta = space, list(budgets), eta
        self.sampler, self.model = sampler, model
        self.min_points = min_points_in_model if min_points_in_model is not None else len(space) + 1
        self.random_fraction = random_fraction
        self.reached_target_at_most = reached_target_at_most
        self.rng = random.Random(seed)
        self.configurations: list[_Configuration] = []
        self.arrivals: list[list[int]] = [[] for _ in self.budgets]  # per rung: configurations in result order
        self.promotions: list[tuple[int, int]] = []  # (configuration, to rung), in the order made

    # -- ask / tell --------------------------------------------------------------------------------------

    def ask(self) -> Suggestion:
        for k in range(len(self.budgets) - 2, -1, -1):
            index = self._promotable(k)
            if index is not None:
                config = self.configurations[index]
                config.rung = k + 1
                self.promotions.append((index, k + 1))
                return Suggestion(dict(config.params), self.budgets[k + 1], (index, k + 1))
        params = self._new_params()
        self.configurations.append(_Configuration(params, 0))
        return Suggestion(dict(params), self.budgets[0], (len(self.configurations) - 1, 0))

    def tell(self, suggestion: Suggestion, cost: float | None) -> None:
        index, rung = suggestion.handle
        config = self.configurations[index]
        if rung in config.results:
            return  # told twice (cannot happen in the study loop): the first result stands
        config.results[rung] = cost
        self.arrivals[rung].append(index)
        if cost is not None and self.reached_target_at_most is not None and cost <= self.reached_target_at_most:
            config.finished = True

    def replay(self, params: dict[str, Any], budget: float, cost: float | None) -> None:
        """A stored result this controller did not ask for: its configuration (the latest one with these
        parameters, or a new one) is taken as asked at the rung of `budget`, then told."""
        rung = min(range(len(self.budgets)), key=lambda k: abs(self.budgets[k] - budget))
        index = next((i for i in range(len(self.configurations) - 1, -1, -1)
                      if self.configurations[i].params == params and rung not in self.configurations[i].results),
                     None)  # fmt: skip
        if index is None:
            self.configurations.append(_Configuration(dict(params), rung))
            index = len(self.configurations) - 1
        elif rung > self.configurations[index].rung:
            self.configurations[index].rung = rung
            self.promotions.append((index, rung))
        self.tell(Suggestion(params, budget, (index, rung)), cost)

    # -- what ASHA decides -------------------------------------------------------------------------------

    def _promotable(self, k: int) -> int | None:
        """The best configuration of rung k's top 1/eta that can still go up, or None."""
        arrived = self.arrivals[k]
        top = len(arrived) // self.eta
        if top == 0:
            return None
        order = {index: position for position, index in enumerate(arrived)}
        ranked = sorted(arrived, key=lambda i: (_rank_cost(self.configurations[i].results[k]), order[i]))
        for index in ranked[:top]:
            config = self.configurations[index]
            if config.rung == k and not config.finished and config.results[k] is not None:
                return index
        return None

    def _new_params(self) -> dict[str, Any]:
        observed = self._model_data()
        use_model = (self.sampler == "model" and observed is not None
                     and self.rng.random() >= self.random_fraction)  # fmt: skip
        if use_model:
            return self.model(observed)
        return self.space.sample(self.rng)

    def _model_data(self) -> list[tuple[dict[str, Any], float]] | None:
        """The (params, cost) results of the highest rung with at least min_points of them, or None."""
        for k in range(len(self.budgets) - 1, -1, -1):
            results = [(self.configurations[i].params, self.configurations[i].results[k]) for i in self.arrivals[k]]
            usable = [(p, c) for p, c in results if c is not None]
            if len(usable) >= max(self.min_points, 1):
                return usable
        return None

    # -- what the report and the tests read --------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The promotion state: every configuration's parameters, highest rung, results and whether it is finished,
        and the promotions in the order they were made."""
        return {
            "configurations": [(c.params, c.rung, dict(c.results), c.finished) for c in self.configurations],
            "promotions": list(self.promotions),
        }


def _rank_cost(cost: float | None) -> float:
    return math.inf if cost is None else cost
