"""The checks of an experiment file beyond its schema: trainer keys and values, arms, engine, tuner, objective,
resources. Each raises `ExperimentFileError` naming the file and the field, before anything is written."""

from __future__ import annotations

import copy
import importlib.util
import itertools
import typing
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from hpo.errors import ExperimentFileError
from hpo.experiment.arms import (
    ArmPlan,
    arm_dimensions,
    arm_plans,
    arms,
    continues_from_checkpoint,
    unequal_dimensions,
    yaml_scalar,
)
from hpo.experiment.rungs import asha_plan
from hpo.experiment.schema import ASHA_BUDGET_OPTIONS, NATURAL_DIRECTION, SEEDLESS_TUNERS, number_kind
from hpo.nni.config import check_nni_spec
from hpo.simulation.table import DIMENSIONS as TABLE_DIMENSIONS
from hpo.simulation.table import RUN_LENGTH
from search_spaces.errors import SearchSpaceError
from search_spaces.grid import grid_points, not_a_choice
from search_spaces.space import CategoricalParam, Clause, FloatParam, SearchSpace, trainer_key
from trainer.config import (
    INERT_UNDER,
    ConfigError,
    TrainerConfig,
    closest_name,
    config_from_dict,
    get_dotted,
    inert_under,
    set_dotted,
    unread_settings,
)

if TYPE_CHECKING:
    from hpo.experiment.schema import ExperimentSpec


def check_spec(spec: ExperimentSpec, resolved: dict[str, Any], source: str, current_rules: bool = True) -> None:
    """Every check of a spec whose base config + overrides resolved to `resolved` (a valid trainer config).
    `current_rules=False` (a stored or imported experiment, read as it ran) leaves out the rules an experiment
    recorded by an earlier version may not meet: equal arms, the tuner's and the trials' seed ranges, settings that
    need CUDA on CPU slots, choices the trainer reads as one value. Its report, export and status stay readable."""
    cfg = config_from_dict(resolved)
    _check_space(spec, resolved, source, current_rules)
    _check_compare(spec, source)
    _check_engine(spec, source)
    _check_tuner(spec, cfg, source)
    _check_objective(spec, cfg, source)
    _check_resources(spec, cfg, source)
    if current_rules:
        _check_unread_settings(spec, resolved, source)
        _check_inert_keys(spec, cfg, source)
        _check_equal_arms(spec, source)
        _check_equal_budgets(spec, source)
        _check_tuner_seed(spec, source)
        _check_seed(spec, cfg, source)
        _check_clipping_ranks(spec, cfg, source)
        _check_resources_read(spec, source)
        _check_settings_read(spec, source)
        if spec.resources.gpus == "none":
            _check_cpu_trials(spec, cfg, source)


def check_file(spec: ExperimentSpec, source: str) -> None:
    """The rules of what an experiment file asks for, beyond `check_spec`: checked where a file is read
    (`load_experiment`: `hpo run`, `hpo plan`, the presets), not where hpo builds a spec of its own (a plan's
    repetitions set the training seed in overrides, whatever the space tunes) or reads one stored, as it ran. A
    comparison whose verdict could never decide is refused before it spends a trial, and so is an override that
    the space replaces in every trial."""
    _check_verdict_can_decide(spec, source)
    _check_overrides_tuned(spec, source)


def _check_verdict_can_decide(spec: ExperimentSpec, source: str) -> None:
    """A compare of fewer than 2 arms (its keys' choices one value each) ends every run with "one arm: nothing to
    compare", and one confirmation run per arm with "a comparison needs at least 2 per arm"; both after spending
    their trials. `confirm_seeds: 0` runs no confirmation: the arms' best configurations without a verdict."""
    if not spec.compare:
        return
    if len(arms(spec)) < 2:
        i, key = next((i, key) for i, key in enumerate(spec.compare) if len(spec.space[key].choices) < 2)
        raise ExperimentFileError(
            f"{source}: compare[{i}]: {key} has one value in space ({yaml_scalar(spec.space[key].choices[0])}), so "
            "there is one arm and nothing to compare: give space."
            f"{key} the values to compare, or remove compare (and set {key} in overrides)"
        )
    if spec.budget.confirm_seeds == 1:
        raise ExperimentFileError(
            f"{source}: budget.confirm_seeds: 1, but the verdict compares each arm's confirmation runs and needs at "
            "least 2 per arm, so it could never decide: set 2 or more, or auto (rounds until it decides); or 0 for "
            "each arm's best configuration without a verdict"
        )


# The run length the controller reads from the base config + overrides even where the space sets it per arm: a
# multi-fidelity trial's budget is a fraction of budget.max_samples, the rungs multiples of eval.every_samples, and
# `hpo run` states the most samples a trial trains.
READ_FROM_THE_BASE = RUN_LENGTH


def _check_overrides_tuned(spec: ExperimentSpec, source: str) -> None:
    """A trainer key set in overrides and tuned by the space in every trial (a parameter without `when`, or
    per-arm parameters one of which is active in every combination of the choices): the trials take the space's
    value, and the override would be dropped without a word."""
    for key in spec.overrides:
        names = [name for name in spec.space.names if trainer_key(name) == key]
        if not names or key in READ_FROM_THE_BASE or not _always_active(spec.space, names):
            continue
        tuned = " and ".join(f"space.{name}" for name in names)
        every = "in every trial" if len(names) == 1 else "one of them in every trial"
        raise ExperimentFileError(
            f"{source}: overrides.{key}: {tuned} {'tunes' if len(names) == 1 else 'tune'} {key} too, {every}, so "
            "this value would never be read: remove it from overrides, or the parameter from space"
        )


def _always_active(space: SearchSpace, names: list[str]) -> bool:
    """Whether one of parameters `names` is active in every combination of the choices their conditions read."""
    parents = _with_parents(space, [clause.key for name in names for clause in space[name].when])
    for combo in itertools.product(*(space[parent].choices for parent in parents)):
        picked = dict(zip(parents, combo, strict=True))
        if not any(space.is_active(name, picked) for name in names):
            return False
    return True


