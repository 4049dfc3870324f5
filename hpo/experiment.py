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

from __future__ import annotations

import copy
import difflib
import itertools
import math
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_serializer, field_validator
from pydantic_core import PydanticCustomError

from hpo.errors import ExperimentFileError
from search_spaces.errors import SearchSpaceError
from search_spaces.space import CategoricalParam, FloatParam, SearchSpace, trainer_key
from trainer.config import ConfigError, TrainerConfig, config_from_dict  # the schema and the error it raises

MetricName = Literal["samples_to_target", "time_to_target_s", "best_mlm_accuracy", "final_mlm_accuracy"]
TunerName = Literal[
    "random", "smac_bo", "smac_hyperband", "nni_tpe", "nni_random", "nni_anneal", "nni_evolution", "nni_smac"
]
NATURAL_DIRECTION = {
    "samples_to_target": "minimize",
    "time_to_target_s": "minimize",
    "best_mlm_accuracy": "maximize",
    "final_mlm_accuracy": "maximize",
}
_SLUG = r"^[a-z0-9][a-z0-9_-]{0,63}$"


# ------------------------------------------------------------------------------------------------ schema
class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Objective(_Section):
    metric: MetricName = Field("samples_to_target", description="What a trial is scored by.")
    direction: Literal["minimize", "maximize"] | None = Field(None, description="Default: the metric's natural one.")
    penalty_factor: float = Field(2.0, gt=1.0, description="Misses score penalty_factor x cap x (1 + gap).")


class Tuner(_Section):
    name: TunerName = Field("smac_bo", description="Controller: SMAC3 BO/Hyperband, random, or an NNI tuner.")
    seed: int = Field(0, description="Seed of the tuner (and of random search).")
    options: dict[str, Any] = Field(default_factory=dict, description="Passed to the tuner as is.")


class Budget(_Section):
    trials: int = Field(ge=1, description="Trials in total (over all arms).")
    max_parallel: int = Field(1, ge=1, description="Trials running at the same time at most.")
    trial_timeout_s: float | None = Field(None, gt=0, description="Kill a trial after this many seconds.")
    min_budget: float = Field(1 / 9, gt=0, le=1, description="Hyperband: smallest fraction of budget.max_samples.")
    max_budget: float = Field(1.0, gt=0, le=1, description="Hyperband: largest fraction of budget.max_samples.")
    eta: int = Field(3, ge=2, description="Hyperband: successive-halving ratio.")
    confirm_seeds: int = Field(0, ge=0, description="Re-run each arm's best config with this many more seeds.")


class Machine(_Section):
    """A machine of NNI's remote training service (engine: nni): NNI reaches it over SSH with a key."""

    host: str = Field(min_length=1, description="Host name or address, reachable over SSH from the controller.")
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    user: str = Field(min_length=1, description="SSH user.")
    ssh_key_file: str = Field("~/.ssh/id_rsa", description="Private key on the controller (no passwords: NNI's "
                              "web UI would show them).")  # fmt: skip
    python_path: str | None = Field(None, description="Directory of the Python that has this project installed "
                                    "there (put first on PATH); default: the machine's python3.")  # fmt: skip
    gpus: list[int] | None = Field(None, description="GPU ids NNI may use there; default: all of them.")


class Resources(_Section):
    gpus: list[int] | Literal["all", "none"] = Field("all", description="GPU ids to use, all, or none (CPU).")
    gpus_per_trial: int = Field(1, ge=1, description="GPUs per trial, one rank (process) each.")
    trials_per_gpu: int = Field(1, ge=1, description="Small trials sharing one GPU (gpus_per_trial must be 1).")
    cpu_slots: int = Field(1, ge=1, description="Trials side by side when no GPU is used.")
    cpu_ranks_per_trial: int = Field(1, ge=1, description="gloo ranks (processes) of one trial on CPU.")
    memory_limit_mb: int | None = Field(None, ge=1, description="Address-space limit of each trial process (CPU).")
    machines: list[Machine] = Field(default_factory=list, description="engine: nni only: run the trials on these "
                                    "machines (NNI's remote training service) instead of this one.")  # fmt: skip

    def ranks_per_trial(self, on_gpu: bool) -> int:
        """Data-parallel ranks of one trial on GPUs or on CPU."""
        return self.gpus_per_trial if on_gpu else self.cpu_ranks_per_trial

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        if value in ("all", "none"):
            return value
        ok = isinstance(value, list) and value and all(type(g) is int and g >= 0 for g in value)
        if not ok or len(set(value)) != len(value):
            raise ValueError(f"expected all, none or a non-empty list of distinct GPU ids (>= 0), got {value!r}")
        return value


