"""Arms: the fair comparisons of an experiment, and a trial's trainer config from its parameters.

An **arm** is one combination of the values of the experiment's `compare` keys, e.g. `optimizer.name=lamb`
(several keys: `optimizer.name=lamb,clipping.strategy=bucketwise`). Each arm

- has a **label** (`arm_label`), stored on its trials and shown everywhere an arm is named;
- has a **place**: every output lists the arms in the order the experiment file declares them (`arms`: the
  compare keys' choices as written, the first key outermost), never alphabetically (`in_arm_order` puts what the
  storage keys by label, e.g. `Storage.best_per_arm`, in that order);
- tunes its own **sub-space** (`arm_subspace`): the space with the compare keys fixed to the arm's values and
  the parameters those values rule out dropped (`optimizer.lr@adamw` is not tuned in the LAMB arm);
- gets an equal **share** of the trial budget (`arm_quotas`), the first arms taking the remainder;
- must tune the same **dimensions** (trainer keys of the same kind) as every other arm (`arm_dimensions`,
  `unequal_dimensions`), unless the experiment file says why not.

Without `compare` there is a single arm with no label, the whole space and the whole budget.

Everything here is a pure function of the validated spec, below every user of arms: the experiment checks,
the study loop, the NNI engine, the verdict, the report and the server. It never imports them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from search_spaces.errors import SearchSpaceError
from search_spaces.space import CategoricalParam, FloatParam, Param, SearchSpace, trainer_key
from trainer.config import TrainerConfig, config_from_dict, set_dotted

if TYPE_CHECKING:
    from hpo.experiment.schema import ExperimentSpec


@dataclass(frozen=True)
class ArmPlan:
    """One arm as it runs: its position, label (None without compare), compare values, trial share and space."""

    index: int
    label: str | None
    fixed: dict[str, Any]
    quota: int
    space: SearchSpace


def arms(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """Every arm: one mapping of compare key -> value per combination of their choices ([{}] without compare)."""
    choices = [spec.space[key].choices for key in spec.compare]
    return [dict(zip(spec.compare, combo, strict=True)) for combo in itertools.product(*choices)]


def arm_label(values: Mapping[str, Any]) -> str:
    """`optimizer.name=lamb` (several keys joined by commas)."""
    return ",".join(f"{k}={yaml_scalar(v)}" for k, v in values.items())


def arm_labels(spec: ExperimentSpec) -> list[str]:
    """The experiment's arm labels as stored on trials; [] when it compares nothing."""
    return [arm_label(values) for values in arms(spec)] if spec.compare else []


V = TypeVar("V")


def in_arm_order(spec: ExperimentSpec, by_arm: Mapping[str | None, V]) -> dict[str | None, V]:
    """`by_arm` (arm label -> anything; the storage keys arms alphabetically) in the order the spec declares its
    arms (`arm_labels`), so every output lists them alike; a label the spec does not declare follows, in its order."""
    place = {label: i for i, label in enumerate(arm_labels(spec))}
    return dict(sorted(by_arm.items(), key=lambda item: place.get(item[0], len(place))))


def arm_of(spec: ExperimentSpec, params: Mapping[str, Any]) -> str | None:
    """The arm a configuration belongs to, e.g. `optimizer.name=lamb`; None when the spec compares nothing."""
    if not spec.compare:
        return None
    missing = [k for k in spec.compare if k not in params]
    if missing:
        raise SearchSpaceError(missing[0], "a compare key has no value in the trial's parameters")
    return arm_label({k: params[k] for k in spec.compare})


BATCH_KEY = "batch.global_batch_size"
OPTIMIZER_KEY = "optimizer.name"


def batch_study(compare: Sequence[str]) -> bool:
    """Whether arms of these compare keys are a batch-size study: the global batch size and the optimizer, nothing
    else. Its experiment-wide verdict compares arms across batch sizes too, where a smaller batch needs fewer
    samples by construction; the question it asks is answered at each batch size, between the optimizers there
    (`hpo.evidence.verdict.batch_size_verdicts`). With a third key (a clipping strategy, an MLPerf system), the arms
    of one optimizer at one batch size are not replicates of one configuration, and with another key than the
    optimizer there are no optimizers to compare: such a comparison's verdict is the experiment's."""
    return set(compare) == {BATCH_KEY, OPTIMIZER_KEY}


def declared_batch_sizes(spec) -> tuple[int, ...]:
    """The global batch sizes at which a batch-size study (`batch_study`) declares two or more optimizers, ascending:
    the verdicts at each batch size share the error over these, whether or not runs are there yet (sharing it over
    the batch sizes compared so far would let a verdict at one batch size turn from a winner to "not yet" when runs
    at another arrive). () for another experiment."""
    if not batch_study(spec.compare) or len(spec.space[OPTIMIZER_KEY].choices) < 2:
        return ()
    return tuple(sorted(int(b) for b in spec.space[BATCH_KEY].choices))


BATCH_STUDY_NOTE = ("a batch-size study: this verdict compares every arm with every other, across batch sizes too, "
                    "where a smaller batch needs fewer samples by construction; which optimizer is faster at each "
                    "batch size is the verdict at each batch size")  # fmt: skip