def numbers_as_read(spec: ExperimentSpec, resolved: dict[str, Any]) -> SearchSpace | None:
    """The space with each choice that writes a number as a string (`"40"` for schedule.warmup_steps) as the number
    the trainer reads, as for numbers elsewhere in the file (`"4"` for a whole number), and `when` clauses on it
    alike; None where there is none. So every part reads one value: the tuner, the arms, the simulated runner's table
    (which has 40, not "40"), the stored trials. A choice the trainer refuses, or one that is another choice's number
    ([4, "4"]), is left as written for `check_spec` to name."""
    read: dict[str, dict[str, Any]] = {}  # parameter -> {choice as written: the number the trainer reads}
    for name in spec.space:
        param, key = spec.space[name], trainer_key(name)
        if not isinstance(param, CategoricalParam) or key not in _LEAVES:
            continue
        numbers = {}
        for value in param.choices:
            if isinstance(value, str):
                why, reading = _trainer_reading(resolved, key, value)
                if why is None and isinstance(reading, (int, float)) and not isinstance(reading, bool):
                    numbers[value] = reading
        choices = [numbers.get(v, v) if isinstance(v, str) else v for v in param.choices]
        if numbers and len({(type(v) is bool, v) for v in choices}) == len(choices):
            read[name] = numbers
    if not read:
        return None
    data = spec.space.to_dict()
    for name, numbers in read.items():
        data[name]["choice"] = [numbers.get(v, v) if isinstance(v, str) else v for v in data[name]["choice"]]
    for param in data.values():
        for parent in set(param.get("when", {})) & set(read):
            param["when"][parent] = _numbers_in_clause(param["when"][parent], read[parent])
    try:
        return SearchSpace.from_dict(data)
    except SearchSpaceError:
        return None


def _numbers_in_clause(clause: Any, numbers: dict[str, Any]) -> Any:
    """A `when` clause's YAML form (`"40"`, `{not: "40"}`, `{in: ["0", "40"]}`) with its values as read."""
    if isinstance(clause, dict):
        return {op: _numbers_in_clause(values, numbers) for op, values in clause.items()}
    if isinstance(clause, list):
        return [_numbers_in_clause(value, numbers) for value in clause]
    return numbers.get(clause, clause) if isinstance(clause, str) else clause


# ------------------------------------------------------------------------------------------------ trainer keys
def trainer_leaf_keys(model: type[BaseModel] = TrainerConfig, prefix: str = "") -> dict[str, Any]:
    """Every settable dotted key of the trainer config -> its pydantic FieldInfo (sections are walked)."""
    keys: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.update(trainer_leaf_keys(ann, f"{prefix}{name}."))
        else:
            keys[f"{prefix}{name}"] = info
    return keys


_LEAVES = trainer_leaf_keys()


def check_trainer_key(key: str, field: str, source: str) -> None:
    if key in _LEAVES:
        return
    sections = {k.rsplit(".", 1)[0] for k in _LEAVES if "." in k}
    if key in sections:
        raise ExperimentFileError(f"{source}: {field}: {key} is a section; name one of its keys ({key}.<key>)")
    hint = did_you_mean(key, list(_LEAVES))
    raise ExperimentFileError(f"{source}: {field}: {key} is not a trainer config key{hint}")


def check_trainer_value(key: str, value: Any, field: str, source: str) -> None:
    """A boolean for a trainer number (`budget.max_samples: true`) is refused: the trainer would read it as 1."""
    kind = number_kind(_LEAVES[key].annotation) if key in _LEAVES else None
    if isinstance(value, bool) and kind is not None:
        raise ExperimentFileError(f"{source}: {field}: {key} takes {kind}, got {str(value).lower()}")


def _trainer_reading(resolved: dict[str, Any], key: str, value: Any) -> tuple[str | None, Any]:
    """(why the trainer rejects `key = value` on the resolved base config, or None; the value it reads)."""
    raw = copy.deepcopy(resolved)
    set_dotted(raw, key, value)
    try:
        cfg = config_from_dict(raw)
    except ConfigError as e:
        why = error_line(str(e), key) or "; ".join(line.strip() for line in str(e).splitlines()[1:]) or str(e)
        return why, None
    return None, get_dotted(cfg, key)


def _param_values(param: Any) -> tuple[Any, ...]:
    """The values the checks try of a parameter: each choice, or a range's bounds."""
    return tuple(param.choices) if isinstance(param, CategoricalParam) else (param.low, param.high)


def _is_int_field(info: Any) -> bool:
    """An integer field, also one that takes a word besides (`batch.micro_batch_size`: a number or auto)."""
    ann = info.annotation
    args = set(typing.get_args(ann)) - {type(None)} if typing.get_args(ann) else {ann}
    args = {typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a for a in args}
    return int in args and float not in args


def did_you_mean(name: str, candidates: list[str]) -> str:
    close = closest_name(name, candidates)
    return f" (did you mean {close}?)" if close else ""


def error_line(message: str, key: str) -> str | None:
    """The line of a trainer ConfigError about `key` (its lines read `  dotted.key: what is wrong`)."""
    return next((line.strip() for line in message.splitlines() if line.strip().startswith(f"{key}:")), None)


def _check_space(spec: ExperimentSpec, resolved: dict[str, Any], source: str, current_rules: bool = True) -> None:
    for name in spec.space:
        key, param, field = trainer_key(name), spec.space[name], f"space.{name}"
        check_trainer_key(key, field, source)
        if isinstance(param, FloatParam) and _is_int_field(_LEAVES[key]):
            raise ExperimentFileError(f"{source}: {field}: {key} is an integer; use int: [low, high]")
        values = _param_values(param)
        read: dict[Any, Any] = {}  # the trainer's value of each choice -> the choice
        for value in values:
            check_trainer_value(key, value, field, source)
            why, reading = _trainer_reading(resolved, key, value)
            if why:
                what = "choice" if isinstance(param, CategoricalParam) else "bound"
                raise ExperimentFileError(f"{source}: {field}: {what} {value!r} is not valid for the trainer: {why}")
            if current_rules and isinstance(param, CategoricalParam) and isinstance(reading, typing.Hashable):
                if reading in read:
                    raise ExperimentFileError(f"{source}: {field}: choices {read[reading]!r} and {value!r} are one "
                                              f"value to the trainer ({key} = {reading!r}); keep one")  # fmt: skip
                read[reading] = value


