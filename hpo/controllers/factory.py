"""The factory that picks a controller from the experiment's tuner (beside the controllers it builds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpo.controllers.asha import AshaController
from hpo.controllers.base import Controller
from hpo.controllers.grid import GridController
from hpo.controllers.random_search import RandomController
from hpo.controllers.smac import ForestModel, SmacController  # imports smac only when one is built
from search_spaces.space import SearchSpace


def build_controller(
    tuner: str, space: SearchSpace, seed: int, n_trials: int, output_dir: Path, options: dict[str, Any], **budget
) -> Controller:
    """The controller for `tuner.name`: random, grid, smac_bo, smac_hyperband, asha, and NNI's nni_tpe, nni_random,
    nni_anneal and nni_evolution in-process (the checks allow those only on the simulated runner). `budget`:
    Hyperband's min_budget, max_budget and eta; asha's plan (hpo.experiment.rungs.AshaPlan) and
    reached_target_at_most."""
    if tuner == "random":
        return RandomController(space, seed)
    if tuner == "grid":
        return GridController(space)
    if tuner == "asha":
        plan = budget["plan"]
        opts = plan.options
        model = ForestModel(space, seed) if opts.sampler == "model" else None
        return AshaController(space, seed, plan.budgets, plan.eta, opts.sampler, model, opts.min_points_in_model,
                              opts.random_fraction, budget.get("reached_target_at_most"))  # fmt: skip
    if tuner in ("smac_bo", "smac_hyperband"):
        return SmacController(space, seed, n_trials, output_dir, multi_fidelity=tuner == "smac_hyperband",
                              options=options, **budget)  # fmt: skip
    if tuner in ("nni_tpe", "nni_random", "nni_anneal", "nni_evolution"):
        from hpo.nni.tuners import NniTunerController  # imports nni only when an NNI tuner is built

        return NniTunerController(tuner, space, seed, options, quota=n_trials)
    raise ValueError(
        f"tuner.name {tuner!r} runs only under `engine: nni`; use random, grid, smac_bo, smac_hyperband or asha"
    )
