"""SMAC3 inside NNI: an NNI custom tuner that asks and tells our SMAC3 controller.

NNI hands a tuner its own search-space JSON, where a condition is only a nesting of choices; this tuner instead
builds SMAC's ConfigSpace from our search space (`search_spaces.configspace.to_configspace`, passed in the
class arguments), so conditions such as "clipping.max_norm only when clipping.strategy != none" reach SMAC as
ConfigSpace conditions. The parameters it hands out are flat {parameter name: value} mappings of the active
parameters. Results: a final result is a cost (negated for a maximized objective); a trial that ends without
one is told to SMAC as a crash, like under the local engine. Imported data (NNI's import_data, what a resumed
arm gets: the finished trials of its earlier NNI experiments) is replayed to SMAC like the local engine's history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nni.tuner import Tuner
from nni.utils import extract_scalar_reward

from hpo.controllers.base import Suggestion
from hpo.controllers.smac import SmacController
from search_spaces.space import SearchSpace


class SmacTuner(Tuner):
    """NNI class arguments: `space` (our search space as a mapping), `seed`, `n_trials`, `optimize_mode`
    (minimize/maximize the final results the trials report; NNI's name, which its web UI reads to show the
    best trial), `output_dir` (SMAC's files) and `n_initial_configs` (None: SMAC's default for the number of
    trials)."""

    def __init__(self, space: dict[str, Any], seed: int, n_trials: int, optimize_mode: str, output_dir: str,
                 n_initial_configs: int | None = None):  # fmt: skip
        self.args = (SearchSpace.from_dict(space), seed, n_trials, Path(output_dir))
        self.options = {} if n_initial_configs is None else {"n_initial_configs": n_initial_configs}
        self.sign = -1.0 if optimize_mode == "maximize" else 1.0
        self.pending: dict[int, Suggestion] = {}
        self._controller: SmacController | None = None

    @property
    def controller(self) -> SmacController:
        """SMAC, built on first use: NNI's manager gives up on a tuner process that does not connect within
        10 s of starting, and importing and setting up SMAC can take longer on a busy machine."""
        if self._controller is None:
            self._controller = SmacController(*self.args, options=self.options)
        return self._controller

    def update_search_space(self, search_space: dict[str, Any]) -> None:
        """NNI's JSON of the same space; SMAC works on the ConfigSpace built from ours."""

    def generate_parameters(self, parameter_id: int, **kwargs: Any) -> dict[str, Any]:
        suggestion = self.controller.ask()
        self.pending[parameter_id] = suggestion
        return dict(suggestion.params)

    def receive_trial_result(self, parameter_id: int, parameters: Any, value: Any, **kwargs: Any) -> None:
        suggestion = self.pending.pop(parameter_id, None)
        if suggestion is not None:  # None: a result NNI did not ask this tuner for (a customized trial)
            self.controller.tell(suggestion, self.sign * float(extract_scalar_reward(value)))

    def trial_end(self, parameter_id: int, success: bool, **kwargs: Any) -> None:
        suggestion = self.pending.pop(parameter_id, None)
        if suggestion is not None:  # ended without a final result: a crash
            self.controller.tell(suggestion, None)

    def import_data(self, data: list[dict[str, Any]]) -> None:
        """Finished trials of an earlier run ({"parameter": flat params, "value": final result}): SMAC learns
        from them as from its own, and does not propose them again."""
        for trial in data:
            cost = self.sign * float(extract_scalar_reward(trial["value"]))
            self.controller.replay(dict(trial["parameter"]), 1.0, cost)
