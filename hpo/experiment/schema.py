"""The schema of an experiment file: its sections and fields as typed, documented pydantic models."""

from __future__ import annotations

import copy
import math
import numbers
import re
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hpo.errors import ExperimentFileError
from hpo.limits import MAX_CONFIRM_SEEDS, MAX_PROCESSES, MAX_SLOTS, MAX_TRIALS
from search_spaces.errors import SearchSpaceError
from search_spaces.space import SearchSpace

MetricName = Literal["samples_to_target", "time_to_target_s", "best_mlm_accuracy", "final_mlm_accuracy"]
TunerName = Literal[
    "random",
    "grid",
    "smac_bo",
    "smac_hyperband",
    "asha",
    "nni_tpe",
    "nni_random",
    "nni_anneal",
    "nni_evolution",
    "nni_smac",
]
SEEDLESS_TUNERS = frozenset({"grid"})  # tuners that draw nothing (grid: the space's points in order): no seed to set
NATURAL_DIRECTION = {
    "samples_to_target": "minimize",
    "time_to_target_s": "minimize",
    "best_mlm_accuracy": "maximize",
    "final_mlm_accuracy": "maximize",
}
_SLUG = r"[a-z0-9][a-z0-9_-]{0,63}"  # the whole name (fullmatch: `$` would let a final newline by)
DEFAULT_MAX_CONFIRM_SEEDS = 12
MULTI_FIDELITY_TUNERS = ("smac_hyperband", "asha")  # the tuners that read budget.min_budget, max_budget and eta
ASHA_BUDGET_OPTIONS = {"eta": "eta", "min_samples": "min_budget", "max_samples": "max_budget"}  # option: budget it sets


MIN_MEMORY_LIMIT_MB = 1000  # less cannot start a trial: importing PyTorch reserves about 770 MB of address space


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf would be stored as null

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """A number field given true or false is refused (pydantic would read true as 1); whole numbers may be
        written 4, 4.0 or "4", as in the trainer config."""
        kind = number_kind(cls.model_fields[info.field_name].annotation) if info.field_name else None
        if kind is None:
            return value
        items = value if isinstance(value, list) and kind.startswith("a list") else [value]
        if any(isinstance(item, bool) for item in items):
            raise ValueError(f"expected {kind}, got {value!r}".replace("True", "true").replace("False", "false"))
        return value


def number_kind(annotation: Any) -> str | None:
    """`a whole number`, `a number`, `a whole number or auto`, `a list of whole numbers`, ... for a field that takes
    numbers and no booleans; None for any other field."""
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    members = [m for m in members or (annotation,) if m is not type(None)]
    words = [w for m in members if typing.get_origin(m) is Literal for w in typing.get_args(m)]
    lists = [typing.get_args(m)[0] for m in members if typing.get_origin(m) is list]
    if bool in members:
        return None
    if int in members or float in members:
        kind = "a whole number" if float not in members else "a number"
    elif lists and lists[0] in (int, float):
        kind = "a list of whole numbers" if lists[0] is int else "a list of numbers"
    else:
        return None
    return " or ".join([kind, *map(str, words)])