def _check_compare(spec: ExperimentSpec, source: str) -> None:
    for i, key in enumerate(spec.compare):
        field = f"compare[{i}]"
        if key not in spec.space:
            hint = did_you_mean(key, list(spec.space))
            raise ExperimentFileError(f"{source}: {field}: {key} is not a parameter of space{hint}")
        if not isinstance(spec.space[key], CategoricalParam):
            raise ExperimentFileError(f"{source}: {field}: {key} must be a categorical (choice) parameter")
        if spec.space[key].when:
            raise ExperimentFileError(f"{source}: {field}: {key} has a `when` condition; arms need a value always")
    n_arms = len(arms(spec))
    if spec.budget.trials < n_arms:
        raise ExperimentFileError(
            f"{source}: budget.trials: {spec.budget.trials} trials cannot cover the {n_arms} arms of compare"
        )


def _check_unread_settings(spec: ExperimentSpec, resolved: dict[str, Any], source: str) -> None:
    """Settings the trials' runs would not read (`trainer.config.unread_settings`: a decay horizon in samples beside
    one in steps, checkpoint.every_samples without checkpoint.dir, the noise scale's settings with it off), refused
    before any trial fails on them: in the base config, and with each value the space tunes (each choice, a range's
    bounds). checkpoint.every_samples and keep are read where the controller gives each trial its checkpoint directory
    (Hyperband, ASHA), and checkpoint.resume: false is never read there (every trial resumes)."""
    given_dir = continues_from_checkpoint(spec)
    settings = [(None, None), *((name, v) for name in spec.space for v in _param_values(spec.space[name]))]
    for name, value in settings:
        raw = resolved
        if name is not None:
            raw = copy.deepcopy(resolved)
            set_dotted(raw, trainer_key(name), value)
        cfg = config_from_dict(raw)
        unread = unread_settings(cfg)
        if given_dir:
            unread.pop("checkpoint.every_samples", None)
            unread.pop("checkpoint.keep", None)
            unread.pop("checkpoint.resume", None)
            if not cfg.checkpoint.resume:  # every trial continues its configuration's checkpoint (hpo.trial.entry)
                unread["checkpoint.resume"] = (
                    f"checkpoint.resume: false, but tuner {spec.tuner.name} continues each promoted configuration "
                    "from the checkpoint of its lower budget, so every trial resumes: remove checkpoint.resume"
                )
        if unread:
            where = "base_config + overrides" if name is None else f"space.{name}: with {yaml_scalar(value)}"
            raise ExperimentFileError(f"{source}: {where}: {next(iter(unread.values()))}")


# ------------------------------------------------------------------------------------------------ inert keys
def _check_inert_keys(spec: ExperimentSpec, cfg: TrainerConfig, source: str) -> None:
    """A key tuned where the trainer does not read it (`trainer.config.INERT_UNDER`: clipping.max_norm under
    clipping.strategy none, LAMB's settings under AdamW) spends trials on a dimension that changes nothing, and muddies
    the arms' comparison: refused in each arm and each combination of the choices its space can make, the governing
    key's value taken from the combination's choice, else the arm's compared value, else the base config. A compared
    key that no arm reads would make its arms alike: refused too."""
    compared = [key for key in spec.compare if trainer_key(key) in INERT_UNDER]
    unread: dict[str, list[tuple[str | None, str, Any, str]]] = {key: [] for key in compared}  # why, by arm
    read: set[str] = set()  # compared keys some arm reads
    for plan in arm_plans(spec):
        tuned = [name for name in plan.space.names if trainer_key(name) in INERT_UNDER]
        why_not: dict[str, tuple[str, Any, str]] = {}  # compared key -> why a combination of this arm does not read it
        for picked, setting in _governing_settings(plan, cfg) if tuned or compared else ():
            value_of = {key: value for key, (value, _) in setting.items()}.__getitem__
            for name in tuned:
                inert = inert_under(trainer_key(name), value_of) if plan.space.is_active(name, picked) else None
                if inert is not None:
                    raise ExperimentFileError(_inert_message(spec, name, plan.label, *inert, setting[inert[0]][1],
                                                             source))  # fmt: skip
            for key in compared:
                inert = inert_under(trainer_key(key), value_of)
                if inert is None:
                    read.add(key)
                else:
                    why_not.setdefault(key, (*inert, setting[inert[0]][1]))
        for key in compared:
            if key in why_not:
                unread[key].append((plan.label, *why_not[key]))
    for key in compared:
        if key not in read:
            raise ExperimentFileError(_inert_compare_message(spec, key, unread[key], source))


def _governing_settings(plan: ArmPlan, cfg: TrainerConfig):
    """(the choices picked, governing key -> (its value, where it comes from)) for every combination of the choices
    that decide a governing key of `INERT_UNDER` or whether a parameter that sets one of its keys is active."""
    space = plan.space
    governing = {g for conditions in INERT_UNDER.values() for g, _ in conditions}
    base = {g: (get_dotted(cfg, g), "base_config + overrides") for g in governing}
    base |= {trainer_key(k): (v, "the arm's compared value") for k, v in plan.fixed.items() if trainer_key(k) in base}
    deciding = _with_parents(space, [n for n in space.names if trainer_key(n) in governing | INERT_UNDER.keys()])
    choices = [n for n in deciding if isinstance(space[n], CategoricalParam)]
    for combo in itertools.product(*(space[n].choices for n in choices)):
        picked = dict(zip(choices, combo, strict=True))
        setting = dict(base)
        for name in choices:
            if trainer_key(name) in governing and space.is_active(name, picked):
                setting[trainer_key(name)] = (picked[name], f"a choice of space.{name}")
        yield picked, setting


def _with_parents(space: SearchSpace, names: list[str]) -> list[str]:
    """`names` and every parameter their `when` conditions read, through their parents' own, in the space's order."""
    found, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name not in found:
            found.add(name)
            stack.extend(c.key for c in space[name].when)
    return [n for n in space.names if n in found]