def arm_subspace(space: SearchSpace, fixed: Mapping[str, Any]) -> SearchSpace:
    """The space of one arm: compare keys removed, parameters whose condition the arm rules out dropped."""
    kept: dict[str, dict[str, Any]] = {}
    as_dict = space.to_dict()
    for name in space.names:
        if name in fixed:
            continue
        param = as_dict[name]
        clauses = space[name].when
        if any(c.key in fixed and not c.holds(fixed[c.key]) for c in clauses):
            continue
        if any(c.key not in fixed and c.key not in kept for c in clauses):
            continue  # its parent was dropped
        when = {c.key: c.to_yaml() for c in clauses if c.key not in fixed}
        kept[name] = {k: v for k, v in param.items() if k != "when"} | ({"when": when} if when else {})
    return SearchSpace.from_dict(kept) if kept else SearchSpace({})  # an arm with nothing to tune


def arm_quotas(total: int, n: int) -> list[int]:
    """Equal shares of the trial budget; the first arms take the remainder."""
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def arm_plans(spec: ExperimentSpec) -> list[ArmPlan]:
    """Every arm of `spec` with its label, share of `budget.trials` and sub-space, in the order they run."""
    all_arms = arms(spec)
    quotas = arm_quotas(spec.budget.trials, len(all_arms))
    return [
        ArmPlan(
            i,
            arm_label(fixed) if fixed else None,
            fixed,
            quota,
            arm_subspace(spec.space, fixed) if fixed else spec.space,
        )  # fmt: skip
        for i, (fixed, quota) in enumerate(zip(all_arms, quotas, strict=True))
    ]


def arm_dimensions(spec: ExperimentSpec) -> dict[str, dict[str, str]]:
    """What each compare arm tunes: arm label -> trainer key -> its kind (`float, log`, `int`, `choice [a, b]`).

    Dimensions are trainer keys, so `optimizer.lr@lamb` and `optimizer.lr@adamw` are the same dimension;
    their ranges may differ, since a per-arm parameter (`name@label`) is how a file gives an arm its own range.
    """
    dims: dict[str, dict[str, str]] = {}
    for plan in arm_plans(spec) if spec.compare else []:
        kinds: dict[str, set[str]] = {}
        for name in plan.space.names:
            kinds.setdefault(trainer_key(name), set()).add(_dimension_kind(plan.space[name]))
        dims[plan.label] = {key: " | ".join(sorted(k)) for key, k in kinds.items()}
    return dims


def unequal_dimensions(dims: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The dimensions not tuned alike by every arm, each as `key (what each arm tunes)`; [] when equal."""
    keys = sorted({key for arm in dims.values() for key in arm})
    differing = []
    for key in keys:
        seen = {label: arm.get(key, "not tuned") for label, arm in dims.items()}
        if len(set(seen.values())) > 1:
            differing.append(f"{key} ({'; '.join(f'{label}: {kind}' for label, kind in seen.items())})")
    return differing


def _dimension_kind(param: Param) -> str:
    if isinstance(param, CategoricalParam):
        return f"choice [{', '.join(map(yaml_scalar, param.choices))}]"
    return ("float" if isinstance(param, FloatParam) else "int") + (", log" if param.log else "")


def yaml_scalar(value: Any) -> str:
    """A choice as YAML writes it (`true`, not `True`), so labels read like the experiment file."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


# ------------------------------------------------------------------------------------------------ trials
def trial_config(spec: ExperimentSpec, params: Mapping[str, Any], fidelity: float = 1.0) -> TrainerConfig:
    """The trainer config of one trial: base + overrides + the sampled parameters (keyed by parameter name),
    validated; `fidelity` < 1 shortens budget.max_samples (multi-fidelity) without changing the LR schedule."""
    for name in params:
        if name not in spec.space:
            raise SearchSpaceError(name, "not a parameter of the experiment's space")
    if not 0 < fidelity <= 1:
        raise ValueError(f"fidelity must be in (0, 1], got {fidelity}")
    raw = spec.resolved_base()
    for key, value in spec.space.trainer_values(params).items():
        set_dotted(raw, key, value)
    if fidelity < 1:
        full = config_from_dict(raw, f"{spec.source}: trial")
        # A short run must be a prefix of the full one: its decay horizon is the full run's (in samples: the trainer
        # counts the steps they take on its data), unless the file fixes one in steps.
        if full.schedule.total_steps is None:
            set_dotted(raw, "schedule.horizon_samples", full.schedule.horizon_samples or full.budget.max_samples)
        set_dotted(raw, "budget.max_samples", max(1, round(full.budget.max_samples * fidelity)))
    return config_from_dict(raw, f"{spec.source}: trial {dict(params)}")


def params_key(params: Mapping[str, Any]) -> str:
    """A short stable key of a configuration (with its seed, its checkpoint directory under multi-fidelity tuners)."""
    return hashlib.sha1(json.dumps(dict(params), sort_keys=True, default=str).encode()).hexdigest()[:16]


# Tuners that run a configuration at growing budgets, each continuing from the checkpoint of the one before.
CONTINUING_TUNERS = ("smac_hyperband", "asha")


def continues_from_checkpoint(spec: ExperimentSpec) -> bool:
    """Whether a trial continues from the checkpoint its configuration (and training seed) left at a lower budget."""
    return spec.tuner.name in CONTINUING_TUNERS


def checkpoint_name(params: Mapping[str, Any], seed: int) -> str:
    """The checkpoint directory of a configuration trained with one seed: a confirmation run (another seed)
    starts from scratch, never from the tuning run's checkpoint."""
    return f"{params_key(params)}-seed{seed}"
