"""SMAC3 as an ask/tell controller: Bayesian optimization with a random forest, or Hyperband.

The only module that imports smac. Budgets are fractions of the trainer's `budget.max_samples`. A trial
without a usable result is told to SMAC as a crash (`StatusType.CRASHED`) at the worst cost seen so far.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hpo.controllers.base import Suggestion
from search_spaces.configspace import from_configuration, to_configspace
from search_spaces.space import SearchSpace


class SmacController:
    def __init__(
        self,
        space: SearchSpace,
        seed: int,
        n_trials: int,
        output_dir: Path,
        multi_fidelity: bool = False,
        options: dict[str, Any] | None = None,
        min_budget: float = 1 / 9,
        max_budget: float = 1.0,
        eta: int = 3,
    ):
        from smac import HyperbandFacade, HyperparameterOptimizationFacade, Scenario

        logging.getLogger("smac").setLevel(logging.WARNING)
        self.configspace = to_configspace(space, seed=seed)
        fidelity = {"min_budget": min_budget, "max_budget": max_budget} if multi_fidelity else {}
        # SMAC counts every (config, budget) run as a trial; our study loop enforces the real trial count.
        n_smac_trials = max(n_trials, 1) * (20 if multi_fidelity else 1)
        scenario = Scenario(self.configspace, deterministic=True, n_trials=n_smac_trials,
                            output_directory=Path(output_dir), seed=seed, **fidelity)  # fmt: skip
        options = dict(options or {})
        if multi_fidelity:
            intensifier = HyperbandFacade.get_intensifier(scenario, eta=eta)
            self.smac = HyperbandFacade(scenario, _no_target_budget, intensifier=intensifier, overwrite=True,
                                        logging_level=logging.WARNING)  # fmt: skip
        else:
            n_init = int(options.pop("n_initial_configs", max(2, min(10, n_trials // 3))))
            design = HyperparameterOptimizationFacade.get_initial_design(scenario, n_configs=n_init)
            intensifier = HyperparameterOptimizationFacade.get_intensifier(scenario, max_config_calls=1)
            self.smac = HyperparameterOptimizationFacade(scenario, _no_target, initial_design=design,
                                                         intensifier=intensifier, overwrite=True,
                                                         logging_level=logging.WARNING)  # fmt: skip
        self.multi_fidelity = multi_fidelity
        self.worst_cost = None

    def ask(self) -> Suggestion:
        info = self.smac.ask()
        budget = 1.0 if info.budget is None else float(info.budget)
        return Suggestion(from_configuration(info.config), budget, info)

    def tell(self, suggestion: Suggestion, cost: float | None) -> None:
        from smac.runhistory.dataclasses import TrialValue
        from smac.runner.abstract_runner import StatusType

        if cost is not None:
            self.worst_cost = cost if self.worst_cost is None else max(self.worst_cost, cost)
            self.smac.tell(suggestion.handle, TrialValue(cost=cost))
        else:
            fallback = self.worst_cost if self.worst_cost is not None else 1e12
            self.smac.tell(suggestion.handle, TrialValue(cost=fallback, status=StatusType.CRASHED))

    def replay(self, params: dict[str, Any], budget: float, cost: float | None) -> None:
        from ConfigSpace import Configuration
        from smac.runhistory.dataclasses import TrialInfo

        values = {k: v for k, v in params.items() if k in self.configspace}
        config = Configuration(self.configspace, values=values)
        info = TrialInfo(config, seed=self.smac.scenario.seed, budget=budget if self.multi_fidelity else None)
        self.tell(Suggestion(params, budget, info), cost)


def _no_target(config, seed: int = 0) -> float:
    raise RuntimeError("trials run through hpo's runner; SMAC is used with ask/tell only")


def _no_target_budget(config, seed: int = 0, budget: float = 1.0) -> float:
    raise RuntimeError("trials run through hpo's runner; SMAC is used with ask/tell only")