def _reading_values(governing: str, inert: tuple[str, ...]) -> list[str]:
    """The values of `governing` (a trainer key of a few words) under which the trainer reads what they govern."""
    return [v for v in typing.get_args(_LEAVES[governing].annotation) if v not in inert]


def _reads_where(key: str) -> str:
    """`clipping.strategy is not none`, `optimizer.name is lamb`: where the trainer reads `key`, in words."""
    words = []
    for governing, inert in INERT_UNDER[key]:
        reading = _reading_values(governing, inert)
        if len(reading) == 1:
            words.append(f"{governing} is {reading[0]}")
        else:
            words.append(f"{governing} is not {_or(list(inert))}")
    return " and ".join(words)


def _when_clause(clause: Clause) -> str:
    """A clause's right-hand side as the file writes it: `lamb`, `{not: none}`, `{in: [a, b]}`."""
    values = [yaml_scalar(v) for v in clause.values]
    if clause.op == "eq":
        return values[0]
    shown = values[0] if clause.op == "not" and len(values) == 1 else "[" + ", ".join(values) + "]"
    return "{" + f"{clause.op}: {shown}" + "}"


def _when_fix(spec: ExperimentSpec, name: str, trigger: str) -> str | None:
    """The `when` that gives parameter `name` only the choices under which the trainer reads its key (its own
    clauses kept; a clause on `trigger`, the governing key found inert, also where all its choices read it, since it
    holds only while that parameter is active), as YAML's flow form; None where no choice of the space reads it."""
    clauses = {c.key: c for c in spec.space[name].when}
    for governing, inert in INERT_UNDER[trainer_key(name)]:
        param = spec.space.params.get(governing)
        if not isinstance(param, CategoricalParam):
            continue
        if governing != trigger and not any(v in inert for v in param.choices):
            continue
        held = clauses.get(governing)
        allowed = tuple(v for v in param.choices if v not in inert and (held is None or held.holds(v)))
        if not allowed:
            return None
        left_out = tuple(v for v in param.choices if v not in allowed)
        # one value as itself (`lamb`, not `{not: adamw}`), unless a threshold's strategies are `{not: none}`
        one = held is not None or len(_reading_values(governing, inert)) == 1 or not left_out
        if len(allowed) == 1 and one:
            clauses[governing] = Clause(governing, "eq", allowed)
        else:
            clauses[governing] = Clause(governing, "not", left_out) if left_out else Clause(governing, "in", allowed)
    return "when: {" + ", ".join(f"{key}: {_when_clause(c)}" for key, c in clauses.items()) + "}"


def _or(values: list[str]) -> str:
    """`a`, `a or b`, `a, b or c`."""
    return " or ".join(filter(None, [", ".join(values[:-1]), values[-1]]))


def _inert_message(spec: ExperimentSpec, name: str, arm: str | None, governing: str, value: Any, origin: str,
                   source: str) -> str:  # fmt: skip
    key = trainer_key(name)
    where = f"in arm {arm}, " if arm else ""
    said = (f"{source}: space.{name}: {where}{governing} is {yaml_scalar(value)} ({origin}), and the trainer reads "
            f"{key} only where {_reads_where(key)}, so its trials would differ in nothing there: ")  # fmt: skip
    if governing not in spec.space:
        reading = _reading_values(governing, dict(INERT_UNDER[key])[governing])
        return said + f"set {governing} to {_or(reading)} in overrides, or remove it"
    fix = _when_fix(spec, name, governing)
    return said + (f"condition it with {fix}, or remove it" if fix else "no choice of the space reads it; remove it")


def _inert_compare_message(spec: ExperimentSpec, key: str, reasons: list[tuple[str | None, str, Any, str]],
                           source: str) -> str:  # fmt: skip
    field, dotted = f"compare[{spec.compare.index(key)}]", trainer_key(key)
    whys = {(governing, yaml_scalar(value), origin) for _, governing, value, origin in reasons}
    if len(whys) == 1:
        governing, value, origin = next(iter(whys))
        there = f"{governing} is {value} in every arm ({origin.replace('the arm', 'each arm')})"
        reading = _or(_reading_values(governing, dict(INERT_UNDER[dotted])[governing]))
        fix = (
            f"set {governing} to {reading} in overrides"
            if origin.startswith("base")
            else f"let {governing} be {reading}"
        )
    else:
        there = "; ".join(f"in arm {arm}, {governing} is {yaml_scalar(value)} ({origin})"
                          for arm, governing, value, origin in reasons)  # fmt: skip
        fix = f"compare it where {_reads_where(dotted)}"
    return (
        f"{source}: {field}: the trainer reads {dotted} only where {_reads_where(dotted)}, and {there}, so its "
        f"arms would train alike: {fix}, or remove {key} from compare"
    )


def _check_equal_arms(spec: ExperimentSpec, source: str) -> None:
    """Arms must tune the same hyperparameters, or the file must say why not (`allow_unequal_arms`)."""
    if spec.allow_unequal_arms is not None and not spec.compare:
        raise ExperimentFileError(f"{source}: allow_unequal_arms: there are no compare arms; remove it")
    differing = unequal_dimensions(arm_dimensions(spec))
    if differing and spec.allow_unequal_arms is None:
        raise ExperimentFileError(
            f"{source}: compare: the arms {', '.join(arm_dimensions(spec))} do not tune the same hyperparameters, "
            f"so the comparison would favour the arm tuned more: {', '.join(differing)}. Tune every dimension "
            "in every arm (a per-arm range is `key@label`), or say why not with allow_unequal_arms: <reason>"
        )
    if not differing and spec.allow_unequal_arms is not None and _even_budgets(spec):
        raise ExperimentFileError(
            f"{source}: allow_unequal_arms: the arms tune the same dimensions with the same number of trials; remove it"
        )


def _even_budgets(spec: ExperimentSpec) -> bool:
    return len({plan.quota for plan in arm_plans(spec)}) <= 1


