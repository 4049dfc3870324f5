"""NNI's built-in tuners as in-process ask/tell controllers (`NniTunerController`), without NNI's manager.

Used by the local engine on the simulated runner (`tuner.name`: nni_tpe, nni_random, nni_anneal, nni_evolution):
the tuner class is built in this process and driven the way NNI's dispatcher drives it. An ask is
`generate_parameters(parameter_id)`; a result is `receive_trial_result` then `trial_end(success=True)`; a trial
without a usable result (cost None) is only `trial_end(success=False)`, as NNI does for a failed trial (TPE forgets
it, Evolution replaces it with a random individual). Costs are already minimization costs (optimize_mode
minimize).

Seeds. TPE and Random take a seed. NNI's Anneal (hyperopt) and Evolution draw from an unseeded
`np.random.RandomState()` built in `update_search_space`, and Evolution also from Python's global `random`; they
are seeded from `seed` (hpo.nni.seeded; here Evolution's `random` calls run on a private `random.Random` state
swapped in and out, so the process's global stream is neither used nor changed). So every tuner proposes the same
sequence for the same seed and history.

Evolution proposes nothing while `population_size` trials are running (NNI's `NoMoreTrialError`; under NNI's
manager it sends the configuration later). Asked then, the controller answers a random sample of our
`SearchSpace` (`random.Random(seed + n)`, n the ask's number) that the tuner never hears about; the same holds
for any tuner that raises `NoMoreTrialError` (a deduplicated space that is used up).

Replay (resume): a stored result the tuner did not propose again is fed as NNI's resume does, through
`import_data([{"parameter": <NNI form>, "value": cost}])` (TPE and Anneal learn from it; Random and Evolution
ignore imported data, as under NNI). A crash (cost None) is not imported: live, it teaches these tuners nothing
either. A deterministic tuner asked again on resume proposes the same configurations and is told through `tell`,
so its history equals an uninterrupted run's.

The only module of the local engine's path that imports nni; the controller factory imports it only when an NNI
tuner is built.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import nni
import numpy as np
from nni.algorithms.hpo.random_tuner import RandomTuner
from nni.algorithms.hpo.tpe_tuner import TpeTuner

from hpo.controllers.base import Suggestion
from hpo.nni.config import default_population
from hpo.nni.seeded import SeededAnneal, SeededEvolution
from search_spaces.nni import from_nni_params, to_nni, to_nni_params
from search_spaces.space import SearchSpace

IN_PROCESS_TUNERS = ("nni_tpe", "nni_random", "nni_anneal", "nni_evolution")


class _SeededEvolution(SeededEvolution):
    """NNI's evolution tuner, seeded; it counts running trials itself (NNI's dispatcher path,
    `generate_multiple_parameters`, does the counting there) and refuses to propose while `population_size` are
    running without queueing a late configuration (nobody would take it)."""

    def __init__(self, seed: int, population_size: int):
        super().__init__(seed, population_size=population_size)
        self._py_random = random.Random(seed).getstate()

    def generate_parameters(self, parameter_id: int, **kwargs: Any) -> dict[str, Any]:
        if self.num_running_trials >= self.population_size or not self.population:
            raise nni.NoMoreTrialError("no more parameters now")
        saved = random.getstate()  # NNI's evolution mutates with the global `random`: give it its own stream
        random.setstate(self._py_random)
        try:
            params = super().generate_parameters(parameter_id, **kwargs)
        finally:
            self._py_random = random.getstate()
            random.setstate(saved)
        self.num_running_trials += 1
        return params


def build_nni_tuner(name: str, seed: int, options: dict[str, Any], quota: int) -> Any:
    """NNI's tuner for `name` (one of IN_PROCESS_TUNERS), minimizing, seeded."""
    if name == "nni_tpe":
        return TpeTuner(optimize_mode="minimize", seed=seed)
    if name == "nni_random":
        return RandomTuner(seed=seed, optimize_mode="minimize")
    if name == "nni_anneal":
        return SeededAnneal(seed)
    if name == "nni_evolution":
        return _SeededEvolution(seed, int(options.get("population_size", default_population(quota))))
    raise ValueError(f"tuner.name {name!r} is not an NNI tuner that runs in-process ({', '.join(IN_PROCESS_TUNERS)})")


class NniTunerController:
    """An NNI built-in tuner behind our Controller protocol (hpo.controllers.base)."""

    def __init__(self, name: str, space: SearchSpace, seed: int, options: dict[str, Any] | None = None,
                 quota: int = 1):  # fmt: skip
        logging.getLogger("nni").setLevel(logging.WARNING)
        self.space = space
        self.seed = seed
        self.tuner = build_nni_tuner(name, seed, dict(options or {}), quota)
        self.tuner.update_search_space(to_nni(space))
        self.asks = 0
        self.generated: dict[int, dict[str, Any] | None] = {}  # parameter id -> NNI's parameters (None: fallback)

    def ask(self) -> Suggestion:
        parameter_id = self.asks
        self.asks += 1
        try:
            nni_params = self.tuner.generate_parameters(parameter_id)
        except nni.NoMoreTrialError:
            self.generated[parameter_id] = None
            return Suggestion(self.space.sample(random.Random(self.seed + parameter_id)), 1.0, parameter_id)
        self.generated[parameter_id] = nni_params
        params = from_nni_params(nni_params, self.space)
        return Suggestion({k: v.item() if isinstance(v, np.generic) else v for k, v in params.items()}, 1.0,
                          parameter_id)  # fmt: skip

    def tell(self, suggestion: Suggestion, cost: float | None) -> None:
        parameter_id = suggestion.handle
        nni_params = self.generated.pop(parameter_id, None)
        if nni_params is None:
            return  # a fallback sample: the tuner never proposed it
        if cost is None:
            self.tuner.trial_end(parameter_id, False)
            return
        self.tuner.receive_trial_result(parameter_id, nni_params, float(cost))
        self.tuner.trial_end(parameter_id, True)

    def replay(self, params: dict[str, Any], budget: float, cost: float | None) -> None:
        if cost is None:
            return
        self.tuner.import_data([{"parameter": to_nni_params(params, self.space), "value": float(cost)}])