def whole_number(value: Any) -> int | None:
    """`value` as a whole number where it is one (4, 4.0, "4", NumPy's integers; not true or false), else None."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


class Objective(_Section):
    metric: MetricName = Field("samples_to_target", description="What a trial is scored by.")
    direction: Literal["minimize", "maximize"] | None = Field(None, description="Default: the metric's natural one.")
    penalty_factor: float = Field(2.0, gt=1.0, description="Misses score penalty_factor x cap x (1 + gap).")


class Tuner(_Section):
    name: TunerName = Field("smac_bo", description="Controller: SMAC3 BO/Hyperband, ASHA, random, or an NNI tuner.")
    seed: int = Field(0, description="Seed of the tuner (and of random search): 0 to 2**32 - 1, "
                      "as SMAC3 and NumPy take it; grid, which draws nothing, takes none.")  # fmt: skip
    options: dict[str, Any] = Field(default_factory=dict, description="Passed to the tuner as is.")


class Budget(_Section):
    trials: int = Field(ge=1, le=MAX_TRIALS, description="Trials in total (over all arms).")
    max_parallel: int = Field(1, ge=1, le=MAX_SLOTS, description="Trials running at the same time at most.")
    trial_timeout_s: float | None = Field(None, gt=0, description="Kill a trial after this many seconds.")
    min_budget: float = Field(1 / 9, gt=0, le=1, description="Hyperband: smallest fraction of budget.max_samples.")
    max_budget: float = Field(1.0, gt=0, le=1, description="Hyperband: largest fraction of budget.max_samples.")
    eta: int = Field(3, ge=2, description="Hyperband: successive-halving ratio.")
    confirm_seeds: int | Literal["auto"] = Field(0, description="Re-run each arm's best config with this many more "
                                                 "seeds (the verdict's evidence), or auto: in rounds until the verdict "
                                                 "decides or max_confirm_seeds is reached.")  # fmt: skip
    max_confirm_seeds: int | None = Field(
        None, ge=2, le=MAX_CONFIRM_SEEDS,
        description="confirm_seeds: auto only: the most confirmation runs per arm "
        f"(default {DEFAULT_MAX_CONFIRM_SEEDS}).",
    )  # fmt: skip

    @field_validator("confirm_seeds", mode="before")
    @classmethod
    def _confirm_seeds(cls, value: Any) -> Any:
        if value == "auto":
            return value
        seeds = whole_number(value)
        if seeds is None or not 0 <= seeds <= MAX_CONFIRM_SEEDS:
            shown = str(value).lower() if isinstance(value, bool) else repr(value)
            raise ValueError(f"expected a whole number of seeds (0 to {MAX_CONFIRM_SEEDS:,}) or auto, got {shown}")
        return seeds

    @model_validator(mode="after")
    def _cap_only_with_auto(self) -> Budget:
        if self.max_confirm_seeds is not None and self.confirm_seeds != "auto":
            raise ValueError("max_confirm_seeds caps confirm_seeds: auto; with a fixed confirm_seeds it would be "
                             "ignored: remove it, or set confirm_seeds: auto")  # fmt: skip
        return self

    @property
    def sequential(self) -> bool:
        return self.confirm_seeds == "auto"

    @property
    def confirmation_rounds(self) -> tuple[int, ...]:
        """Confirmation runs per arm after each round, cumulative: one round of confirm_seeds when fixed; with auto,
        rounds of max(3, cap / 4) runs up to the cap (12: 3, 6, 9, 12), the verdict asked after each."""
        if not self.sequential:
            return (self.confirm_seeds,) if self.confirm_seeds else ()
        cap = self.max_confirm_seeds or DEFAULT_MAX_CONFIRM_SEEDS
        size = max(3, math.ceil(cap / 4))
        return tuple(min(k, cap) for k in range(size, cap + size, size) if k - size < cap)

    @property
    def most_confirm_seeds(self) -> int:
        """Confirmation runs per arm at most."""
        rounds = self.confirmation_rounds
        return rounds[-1] if rounds else 0

    def confirmation_plan(self) -> str:
        """`2 seeds` or `auto: rounds of 3 up to 12 seeds, until the verdict decides`."""
        if not self.sequential:
            return f"{self.confirm_seeds} seed(s)"
        rounds = self.confirmation_rounds
        return f"auto: rounds of {rounds[0]} up to {rounds[-1]} seeds, until the verdict decides"


class VerdictSettings(_Section):
    margin: float = Field(0.05, gt=0, lt=1, description="Arms whose samples to target differ by less than this "
                          "fraction are equivalent (0.05: within ±5 %), when the evidence shows it.")  # fmt: skip


class DatabaseSettings(_Section):
    outage_s: float = Field(600.0, ge=0, allow_inf_nan=False, description="How long the controller and the trials "
                            "wait for a database that is away (server down or restarting, file locked), retrying, "
                            "before the experiment stops as on SIGTERM (`hpo resume` continues it); "
                            "HPO_DATABASE_OUTAGE_S overrides it.")  # fmt: skip


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
    gpus_per_trial: int = Field(1, ge=1, le=MAX_PROCESSES, description="GPUs per trial, one rank (process) each.")
    trials_per_gpu: int = Field(1, ge=1, le=MAX_PROCESSES, description="Small trials sharing one GPU (gpus_per_trial "
                                "must be 1).")  # fmt: skip
    cpu_slots: int = Field(1, ge=1, le=MAX_PROCESSES, description="Trials side by side when no GPU is used.")
    cpu_ranks_per_trial: int = Field(1, ge=1, le=MAX_PROCESSES, description="gloo ranks (processes) of one trial on "
                                     "CPU.")  # fmt: skip
    memory_limit_mb: int | None = Field(
        None, ge=MIN_MEMORY_LIMIT_MB, description="Address-space limit of each trial process (CPU); importing PyTorch "
        "alone takes about 0.75 GB.")  # fmt: skip
    machines: list[Machine] = Field(default_factory=list, description="engine: nni only: run the trials on these "
                                    "machines (NNI's remote training service) instead of this one.")  # fmt: skip

    @field_validator("gpus_per_trial", "trials_per_gpu")
    @classmethod
    def _gpus_used(cls, value: int, info: ValidationInfo) -> int:
        """GPUs per trial, or trials per GPU, asked of an experiment without GPUs would be ignored without a word."""
        if value > 1 and info.data.get("gpus") == "none":
            how = "cpu_ranks_per_trial ranks each" if info.field_name == "gpus_per_trial" else "cpu_slots at a time"
            raise ValueError(f"{value}, but resources.gpus is none: the trials run on the CPU, {how}; remove "
                             f"{info.field_name} (or set resources.gpus to GPUs)")  # fmt: skip
        return value

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


# Samples per second of one GPU training BERT-large (MLPerf's phase-2 set-up, mixed precision), from public MLPerf
# Training BERT results: a DGX A100 (8 GPUs) reaches the target in about 18 minutes, a DGX H100 in about 5.5, over
# about 3 M samples. A conversion for simulated experiments, not a measurement of ours.
GPU_SAMPLES_PER_S = {"a100": 350.0, "h100": 1100.0}


class Handicap(_Section):
    """runner.simulation.handicaps.<optimizer>: its trials read `curves_of`'s curves, `delay_samples` later."""

    curves_of: str = Field(description="The optimizer in the table whose curves these trials read.")
    delay_samples: int = Field(0, ge=0, description="Samples the curves are delayed by (0: a true tie).")