def _check_equal_budgets(spec: ExperimentSpec, source: str) -> None:
    """Every arm gets the same number of trials: `budget.trials` must split evenly over the arms, or the file must
    say why not (`allow_unequal_arms`)."""
    labels = [plan.label for plan in arm_plans(spec)]
    total = spec.budget.trials
    if _even_budgets(spec) or spec.allow_unequal_arms is not None:
        return
    fewer, more = total - total % len(labels), total - total % len(labels) + len(labels)
    raise ExperimentFileError(
        f"{source}: budget.trials: {total} trials do not split equally over the {len(labels)} arms "
        f"({', '.join(labels)}): the first {total % len(labels)} would get one trial more, which favours them; "
        f"use {' or '.join(str(n) for n in (fewer, more) if n > 0)}, or say why with allow_unequal_arms: <reason>"
    )


# Options each tuner understands (tuner.options); anything else would be ignored, so it is refused.
# smac_bo: its Sobol design's size, and how many proposals SMAC3 makes between fits of its model (hpo.controllers.smac).
TUNER_OPTIONS: dict[str, tuple[str, ...]] = {
    "smac_bo": ("n_initial_configs", "retrain_after"),
    "nni_evolution": ("population_size",),
}
WHOLE_NUMBER_OPTIONS = ("n_initial_configs", "retrain_after")
# Options of NNI's manager (assessor, web UI), which no in-process NNI tuner has.
NNI_MANAGER_OPTIONS = ("assessor", "assessor_start_step", "webui_host")


def _check_engine(spec: ExperimentSpec, source: str) -> None:
    if spec.engine == "nni" and not _nni_engine_available():
        raise ExperimentFileError(
            f"{source}: engine: the nni engine is not available in this version; use engine: local "
            "(tuners random, grid, smac_bo, smac_hyperband, asha)"
        )
    if spec.runner.name == "dask" and not spec.runner.scheduler:
        raise ExperimentFileError(f"{source}: runner.scheduler: the dask runner needs a scheduler address")
    if spec.runner.name != "dask" and spec.runner.scheduler:
        raise ExperimentFileError(f"{source}: runner.scheduler: only the dask runner uses a scheduler (runner.name is "
                                  f"{spec.runner.name}): remove it, or set runner.name: dask")  # fmt: skip
    _check_simulation(spec, source)
    if spec.engine == "local" and spec.resources.machines:
        raise ExperimentFileError(
            f"{source}: resources.machines: other machines run engine: nni trials (NNI's remote training service); "
            "under engine: local, run them on a Dask cluster (runner: {name: dask, scheduler: ...})"
        )


def _check_simulation(spec: ExperimentSpec, source: str) -> None:
    """A simulated experiment tunes only what the curve table varies, and may set the run length (budget, evaluation
    interval) per arm, as a table with a budget per batch size needs; nothing else would change its trials."""
    simulated = spec.runner.name == "simulated"
    if simulated != (spec.runner.simulation is not None):
        raise ExperimentFileError(f"{source}: runner.simulation: " + (
            "runner: simulated needs its table: runner.simulation.table" if simulated
            else f"only runner: simulated reads a curve table (runner.name is {spec.runner.name})"))  # fmt: skip
    if not simulated:
        return
    if spec.engine != "local":
        raise ExperimentFileError(f"{source}: engine: runner: simulated runs under engine: local")
    read = (*TABLE_DIMENSIONS, *RUN_LENGTH, "seed")  # the training seed picks one of the table's recorded seeds
    _check_assume_no_effect(spec, read, source)
    read = (*read, *spec.runner.simulation.assume_no_effect)  # stated as changing nothing (a plan's assumption)
    ignored = [name for name in spec.space.names if trainer_key(name) not in read]
    if ignored:
        raise ExperimentFileError(
            f"{source}: space.{ignored[0]}: the curve table does not vary {trainer_key(ignored[0])}, so a "
            f"simulated trial could not depend on it; tune only {', '.join(TABLE_DIMENSIONS)} (and set "
            f"{' and '.join(RUN_LENGTH)} per arm, or the training seed, if need be; fix the rest in overrides)"
        )


def _check_assume_no_effect(spec: ExperimentSpec, read: tuple[str, ...], source: str) -> None:
    """`assume_no_effect` lists keys the space tunes or compares that the table does not vary; any other key
    would state nothing (a typo, or a key the table reads)."""
    valid = list(dict.fromkeys(trainer_key(name) for name in spec.space.names if trainer_key(name) not in read))
    for i, key in enumerate(spec.runner.simulation.assume_no_effect):
        if key in valid:
            continue
        field = f"runner.simulation.assume_no_effect[{i}]"
        if key in read:
            raise ExperimentFileError(f"{source}: {field}: {key} is read by a simulated trial (the curve table "
                                      "varies it, or it sets the run length or the seed); remove it")  # fmt: skip
        listed = (f"it takes these keys of space: {', '.join(valid)}" if valid
                  else "the table varies every key of space, so there is nothing to assume: remove it")  # fmt: skip
        raise ExperimentFileError(
            f"{source}: {field}: {key} is not a key of space that the curve table does not vary, so assuming it "
            f"has no effect states nothing{did_you_mean(key, valid)}; {listed}"
        )


def _nni_engine_available() -> bool:
    return importlib.util.find_spec("hpo.nni.engine") is not None


