"""The experiment file: what to tune (space over a base trainer config), toward what (objective), how (tuner,
budget, resources, engine). `load_experiment` reads and fully validates one; it is pure (never touches storage).

    name: adam_vs_lamb
    base_config: ../../trainer/configs/bert_large.yaml   # relative to this file; or an inline mapping
    overrides: {budget.max_samples: 4000000}             # dotted trainer keys set on the base config
    space:                                               # see search_spaces/space.py for the syntax
      optimizer.name: {choice: [adamw, lamb]}
      optimizer.lr@lamb: {float: [3.0e-4, 5.0e-3], log: true, when: {optimizer.name: lamb}}
    objective: {metric: samples_to_target, direction: minimize, penalty_factor: 2.0}
    compare: [optimizer.name]                            # arms: each value gets the same share of trials
    tuner: {name: smac_bo, seed: 0, options: {}}
    budget: {trials: 40, max_parallel: 1, trial_timeout_s: 7200}
    resources: {gpus: all, gpus_per_trial: 8, trials_per_gpu: 1, cpu_slots: 1, cpu_ranks_per_trial: 1}
    engine: local

Objective: what a trial scores (with a penalty for runs that miss the target) and what the tuner is told are
defined in `hpo/objective.py`.

Arms (`compare`): each compare key must be an unconditional categorical parameter of the space; the arms are
all combinations of their choices, e.g. `optimizer.name=lamb`. Every arm gets the same share of the trials
and must tune the same dimensions: the same trainer keys, each of the same kind (float/int, log or linear
scale, the same choices). Ranges may differ through per-arm parameters (`optimizer.lr@lamb`). Arms that cannot
be tuned alike (a `none` clipping strategy has no threshold to tune) need `allow_unequal_arms: <reason>`.

Resources: a trial on GPUs runs `gpus_per_trial` ranks, one per GPU (`trials_per_gpu` > 1 shares a GPU between
single-GPU trials). Without GPUs (`gpus: none`) `cpu_slots` trials run side by side, each with
`cpu_ranks_per_trial` gloo ranks; `hpo run` refuses GPUs asked for on a machine that has none.
"""

from hpo.experiment.loading import experiment_from_dict, load_experiment, spec_from_stored, stored_form
from hpo.experiment.schema import NATURAL_DIRECTION, Budget, ExperimentSpec, Objective, Resources, Runner, Tuner

__all__ = [
    "NATURAL_DIRECTION",
    "Budget",
    "ExperimentSpec",
    "Objective",
    "Resources",
    "Runner",
    "Tuner",
    "experiment_from_dict",
    "load_experiment",
    "spec_from_stored",
    "stored_form",
]
