"""SMAC3 as an ask/tell controller (Bayesian optimization with a random forest, or Hyperband), and SMAC3's random
forest as the model that proposes ASHA's new configurations (`ForestModel`).

The only module that imports smac. Budgets are fractions of the trainer's `budget.max_samples`. A trial
without a usable result is told to SMAC as a crash (`StatusType.CRASHED`) at the worst cost seen so far.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import MethodType
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
        save_history: bool = True,
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
            # SMAC3 fits its forest and searches the acquisition function again after this many proposals (its
            # default 8); with many slots, a larger value proposes more of each search's configurations.
            selector = HyperparameterOptimizationFacade.get_config_selector(
                scenario, retrain_after=int(options.pop("retrain_after", 8))
            )
            self.smac = HyperparameterOptimizationFacade(scenario, _no_target, initial_design=design,
                                                         intensifier=intensifier, model=forest(self.configspace, seed),
                                                         config_selector=selector, overwrite=True,
                                                         logging_level=logging.WARNING)  # fmt: skip
        _linear_running_configs(self.smac.runhistory)
        self.multi_fidelity = multi_fidelity
        self.worst_cost = None
        # SMAC writes its whole run history as JSON after every tell: kept for real runs (a record beside ours),
        # skipped on the simulated runner, where it was a tenth of a repetition's time (`hpo plan`).
        self.save_history = save_history

    def ask(self) -> Suggestion:
        info = self.smac.ask()
        budget = 1.0 if info.budget is None else float(info.budget)
        return Suggestion(from_configuration(info.config), budget, info)

    def tell(self, suggestion: Suggestion, cost: float | None) -> None:
        from smac.runhistory.dataclasses import TrialValue
        from smac.runner.abstract_runner import StatusType

        if cost is not None:
            self.worst_cost = cost if self.worst_cost is None else max(self.worst_cost, cost)
            self.smac.tell(suggestion.handle, TrialValue(cost=cost), save=self.save_history)
        else:
            fallback = self.worst_cost if self.worst_cost is not None else 1e12
            self.smac.tell(
                suggestion.handle, TrialValue(cost=fallback, status=StatusType.CRASHED), save=self.save_history
            )

    def replay(self, params: dict[str, Any], budget: float, cost: float | None) -> None:
        from ConfigSpace import Configuration
        from smac.runhistory.dataclasses import TrialInfo

        values = {k: v for k, v in params.items() if k in self.configspace}
        config = Configuration(self.configspace, values=values)
        info = TrialInfo(config, seed=self.smac.scenario.seed, budget=budget if self.multi_fidelity else None)
        self.tell(Suggestion(params, budget, info), cost)


def _linear_running_configs(runhistory) -> None:
    """Give SMAC3's run history a running-configurations lookup that is linear in the running trials.

    SMAC3's intensifier asks for the configurations with a running trial twice on every `ask`, and the run history
    builds that list by testing each running trial's configuration against the list so far (`in`, i.e.
    ConfigSpace's `Configuration.__eq__`, which compares the two as dictionaries): quadratic in the running trials.
    At 64 slots that was a sixth of a simulated repetition's time (`hpo plan`). The replacement returns the same
    list in the same order (the first trial's configuration of each distinct one): configurations of one space
    are equal exactly when their vectors are, so the vector's bytes are the key. Proposals are unchanged (a test
    asks the same sequence of both)."""
    runhistory.get_running_configs = MethodType(_running_configs, runhistory)


def _running_configs(runhistory) -> list:
    first: dict[bytes, Any] = {}
    for trial in runhistory._running_trials:
        first.setdefault(trial.config.get_array().tobytes(), trial.config)
    return list(first.values())


def forest(configspace, seed: int, log_y: bool = True):
    """SMAC3's random forest with its BO facade's settings (`HyperparameterOptimizationFacade.get_model`: 10
    bootstrapped trees, all features, leaves of one sample, log-scaled costs), grown depth first. SMAC3 sets
    max_leaf_nodes = 2**20, which makes scikit-learn (1.9) build each tree best-first, at about 0.1 s a tree
    whatever the data (1.2 s a fit of 10 points, measured on 2 cores); without a leaf limit the same forest fits in
    about 10 ms. The limit is never reached (a leaf holds a sample), so only the order the random splits are drawn
    in changes, not the model; one thread (joblib's process-wide pool buys nothing for 10 small trees)."""
    from smac.model.random_forest import RandomForest

    return RandomForest(configspace, log_y=log_y, n_trees=10, bootstrapping=True, ratio_features=1.0,
                        min_samples_split=2, min_samples_leaf=1, max_depth=2**20, max_leaf_nodes=None, n_jobs=1,
                        seed=seed)  # fmt: skip


class ForestModel:
    """SMAC3's random forest with expected improvement over one rung's results (as BOHB and Hyper-Tune fit their
    model on one fidelity): called with (params, cost) pairs, it proposes the parameters of a new configuration:
    the best by EI of `challengers` random configurations not seen before (a sorted random search; SMAC3's local
    search around the incumbents costs about 0.5 s a proposal, too slow for a thousand slots). Costs are
    modelled on a log scale when all are positive (as SMAC3's BO facade does), which keeps the penalties of
    misses from swamping the differences between hits."""

    def __init__(self, space: SearchSpace, seed: int, challengers: int = 500, refit_growth: float = 1.05):
        from smac.acquisition.function import EI

        self.configspace = to_configspace(space, seed=seed)
        self.forest = forest(self.configspace, seed, log_y=False)  # the costs are logged here, when positive
        self.acquisition = EI(log=False)
        self.challengers = challengers
        self.refit_growth = refit_growth
        self._rows: dict[tuple, Any] = {}  # a configuration's parameters -> its array row (ConfigSpace is slow)
        self._fitted: tuple[tuple, int] | None = None  # (the first result's parameters, results) of the last fit

    def __call__(self, observed: list[tuple[dict[str, Any], float]]) -> dict[str, Any]:
        """A new configuration from (params, cost) results of one rung. The forest is fitted again when the results
        are of another rung or have grown by `refit_growth` (5 %: every result while there are fewer than 20) since
        the last fit, which keeps a thousand slots' proposals cheap; EI's incumbent is always the current best."""
        import numpy as np
        from smac.utils.configspace import convert_configurations_to_array

        X = np.array([self._row(p) for p, _ in observed])
        costs = np.array([c for _, c in observed], dtype=float)
        y = np.log(costs) if (costs > 0).all() else costs
        first, last = tuple(sorted(observed[0][0].items())), self._fitted
        stale = (
            last is None or last[0] != first or not last[1] <= len(y) < max(last[1] + 1, last[1] * self.refit_growth)
        )
        if stale:  # another rung (its first result differs), or enough new results
            self.forest.train(X, y)
            self._fitted = (first, len(y))
        self.acquisition.update(model=self.forest, eta=float(y.min()), num_data=len(y))
        seen = {row.tobytes() for row in X}
        candidates = self.configspace.sample_configuration(self.challengers)
        fresh = [c for c, row in zip(candidates, convert_configurations_to_array(candidates), strict=True)
                 if row.tobytes() not in seen]  # fmt: skip
        if not fresh:
            return from_configuration(self.configspace.sample_configuration())
        return from_configuration(fresh[int(np.argmax(self.acquisition(fresh).ravel()))])

    def _row(self, params: dict[str, Any]):
        key = tuple(sorted(params.items()))
        if key not in self._rows:
            from ConfigSpace import Configuration
            from smac.utils.configspace import convert_configurations_to_array

            config = Configuration(self.configspace, values={k: v for k, v in params.items() if k in self.configspace})
            self._rows[key] = convert_configurations_to_array([config])[0]
        return self._rows[key]


def _no_target(config, seed: int = 0) -> float:
    raise RuntimeError("trials run through hpo's runner; SMAC is used with ask/tell only")


def _no_target_budget(config, seed: int = 0, budget: float = 1.0) -> float:
    raise RuntimeError("trials run through hpo's runner; SMAC is used with ask/tell only")