class Simulation(_Section):
    """runner: simulated: trials read their learning curves from a recorded table instead of training."""

    table: str = Field(description="The learning-curve table: the name of one shipped with hpo (curves, large_batch, "
                       "seeds), or a JSON lines file (a relative path is read from the experiment file's "
                       "directory).")  # fmt: skip
    gpu: Literal["a100", "h100"] = Field("a100", description="The GPU whose throughput sets simulated durations.")
    samples_per_s: float | None = Field(None, gt=0, description="Samples per second of one GPU (default: the "
                                        "gpu's, from public MLPerf BERT-large figures).")  # fmt: skip
    sample_scale: float = Field(256.0, gt=0, description="BERT-large samples one table sample stands for (256: "
                                "the table's 12,288-sample budget is about MLPerf BERT's 3.1 M samples).")  # fmt: skip
    batch_sample_scale: dict[int, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="Per global batch size of the table, the samples one table sample stands "
        "for there, in place of sample_scale (`hpo plan` sets it where the table's runs have another length at each "
        "batch size and the file one budget, so that a full run lasts that budget at every batch size).")  # fmt: skip
    assume_no_effect: list[str] = Field([], description="Dotted trainer keys the table does not vary, tuned or "
                                        "compared all the same and taken as changing nothing: every value reads the "
                                        "same curves (`hpo plan` sets it when it plans a real file).")  # fmt: skip

    handicaps: dict[str, Handicap] = Field(default_factory=dict, description="Calibration benchmarks only: an "
                                           "optimizer whose trials read another optimizer's curves, delayed, so "
                                           "the true difference between the arms is known.")  # fmt: skip

    @property
    def gpu_samples_per_s(self) -> float:
        return self.samples_per_s or GPU_SAMPLES_PER_S[self.gpu]