def _check_tuner(spec: ExperimentSpec, cfg: TrainerConfig, source: str) -> None:
    if spec.engine == "nni":  # NNI's tuners, their options, and what NNI's training service can run
        check_nni_spec(spec, source)
        empty = [plan.label for plan in arm_plans(spec) if not len(plan.space)] if spec.compare else []
        if empty:  # the local engine runs such an arm's one configuration; NNI's tuners need a search space
            raise ExperimentFileError(f"{source}: space: arm {empty[0]} has nothing to tune (the space is its compared "
                                      "keys alone), and NNI's tuners need a search space; run it under engine: local "
                                      "or give the arms a dimension to tune")  # fmt: skip
        return
    if spec.tuner.name == "asha":  # typed options, checked with the rungs they make
        asha_plan(spec, cfg.budget.max_samples, cfg.eval.every_samples, source)
        return
    if spec.tuner.name.startswith("nni_"):
        _check_nni_in_process(spec, source)
    allowed = TUNER_OPTIONS.get(spec.tuner.name, ())
    for key in spec.tuner.options:
        if key not in allowed:
            known = f"it understands {', '.join(allowed)}" if allowed else "it takes no options"
            close = closest_name(key, allowed)
            known += f"; did you mean {close}?" if close else ""
            raise ExperimentFileError(f"{source}: tuner.options.{key}: not an option of {spec.tuner.name} ({known})")
        value = spec.tuner.options[key]
        if key in WHOLE_NUMBER_OPTIONS and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ExperimentFileError(f"{source}: tuner.options.{key}: expected a whole number >= 1 (got {value!r})")
    if spec.tuner.name == "grid":
        _check_grid(spec, source)
    if spec.tuner.name == "smac_hyperband":
        if spec.budget.min_budget >= spec.budget.max_budget:
            raise ExperimentFileError(f"{source}: budget.min_budget: must be < budget.max_budget")
        smallest = spec.budget.min_budget * cfg.budget.max_samples
        if smallest < cfg.eval.every_samples:
            raise ExperimentFileError(
                f"{source}: budget.min_budget: the smallest trial ({smallest:.0f} samples) ends before the first "
                f"evaluation (eval.every_samples = {cfg.eval.every_samples}); raise min_budget"
            )


def _check_grid(spec: ExperimentSpec, source: str) -> None:
    """A grid runs each arm's combinations once: every parameter a choice, and each arm's share of budget.trials
    its grid's size (so every combination runs, and none twice)."""
    name = not_a_choice(spec.space)
    if name is not None:
        raise ExperimentFileError(f"{source}: space.{name}: tuner grid needs every parameter a choice (a list of "
                                  "values, e.g. {choice: [0.001, 0.00178, 0.00316]})")  # fmt: skip
    plans = arm_plans(spec)
    sizes = [len(grid_points(plan.space)) for plan in plans]  # an arm with nothing to tune: one combination
    if any(plan.quota != size for plan, size in zip(plans, sizes, strict=True)):
        per_arm = ", ".join(f"{plan.label or 'the experiment'} {size}" for plan, size in zip(plans, sizes, strict=True))
        fits = f"set budget.trials: {sum(sizes)}" if len(set(sizes)) == 1 else "give every arm a grid of one size"
        raise ExperimentFileError(f"{source}: budget.trials: tuner grid runs each combination once, and the "
                                  f"grids have {per_arm} combination(s) ({spec.budget.trials} trials asked); "
                                  f"{fits}")  # fmt: skip


