"""NNI's Anneal and Evolution tuners, seeded: `tuner.seed` decides what they propose, under NNI's manager and in
process (hpo.nni.tuners).

NNI builds both on an unseeded `np.random.RandomState()` in `update_search_space` (Anneal's hyperopt state, and
Evolution's, which draws its first population there), and Evolution also mutates with Python's global `random`;
neither takes a seed. Here each state is seeded from `seed` (Evolution draws its first population again from it).
Under NNI's manager the tuner runs in a dispatcher process of its own, so `ManagerEvolution` seeds that process's
global `random` too; in process, hpo.nni.tuners gives Evolution a private stream instead. The manager loads these
classes by name (`className`, with this project's folder as `codeDirectory`), as it loads our SMAC tuner.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from nni.algorithms.hpo.evolution_tuner import EvolutionTuner
from nni.algorithms.hpo.hyperopt_tuner import HyperoptTuner


class SeededAnneal(HyperoptTuner):
    """NNI's hyperopt tuner with algorithm anneal, its random state seeded."""

    def __init__(self, seed: int, optimize_mode: str = "minimize"):
        super().__init__("anneal", optimize_mode=optimize_mode)
        self.seed = seed

    def update_search_space(self, search_space: dict[str, Any]) -> None:
        super().update_search_space(search_space)
        self.rval.rstate = np.random.RandomState(self.seed)  # NNI builds an unseeded one


class SeededEvolution(EvolutionTuner):
    """NNI's evolution tuner, its random state seeded and its first population drawn from it."""

    def __init__(self, seed: int, optimize_mode: str = "minimize", population_size: int = 32):
        super().__init__(optimize_mode=optimize_mode, population_size=population_size)
        self.seed = seed

    def update_search_space(self, search_space: dict[str, Any]) -> None:
        super().update_search_space(search_space)
        self.random_state = np.random.RandomState(self.seed)  # NNI builds an unseeded one: draw the population again
        self.population = []
        for _ in range(self.population_size):
            self._random_generate_individual()


class ManagerEvolution(SeededEvolution):
    """SeededEvolution under NNI's manager: the dispatcher's process is the tuner's own, so the global `random` that
    NNI's evolution mutates with is seeded there too."""

    def __init__(self, seed: int, optimize_mode: str = "minimize", population_size: int = 32):
        super().__init__(seed, optimize_mode, population_size)
        random.seed(seed)