class Runner(_Section):
    name: Literal["local", "dask"] = Field("local", description="local: slots on this machine; dask: a cluster.")
    scheduler: str | None = Field(None, description="Dask scheduler address, e.g. tcp://host:8786 (dask only).")
    preload: bool = Field(
        True, description="Fork each single-process trial from a launcher that has already imported the trial side "
        "(the storage, SQLAlchemy): about 0.2 s less CPU per trial. false: every trial starts a new interpreter.",
    )  # fmt: skip

    @field_validator("scheduler")
    @classmethod
    def _scheduler(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^(tcp|tls|inproc|ucx)://[^\s]+$", value):
            raise ValueError(f"expected an address such as tcp://host:8786, got {value!r}")
        return value


class ExperimentSpec(_Section):
    """A validated experiment file. Build it with `load_experiment` / `experiment_from_dict`."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(description="Slug: lowercase letters, digits, '-' and '_'.")
    description: str = Field("", description="One line shown in listings.")
    base_config: str | dict[str, Any] = Field(description="Trainer YAML (relative to this file) or inline.")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Dotted trainer keys set on the base.")
    space: SearchSpace = Field(description="Parameters to tune (search_spaces.space syntax).")
    objective: Objective = Field(default_factory=Objective)
    compare: list[str] = Field(default_factory=list, description="Categorical keys whose values form arms.")
    tuner: Tuner = Field(default_factory=Tuner)
    budget: Budget
    resources: Resources = Field(default_factory=Resources)
    engine: Literal["local", "nni"] = Field("local", description="local: our study loop; nni: an NNI experiment.")
    runner: Runner = Field(default_factory=Runner, description="Where the local engine runs trials.")
    allow_unequal_arms: str | None = Field(
        None, description="Why the compare arms may tune different hyperparameters (refused without a reason)."
    )

    _source: str = PrivateAttr("<dict>")
    _base: dict[str, Any] | None = PrivateAttr(None)

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        if not isinstance(value, str) or not re.match(_SLUG, value):
            raise ValueError(f"expected a slug of lowercase letters, digits, '-' and '_' (<= 64), got {value!r}")
        return value

    @field_validator("base_config", mode="before")
    @classmethod
    def _base_config(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip() or isinstance(value, dict):
            return value
        raise ValueError(f"expected a path to a trainer YAML file or an inline mapping, got {value!r}")

    @field_validator("allow_unequal_arms", mode="before")
    @classmethod
    def _reason(cls, value: Any) -> Any:
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise ValueError(f"expected the reason the arms may differ, as a sentence, got {value!r}")
        return value

    @field_validator("compare", mode="before")
    @classmethod
    def _compare(cls, value: Any) -> Any:
        value = [value] if isinstance(value, str) else value
        if isinstance(value, list) and len(set(map(str, value))) != len(value):
            raise ValueError("a key is listed twice")
        return value

    @field_validator("space", mode="before")
    @classmethod
    def _space(cls, value: Any) -> SearchSpace:
        if isinstance(value, SearchSpace):
            return value
        try:
            return SearchSpace.from_dict(value)
        except SearchSpaceError as e:
            raise PydanticCustomError("search_space", "{reason}", {"key": e.key, "reason": e.reason}) from None

    @field_serializer("space")
    def _dump_space(self, space: SearchSpace) -> dict[str, Any]:
        return space.to_dict()

    @property
    def source(self) -> str:
        """Where the spec came from (the experiment file's path, or `<dict>`)."""
        return self._source

    @property
    def direction(self) -> str:
        """The objective's direction, explicit or the metric's natural one."""
        return self.objective.direction or NATURAL_DIRECTION[self.objective.metric]

    def resolved_base(self) -> dict[str, Any]:
        """A copy of the base trainer config (as a raw mapping) with the overrides applied."""
        if self._base is None:
            raise ExperimentFileError(f"{self._source}: build specs with load_experiment / experiment_from_dict")
        return copy.deepcopy(self._base)

    def self_contained(self) -> dict[str, Any]:
        """The spec as a plain mapping with the base config inline and overrides applied (for storage)."""
        data = self.model_dump(mode="json")
        data.update(base_config=self.resolved_base(), overrides={})
        return data


# ------------------------------------------------------------------------------------------------ loading
def load_experiment(path: str | Path) -> ExperimentSpec:
    """Read and validate an experiment file; errors name the file and the dotted field."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ExperimentFileError(f"{path}: the experiment file does not exist") from None
    except OSError as e:
        raise ExperimentFileError(f"{path}: cannot read the experiment file ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ExperimentFileError(f"{path}: {_yaml_where(e)}not valid YAML ({_yaml_problem(e)})") from None
    return experiment_from_dict(data, str(path), base_dir=path.parent)


def experiment_from_dict(
    data: Any, source: str = "<dict>", base_dir: str | Path | None = None, check_arms: bool = True
) -> ExperimentSpec:
    """Validate a parsed experiment file. Relative base_config paths resolve against `base_dir`
    (default: the directory of `source` when it is a file, else the working directory). `check_arms=False`
    reads a stored experiment as it ran, without the equal-arms rule of newer versions."""
    if not isinstance(data, Mapping):
        raise ExperimentFileError(f"{source}: the top level must be a mapping of fields, got {type(data).__name__}")
    try:
        spec = ExperimentSpec.model_validate(dict(data))
    except ValidationError as e:
        raise ExperimentFileError(_format_validation_error(e, source)) from None
    if base_dir is None:
        base_dir = Path(source).parent if Path(source).is_file() else Path.cwd()
    base = _load_base(spec.base_config, Path(base_dir), source)
    resolved = _apply_overrides(base, spec.overrides, source)
    cfg = config_from_dict(resolved)
    _check_space(spec, resolved, source)
    _check_compare(spec, source)
    if check_arms:
        _check_equal_arms(spec, source)
    _check_engine(spec, source)
    _check_tuner(spec, cfg, source)
    _check_objective(spec, cfg, source)
    _check_resources(spec, cfg, source)
    spec._source, spec._base = source, resolved
    return spec


def _yaml_where(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    return getattr(e, "problem", None) or str(e).splitlines()[0]


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "search_space":
            loc += [e["ctx"]["key"]] if e["ctx"].get("key") else []
        elif e["type"] == "extra_forbidden":
            msg = f"unknown field{_did_you_mean(loc[-1], _fields_at(loc[:-1]))}"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{source}: {_dotted(loc)}: {msg}")
    return "\n".join(lines)


def _dotted(loc: list[str]) -> str:
    return ".".join(loc) if loc else "<top level>"


def _fields_at(loc: list[str]) -> list[str]:
    """The allowed field names of the (nested) section at `loc` of an experiment file."""
    model: Any = ExperimentSpec
    for part in loc:
        model = model.model_fields[part].annotation if part in getattr(model, "model_fields", {}) else None
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _load_base(base_config: str | dict[str, Any], base_dir: Path, source: str) -> dict[str, Any]:
    if isinstance(base_config, dict):
        raw, where = copy.deepcopy(base_config), "inline"
    else:
        path = Path(base_config).expanduser()
        path = path if path.is_absolute() else base_dir / path
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise ExperimentFileError(f"{source}: base_config: file {path} does not exist") from None
        except (OSError, yaml.YAMLError) as e:
            raise ExperimentFileError(f"{source}: base_config: cannot read {path}: {e}") from None
        where = str(path)
    try:
        config_from_dict(raw, where)
    except ConfigError as e:
        raise ExperimentFileError(f"{source}: base_config: {_indent(str(e))}") from None
    return raw


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def _apply_overrides(base: dict[str, Any], overrides: dict[str, Any], source: str) -> dict[str, Any]:
    resolved = copy.deepcopy(base)
    for key, value in overrides.items():
        _check_trainer_key(key, f"overrides.{key}", source)
        set_dotted(resolved, key, value)
    try:
        config_from_dict(resolved, "base_config + overrides")
    except ConfigError as e:
        bad = [key for key in overrides if _error_line(str(e), key)]
        field = f"overrides.{bad[0]}" if bad else "overrides"
        raise ExperimentFileError(f"{source}: {field}: {_indent(str(e))}") from None
    return resolved


def _error_line(message: str, key: str) -> str | None:
    """The line of a trainer ConfigError about `key` (its lines read `  dotted.key: what is wrong`)."""
    return next((line.strip() for line in message.splitlines() if line.strip().startswith(f"{key}:")), None)


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


def _check_trainer_key(key: str, field: str, source: str) -> None:
    if key in _LEAVES:
        return
    sections = {k.rsplit(".", 1)[0] for k in _LEAVES if "." in k}
    if key in sections:
        raise ExperimentFileError(f"{source}: {field}: {key} is a section; name one of its keys ({key}.<key>)")
    hint = _did_you_mean(key, list(_LEAVES))
    raise ExperimentFileError(f"{source}: {field}: {key} is not a trainer config key{hint}")


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.c` in a nested mapping, creating sections as needed."""
    *sections, leaf = key.split(".")
    node = raw
    for part in sections:
        child = node.get(part)
        node[part] = child = child if isinstance(child, dict) else {}
        node = child
    node[leaf] = value


def _trainer_error(resolved: dict[str, Any], key: str, value: Any) -> str | None:
    """Why the trainer rejects `key = value` on the resolved base config (None: it accepts it)."""
    raw = copy.deepcopy(resolved)
    set_dotted(raw, key, value)
    try:
        config_from_dict(raw)
    except ConfigError as e:
        return _error_line(str(e), key) or "; ".join(line.strip() for line in str(e).splitlines()[1:]) or str(e)
    return None


def _is_int_field(info: Any) -> bool:
    ann = info.annotation
    args = set(typing.get_args(ann)) - {type(None)} if typing.get_args(ann) else {ann}
    return int in args and float not in args


# ------------------------------------------------------------------------------------------------ checks
def _check_space(spec: ExperimentSpec, resolved: dict[str, Any], source: str) -> None:
    for name in spec.space:
        key, param, field = trainer_key(name), spec.space[name], f"space.{name}"
        _check_trainer_key(key, field, source)
        if isinstance(param, FloatParam) and _is_int_field(_LEAVES[key]):
            raise ExperimentFileError(f"{source}: {field}: {key} is an integer; use int: [low, high]")
        values = param.choices if isinstance(param, CategoricalParam) else (param.low, param.high)
        for value in values:
            why = _trainer_error(resolved, key, value)
            if why:
                what = "choice" if isinstance(param, CategoricalParam) else "bound"
                raise ExperimentFileError(f"{source}: {field}: {what} {value!r} is not valid for the trainer: {why}")


def _check_compare(spec: ExperimentSpec, source: str) -> None:
    for i, key in enumerate(spec.compare):
        field = f"compare[{i}]"
        if key not in spec.space:
            hint = _did_you_mean(key, list(spec.space))
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


def arm_dimensions(spec: ExperimentSpec) -> dict[str, dict[str, str]]:
    """What each compare arm tunes: arm label -> trainer key -> its kind (`float, log`, `int`, `choice [a, b]`).

    Dimensions are trainer keys, so `optimizer.lr@lamb` and `optimizer.lr@adamw` are the same dimension;
    their ranges may differ, since a per-arm parameter (`name@label`) is how a file gives an arm its own range.
    """
    from hpo.study import arm_subspace  # the study loop's definition of an arm's space

    dims: dict[str, dict[str, str]] = {}
    for fixed in arms(spec) if spec.compare else []:
        sub = arm_subspace(spec.space, fixed)
        kinds: dict[str, set[str]] = {}
        for name in sub.names:
            kinds.setdefault(trainer_key(name), set()).add(_dimension_kind(sub[name]))
        dims[arm_label(fixed)] = {key: " | ".join(sorted(k)) for key, k in kinds.items()}
    return dims


def _dimension_kind(param: Any) -> str:
    if isinstance(param, CategoricalParam):
        return f"choice [{', '.join(map(_yaml_scalar, param.choices))}]"
    return ("float" if isinstance(param, FloatParam) else "int") + (", log" if param.log else "")


def unequal_dimensions(dims: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The dimensions not tuned alike by every arm, each as `key (what each arm tunes)`; [] when equal."""
    keys = sorted({key for arm in dims.values() for key in arm})
    differing = []
    for key in keys:
        seen = {label: arm.get(key, "not tuned") for label, arm in dims.items()}
        if len(set(seen.values())) > 1:
            differing.append(f"{key} ({'; '.join(f'{label}: {kind}' for label, kind in seen.items())})")
    return differing


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
    if not differing and spec.allow_unequal_arms is not None:
        raise ExperimentFileError(f"{source}: allow_unequal_arms: the arms tune the same dimensions; remove it")


# Options each tuner understands (tuner.options); anything else would be ignored, so it is refused.
TUNER_OPTIONS: dict[str, tuple[str, ...]] = {"smac_bo": ("n_initial_configs",)}


def _check_engine(spec: ExperimentSpec, source: str) -> None:
    if spec.engine == "nni" and not _nni_engine_available():
        raise ExperimentFileError(
            f"{source}: engine: the nni engine is not available in this version; use engine: local "
            "(tuners random, smac_bo, smac_hyperband)"
        )
    if spec.runner.name == "dask" and not spec.runner.scheduler:
        raise ExperimentFileError(f"{source}: runner.scheduler: the dask runner needs a scheduler address")
    if spec.runner.name == "local" and spec.runner.scheduler:
        raise ExperimentFileError(f"{source}: runner.scheduler: only the dask runner uses a scheduler")
    if spec.engine == "local" and spec.resources.machines:
        raise ExperimentFileError(
            f"{source}: resources.machines: other machines run engine: nni trials (NNI's remote training service); "
            "under engine: local, run them on a Dask cluster (runner: {name: dask, scheduler: ...})"
        )


def _nni_engine_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("hpo.nni.engine") is not None


def _check_tuner(spec: ExperimentSpec, cfg: TrainerConfig, source: str) -> None:
    if spec.engine == "nni":  # NNI's tuners, their options, and what NNI's training service can run
        from hpo.nni.config import check_nni_spec

        check_nni_spec(spec, source)
        return
    allowed = TUNER_OPTIONS.get(spec.tuner.name, ())
    for key in spec.tuner.options:
        if key not in allowed:
            known = f"it understands {', '.join(allowed)}" if allowed else "it takes no options"
            raise ExperimentFileError(f"{source}: tuner.options.{key}: not an option of {spec.tuner.name} ({known})")
    if spec.tuner.name.startswith("nni_") and spec.engine != "nni":
        raise ExperimentFileError(f"{source}: tuner.name: {spec.tuner.name} runs only with engine: nni")
    if spec.tuner.name == "smac_hyperband":
        if spec.budget.min_budget >= spec.budget.max_budget:
            raise ExperimentFileError(f"{source}: budget.min_budget: must be < budget.max_budget")
        smallest = spec.budget.min_budget * cfg.budget.max_samples
        if smallest < cfg.eval.every_samples:
            raise ExperimentFileError(
                f"{source}: budget.min_budget: the smallest trial ({smallest:.0f} samples) ends before the first "
                f"evaluation (eval.every_samples = {cfg.eval.every_samples}); raise min_budget"
            )


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
    _check_batch_divisibility(spec, cfg, source)


def _candidates(spec: ExperimentSpec, cfg: TrainerConfig, key: str) -> tuple[str | None, list[Any]] | None:
    """(the space field, the values) trainer `key` can take; None for a numeric range (checked when a trial runs)."""
    params = {name: spec.space[name] for name in spec.space if trainer_key(name) == key}
    if not params:
        section, leaf = key.split(".")
        return None, [getattr(getattr(cfg, section), leaf)]
    if not all(isinstance(p, CategoricalParam) for p in params.values()):
        return None
    return f"space.{next(iter(params))}", [v for p in params.values() for v in p.choices]


def _check_batch_divisibility(spec: ExperimentSpec, cfg: TrainerConfig, source: str) -> None:
    """The trainer needs global_batch_size % (micro_batch_size x ranks) == 0; catch it before any trial runs."""
    global_ = _candidates(spec, cfg, "batch.global_batch_size")
    micro = _candidates(spec, cfg, "batch.micro_batch_size")
    if global_ is None or micro is None:
        return
    field = global_[0] or micro[0] or "base_config"
    gpus = spec.resources.gpus
    devices = (True, False) if gpus == "all" else (False,) if gpus == "none" else (True,)
    for on_gpu in devices:
        ranks = spec.resources.ranks_per_trial(on_gpu)
        for g, m in itertools.product(global_[1], micro[1]):
            if g % (m * ranks):
                raise ExperimentFileError(
                    f"{source}: {field}: batch.global_batch_size {g} is not a multiple of batch.micro_batch_size "
                    f"x ranks per trial ({m} x {ranks} {'GPU' if on_gpu else 'CPU'} ranks)"
                )


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
        # A short run must be a prefix of the full one: pin the decay horizon the trainer would derive.
        total = full.schedule.total_steps or math.ceil(full.budget.max_samples / full.batch.global_batch_size)
        set_dotted(raw, "schedule.total_steps", total)
        set_dotted(raw, "budget.max_samples", max(1, round(full.budget.max_samples * fidelity)))
    return config_from_dict(raw, f"{spec.source}: trial {dict(params)}")


def arms(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """Every arm: one mapping of compare key -> value per combination of their choices ([{}] without compare)."""
    choices = [spec.space[key].choices for key in spec.compare]
    return [dict(zip(spec.compare, combo, strict=True)) for combo in itertools.product(*choices)]


def arm_label(values: Mapping[str, Any]) -> str:
    """`optimizer.name=lamb` (several keys joined by commas)."""
    return ",".join(f"{k}={_yaml_scalar(v)}" for k, v in values.items())


def arm_of(spec: ExperimentSpec, params: Mapping[str, Any]) -> str | None:
    """The arm a configuration belongs to, e.g. `optimizer.name=lamb`; None when the spec compares nothing."""
    if not spec.compare:
        return None
    missing = [k for k in spec.compare if k not in params]
    if missing:
        raise SearchSpaceError(missing[0], "a compare key has no value in the trial's parameters")
    return arm_label({k: params[k] for k in spec.compare})


def _yaml_scalar(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def params_key(params: Mapping[str, Any]) -> str:
    """A short stable key of a configuration (its checkpoint directory under Hyperband)."""
    import hashlib
    import json

    return hashlib.sha1(json.dumps(dict(params), sort_keys=True, default=str).encode()).hexdigest()[:16]


def stored_form(spec: ExperimentSpec, run_dir: str | Path) -> dict[str, Any]:
    """What the experiments table keeps of an experiment: the self-contained spec and its run directory."""
    return {"experiment": spec.self_contained(), "run_dir": str(run_dir)}


def spec_from_stored(record) -> ExperimentSpec:
    """The spec of a stored experiment record (see `stored_form`)."""
    return experiment_from_dict(record.spec["experiment"], f"experiment {record.name} (stored)", check_arms=False)