def _check_nni_in_process(spec: ExperimentSpec, source: str) -> None:
    """NNI's tuners under engine: local run in this process (hpo.nni.tuners), only on the simulated runner."""
    name = spec.tuner.name
    if name == "nni_smac":
        raise ExperimentFileError(f"{source}: tuner.name: nni_smac is SMAC3 inside NNI's manager (engine: nni); "
                                  "under engine: local use smac_bo, the same SMAC3 Bayesian optimization")  # fmt: skip
    if spec.runner.name != "simulated":
        raise ExperimentFileError(
            f"{source}: tuner.name: {name} runs with engine: nni, or in-process on the simulated runner "
            f"(runner: simulated); runner: {spec.runner.name} under engine: local runs random, smac_bo, "
            "smac_hyperband or asha"
        )
    for key in spec.tuner.options:
        if key in NNI_MANAGER_OPTIONS:
            raise ExperimentFileError(f"{source}: tuner.options.{key}: {name} runs in-process on the simulated "
                                      "runner, without NNI's manager, assessor or web UI; remove it")  # fmt: skip
    size = spec.tuner.options.get("population_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ExperimentFileError(f"{source}: tuner.options.population_size: {size!r}; use a positive integer")


def _check_objective(spec: ExperimentSpec, cfg: TrainerConfig, source: str) -> None:
    if spec.objective.metric == "time_to_target_s" and not (cfg.budget.max_time_s or spec.budget.trial_timeout_s):
        raise ExperimentFileError(
            f"{source}: objective.metric: time_to_target_s needs a time cap for its penalty; "
            "set budget.trial_timeout_s or the trainer's budget.max_time_s"
        )
    natural = NATURAL_DIRECTION[spec.objective.metric]
    if spec.objective.direction not in (None, natural):
        raise ExperimentFileError(f"{source}: objective.direction: {spec.objective.metric} must be {natural}d")


def _check_resources(spec: ExperimentSpec, cfg: TrainerConfig, source: str) -> None:
    res = spec.resources
    if isinstance(res.gpus, list) and res.gpus_per_trial > len(res.gpus):
        raise ExperimentFileError(
            f"{source}: resources.gpus_per_trial: {res.gpus_per_trial} GPUs per trial but only {len(res.gpus)} listed"
        )
    if res.trials_per_gpu > 1 and res.gpus_per_trial > 1:
        raise ExperimentFileError(f"{source}: resources.trials_per_gpu: sharing a GPU needs gpus_per_trial: 1")
    micro = key_values(spec, cfg, "batch.micro_batch_size")
    if res.trials_per_gpu > 1 and res.gpus != "none" and micro is not None and "auto" in micro[1]:
        raise ExperimentFileError(
            f"{source}: {where_set(spec, micro[0], 'batch.micro_batch_size')}: batch.micro_batch_size auto fills the "
            f"memory a GPU has free when a trial starts, and resources.trials_per_gpu {res.trials_per_gpu} has "
            "trials share one: set a number, or trials_per_gpu: 1"
        )
    if res.cpu_slots > 1 and res.gpus == "none" and micro is not None and "auto" in micro[1]:
        raise ExperimentFileError(
            f"{source}: {where_set(spec, micro[0], 'batch.micro_batch_size')}: batch.micro_batch_size auto plans "
            f"for the host's memory as if its trial were alone, and resources.cpu_slots {res.cpu_slots} runs trials "
            "side by side: set a number (on the CPU a small one is also the faster), or cpu_slots: 1"
        )
    _check_batch_divisibility(spec, cfg, source)


TUNER_SEED_LIMIT = 2**32  # SMAC3 and NumPy's legacy seeding take 0 to 2**32 - 1


def _check_resources_read(spec: ExperimentSpec, source: str) -> None:
    """Resources the trials' placement would not read: this machine's GPU ids where the trials run on other machines
    (NNI's remote service: each machine's own ids) or on a Dask cluster (`ignored_on_dask`); a host's limits and
    slots on the simulated runner (`ignored_when_simulated`)."""
    if spec.resources.machines and isinstance(spec.resources.gpus, list):
        raise ExperimentFileError(
            f"{source}: resources.gpus: {spec.resources.gpus} are GPU ids of this machine, but the trials run on "
            "resources.machines, each on its own GPUs: give the ids per machine (resources.machines[i].gpus) and "
            "set resources.gpus to all (or none, for trials on their CPUs)"
        )
    if spec.runner.name == "dask" and (ignored := ignored_on_dask(spec.resources)):
        raise ExperimentFileError(f"{source}: {ignored}")
    if spec.runner.name == "simulated" and (ignored := ignored_when_simulated(spec)):
        raise ExperimentFileError(f"{source}: {ignored}")


def ignored_when_simulated(spec: ExperimentSpec) -> str | None:
    """What the simulated runner would not read, in words (None: nothing): it starts no process and its slots are
    budget.max_parallel, each training at the pace of resources.gpus_per_trial whole GPUs."""
    res, why = spec.resources, "the simulated runner starts no process"
    slots = "its slots are budget.max_parallel, each as fast as resources.gpus_per_trial whole GPUs"
    ignored = [(res.memory_limit_mb is not None, f"resources.memory_limit_mb: {res.memory_limit_mb}", why),
               (res.cpu_slots > 1, f"resources.cpu_slots: {res.cpu_slots}", slots),
               (res.trials_per_gpu > 1, f"resources.trials_per_gpu: {res.trials_per_gpu}", slots),
               (not spec.runner.preload, "runner.preload: false", why)]  # fmt: skip
    return next((f"{field}, but {reason}: remove it" for unread, field, reason in ignored if unread), None)


def ignored_on_dask(resources) -> str | None:
    """What of `resources` the dask runner would not read, in words (None: nothing): it places each trial on a
    worker that declares the GPUs it needs (`dask worker --resources GPU=N`), so it takes neither this machine's GPU
    ids nor a share of a GPU (`trials_per_gpu`), and runs a CPU trial on each of its workers' threads (`cpu_slots`)."""
    if isinstance(resources.gpus, list):
        return (f"resources.gpus: {resources.gpus} are GPU ids of this machine, but the dask runner places trials "
                "on the GPUs its workers declare (dask worker --resources GPU=N): set resources.gpus to all (or "
                "none)")  # fmt: skip
    if resources.trials_per_gpu > 1:
        return (f"resources.trials_per_gpu: {resources.trials_per_gpu}, but the dask runner gives each trial whole "
                "GPUs of a worker (resources.gpus_per_trial of them), never a share of one: remove it")  # fmt: skip
    if resources.cpu_slots > 1:
        return (f"resources.cpu_slots: {resources.cpu_slots}, but the dask runner runs a CPU trial on each thread "
                "of its workers (dask worker --nthreads N): remove it, and give the workers the threads")  # fmt: skip
    return None


def _check_settings_read(spec: ExperimentSpec, source: str) -> None:
    """Experiment settings only some tuners, objectives or engines read, written where none would read them
    (`ExperimentSpec.unread_fields`), whatever their value (the default too: the file asks for something nothing
    does): Hyperband's budgets under another tuner, a budget an asha option sets in its place, the penalty of a miss
    under an accuracy metric; runner.preload: false under NNI's manager (which starts every trial itself)."""
    options = spec.tuner.options
    for section, key in spec.unread_fields():
        if key not in getattr(spec, section).model_fields_set:
            continue
        value = getattr(getattr(spec, section), key)
        if section == "objective":
            raise ExperimentFileError(
                f"{source}: objective.penalty_factor: {value:g}, but it scores a run that misses the target under "
                f"samples_to_target and time_to_target_s; {spec.objective.metric} scores the accuracy itself (0 for "
                "a run that did not end normally): remove it"
            )
        if spec.tuner.name == "asha":
            option = next(o for o, k in ASHA_BUDGET_OPTIONS.items() if k == key)
            raise ExperimentFileError(f"{source}: budget.{key}: {value:g}, but tuner.options.{option} sets asha's in "
                                      "its place: remove one of them")  # fmt: skip
        raise ExperimentFileError(
            f"{source}: budget.{key}: {value:g}, but tuner {spec.tuner.name} trains every trial to the full budget; "
            "budget.min_budget, max_budget and eta are read by smac_hyperband and asha: remove it, or choose one of "
            "them"
        )
    if spec.tuner.name == "asha":
        unread = [key for key in ("min_points_in_model", "random_fraction") if key in options]
        if options.get("sampler") == "random" and unread:
            raise ExperimentFileError(f"{source}: tuner.options.{unread[0]}: read where asha samples from its model, "
                                      "and sampler is random: remove it, or set sampler: model")  # fmt: skip
    if spec.engine == "nni" and not spec.runner.preload:
        raise ExperimentFileError(f"{source}: runner.preload: false, but under engine: nni NNI's manager starts "
                                  "every trial itself, without a launcher to fork from: remove it")  # fmt: skip


def _check_tuner_seed(spec: ExperimentSpec, source: str) -> None:
    if not 0 <= spec.tuner.seed < TUNER_SEED_LIMIT:
        raise ExperimentFileError(f"{source}: tuner.seed: {spec.tuner.seed} is outside 0 to 2**32 - 1, the seeds SMAC3 "
                                  "and NumPy take: use one in that range")  # fmt: skip
    if spec.tuner.name in SEEDLESS_TUNERS and spec.tuner.seed != 0:
        raise ExperimentFileError(
            f"{source}: tuner.seed: {spec.tuner.seed}, but the {spec.tuner.name} tuner draws nothing (it runs the "
            "space's points in order), so no seed changes its trials: remove it (the trials' training seed is the "
            "trainer's `seed`, in overrides)"
        )


SEED_LIMIT = 2**31 - 1  # a trial's training seed is stored as a 32-bit integer (PostgreSQL's INTEGER)


def _check_seed(spec: ExperimentSpec, cfg: TrainerConfig, source: str) -> None:
    """Confirmation runs train with the seeds after the config's, and the database keeps each as a 32-bit integer."""
    last = cfg.seed + spec.budget.most_confirm_seeds
    if last > SEED_LIMIT:
        raise ExperimentFileError(
            f"{source}: {where_set(spec, None, 'seed')}: seed {cfg.seed}: the confirmation runs train with the seeds "
            f"after it, up to {last}, and the database keeps a trial's seed as a 32-bit integer: use a seed of at most "
            f"{SEED_LIMIT - spec.budget.most_confirm_seeds}"
        )


# Clipping strategies that clip each rank's gradient before the all-reduce: on one process, a whole-gradient clip
LOCAL_CLIPS = ("before_allreduce", "bucketwise")


def _check_clipping_ranks(spec: ExperimentSpec, cfg: TrainerConfig, source: str) -> None:
    """Arms of clipping strategies that clip before the all-reduce train alike on one rank per trial: a trial of one
    process has no all-reduce and no DDP bucket, and its trainer clips the whole gradient by max_norm under
    before_allreduce and bucketwise, as under after_allreduce. Comparing them there would spend the budget on
    identical arms and read noise as a verdict."""
    if "clipping.strategy" not in spec.compare:
        return
    strategies = key_values(spec, cfg, "clipping.strategy")
    local = [s for s in LOCAL_CLIPS if strategies is not None and s in strategies[1]]
    on_gpu = spec.resources.gpus != "none"
    if not local or spec.resources.ranks_per_trial(on_gpu) > 1:
        return
    field = "gpus_per_trial" if on_gpu else "cpu_ranks_per_trial"
    raise ExperimentFileError(
        f"{source}: compare: clipping.strategy compares {' and '.join(local)} on 1 rank per trial "
        f"(resources.{field}): with one process there is no all-reduce and no DDP bucket, so they clip the whole "
        f"gradient by max_norm, as after_allreduce does, and their arms would train alike; give each trial several "
        f"ranks (resources.{field}: 2 or more), or compare none and after_allreduce only"
    )


# Trainer settings a trial without a GPU cannot run: key -> (value, why)
NEEDS_CUDA = {
    "device": ("cuda", "there is no CUDA device (auto or cpu run there)"),
    "precision.dtype": ("fp16", "fp16 needs a CUDA device (bf16 or fp32 run there)"),
    "model.attention": ("varlen", "the varlen kernel needs CUDA (auto, packed, jagged or padded run there)"),
    "model.varlen_kernel": ("cudnn", "cuDNN's varlen attention needs CUDA (flash, the default, is refused nowhere)"),
    "model.fused_norm": (True, "the fused kernels are Triton's, for a CUDA GPU (false runs there)"),
    "model.fused_gelu": (True, "the fused kernels are Triton's, for a CUDA GPU (false runs there)"),
}


def _check_cpu_trials(spec: ExperimentSpec, cfg: TrainerConfig, source: str) -> None:
    """With resources.gpus: none every trial runs on the CPU: a setting that needs CUDA would fail every one."""
    for key, (value, why) in NEEDS_CUDA.items():
        candidates = key_values(spec, cfg, key)
        if candidates is not None and value in candidates[1]:
            raise ExperimentFileError(
                f"{source}: {where_set(spec, candidates[0], key)}: {key} {value}, but resources.gpus: none runs every "
                f"trial on the CPU, where {why}: change it, or give the trials GPUs (resources.gpus)"
            )


def key_values(spec: ExperimentSpec, cfg: TrainerConfig, key: str) -> tuple[str | None, list[Any]] | None:
    """(the space field, the values) trainer `key` can take: the base config's where the space does not tune it
    (field None), a choice's values; None for a numeric range (checked when a trial runs)."""
    params = {name: spec.space[name] for name in spec.space if trainer_key(name) == key}
    if not params:
        return None, [get_dotted(cfg, key)]
    if not all(isinstance(p, CategoricalParam) for p in params.values()):
        return None
    return f"space.{next(iter(params))}", [v for p in params.values() for v in p.choices]


def where_set(spec: ExperimentSpec, field: str | None, *keys: str) -> str:
    """The field a message names for trainer `keys`: `field` (the space's) where given, else `overrides.KEY` where
    the file overrides one of them, else `base_config`."""
    if field:
        return field
    return next((f"overrides.{key}" for key in keys if key in spec.overrides), "base_config")


def _check_batch_divisibility(spec: ExperimentSpec, cfg: TrainerConfig, source: str) -> None:
    """The trainer needs global_batch_size % (micro_batch_size x ranks) == 0; catch it before any trial runs."""
    global_ = key_values(spec, cfg, "batch.global_batch_size")
    micro = key_values(spec, cfg, "batch.micro_batch_size")
    if global_ is None or micro is None:
        return
    field = global_[0] or micro[0] or where_set(spec, None, "batch.global_batch_size", "batch.micro_batch_size")
    gpus = spec.resources.gpus
    devices = (True, False) if gpus == "all" else (False,) if gpus == "none" else (True,)
    for on_gpu in devices:
        ranks = spec.resources.ranks_per_trial(on_gpu)
        for g, m in itertools.product(global_[1], micro[1]):
            if m == "auto" and g % ranks:
                raise ExperimentFileError(
                    f"{source}: {field}: batch.global_batch_size {g} is not a multiple of the ranks per trial "
                    f"({ranks} {'GPU' if on_gpu else 'CPU'} ranks)"
                )
            if m != "auto" and g % (m * ranks):
                raise ExperimentFileError(
                    f"{source}: {field}: batch.global_batch_size {g} is not a multiple of batch.micro_batch_size "
                    f"x ranks per trial ({m} x {ranks} {'GPU' if on_gpu else 'CPU'} ranks)"
                )