class Runner(_Section):
    name: Literal["local", "dask", "simulated"] = Field(
        "local", description="local: slots on this machine; dask: a cluster; simulated: a simulated cluster of "
        "budget.max_parallel slots whose trials read a learning-curve table (runner.simulation).",
    )  # fmt: skip
    scheduler: str | None = Field(None, description="Dask scheduler address, e.g. tcp://host:8786 (dask only).")
    preload: bool = Field(
        True, description="Fork each single-process trial from a launcher that has already imported the trial side "
        "(the storage, SQLAlchemy; for trials on the CPU the trainer and torch too): about 0.2 s less CPU per trial, "
        "4 s on the CPU. false: every trial starts a new interpreter.",
    )  # fmt: skip
    simulation: Simulation | None = Field(None, description="runner: simulated only: the table and the duration "
                                          "model.")  # fmt: skip

    @field_validator("scheduler")
    @classmethod
    def _scheduler(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(tcp|tls|inproc|ucx)://[^\s]+", value):
            raise ValueError(f"expected an address such as tcp://host:8786, got {value!r}")
        return value


class ExperimentSpec(_Section):
    """A validated experiment file. Build it with `load_experiment` / `experiment_from_dict`."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True, allow_inf_nan=False)

    name: str = Field(description="Slug: lowercase letters, digits, '-' and '_'.")
    description: str = Field("", description="One line shown in listings.")
    base_config: str | dict[str, Any] = Field(description="Trainer YAML (relative to this file) or inline.")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Dotted trainer keys set on the base.")
    space: SearchSpace = Field(description="Parameters to tune (search_spaces.space syntax).")
    objective: Objective = Field(default_factory=Objective)
    compare: list[str] = Field(default_factory=list, description="Categorical keys whose values form arms.")
    tuner: Tuner = Field(default_factory=Tuner)
    budget: Budget
    verdict: VerdictSettings = Field(default_factory=VerdictSettings, description="How the arms are compared.")
    resources: Resources = Field(default_factory=Resources)
    engine: Literal["local", "nni"] = Field("local", description="local: our study loop; nni: an NNI experiment.")
    runner: Runner = Field(default_factory=Runner, description="Where the local engine runs trials.")
    database: DatabaseSettings = Field(default_factory=DatabaseSettings, description="Waiting out database outages.")
    allow_unequal_arms: str | None = Field(
        None, description="Why the compare arms may tune different hyperparameters (refused without a reason)."
    )

    _source: str = PrivateAttr("<dict>")
    _base: dict[str, Any] | None = PrivateAttr(None)

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        if not isinstance(value, str) or not re.fullmatch(_SLUG, value):
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

    def unread_fields(self) -> list[tuple[str, str]]:
        """(section, field) of the settings no part of this experiment reads, whatever their value: Hyperband's
        budgets under a tuner that trains every trial to the full budget, a budget an asha option sets in its place,
        the penalty of a miss under an accuracy metric (which scores the accuracy itself). A file that writes one is
        refused (`hpo.experiment.checks`)."""
        unread = []
        if self.tuner.name not in MULTI_FIDELITY_TUNERS:
            unread += [("budget", "min_budget"), ("budget", "max_budget"), ("budget", "eta")]
        elif self.tuner.name == "asha":
            options = self.tuner.options
            unread += [("budget", key) for option, key in ASHA_BUDGET_OPTIONS.items()
                       if options.get(option) is not None]  # fmt: skip
        if self.objective.metric.endswith("_accuracy"):
            unread.append(("objective", "penalty_factor"))
        return unread

    def self_contained(self) -> dict[str, Any]:
        """The spec as a plain mapping with the base config inline and overrides applied (for storage, and the
        copies `hpo plan` runs), without the settings it does not read (`unread_fields`), which a file may not
        write: its copy then reads back as a file would."""
        data = self.model_dump(mode="json")
        data.update(base_config=self.resolved_base(), overrides={})
        for section, field in self.unread_fields():
            data[section].pop(field, None)
        return data
