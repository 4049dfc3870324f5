"""The rungs of the `asha` tuner: its options (`tuner.options`, typed in `AshaOptions`) resolved against the
experiment's trainer config into budgets, so the experiment checks and the study loop agree on them.

    tuner:
      name: asha
      options: {eta: 3, min_samples: 1365, max_samples: 12288, sampler: model}

Rungs are max_samples x eta^-k for k = K..0 (K: the most divisions by eta that stay at or above min_samples),
each rounded down to a multiple of `eval.every_samples` (a rung's result is its last evaluation, so a rung
between two evaluations would only cost samples) and at least one evaluation; the top rung is max_samples.
Defaults: eta = budget.eta, min_samples = budget.min_budget x the full budget (at least one evaluation),
max_samples = budget.max_budget x the full budget (budget.max_samples of the trainer config).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from hpo.errors import ExperimentFileError
from hpo.experiment.schema import _Section
from trainer.config import closest_name


class AshaOptions(_Section):
    """`tuner.options` of the asha tuner (unknown options and booleans for numbers refused, as in every section)."""

    eta: int | None = Field(None, ge=2, description="Promote the best 1/eta of a rung (default budget.eta).")
    min_samples: int | None = Field(None, ge=1, description="The lowest rung, in training samples (default "
                                    "budget.min_budget x budget.max_samples, at least one evaluation).")  # fmt: skip
    max_samples: int | None = Field(None, ge=1, description="The top rung, in training samples (default "
                                    "budget.max_budget x budget.max_samples).")  # fmt: skip
    sampler: Literal["model", "random"] = Field("model", description="New configurations from SMAC3's "
                                                "random forest on a well-filled high rung, or at random.")  # fmt: skip
    min_points_in_model: int | None = Field(None, ge=1, description="Results a rung needs before the model is "
                                            "fitted on it (default: dimensions + 1, as BOHB).")  # fmt: skip
    random_fraction: float = Field(1 / 3, ge=0, le=1, description="Share of new configurations drawn at random "
                                   "once the model is used (BOHB's 1/3).")  # fmt: skip


@dataclass(frozen=True)
class AshaPlan:
    options: AshaOptions
    eta: int
    samples: tuple[int, ...]  # the rungs in samples, increasing
    full_samples: int  # budget.max_samples of the trainer config

    @property
    def budgets(self) -> tuple[float, ...]:
        """The rungs as fractions of the full budget (a trial's `budget`)."""
        return tuple(s / self.full_samples for s in self.samples)


def rung_samples(max_samples: int, min_samples: int, eta: int, every_samples: int) -> list[int]:
    """The rungs in samples (see the module's docstring)."""
    if not 0 < min_samples <= max_samples:
        raise ValueError(f"min_samples must be in (0, max_samples = {max_samples}], got {min_samples}")
    if eta < 2:
        raise ValueError(f"eta must be at least 2, got {eta}")
    divisions = math.floor(math.log(max_samples / min_samples, eta) + 1e-9)
    rungs = {max_samples}
    for k in range(1, divisions + 1):
        rungs.add(max(every_samples, int(max_samples / eta**k) // every_samples * every_samples))
    return sorted(r for r in rungs if r <= max_samples)


def asha_plan(spec: Any, full_samples: int, every_samples: int, source: str = "") -> AshaPlan:
    """The asha tuner's rungs for this experiment; ExperimentFileError naming the option when they cannot be
    built (the lowest rung before the first evaluation, min above max, max above the full budget)."""
    where = source or spec.source
    try:
        options = AshaOptions.model_validate(dict(spec.tuner.options))
    except ValidationError as e:
        error = e.errors()[0]
        field = ".".join(str(p) for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            close = closest_name(field, AshaOptions.model_fields)
            hint = f"; did you mean {close}?" if close else ""
            message = f"not an option of asha (it understands {', '.join(AshaOptions.model_fields)}{hint})"
        raise ExperimentFileError(f"{where}: tuner.options.{field}: {message}") from None
    budget = spec.budget
    eta = options.eta or budget.eta
    top = options.max_samples or round(budget.max_budget * full_samples)
    low = options.min_samples or max(round(budget.min_budget * full_samples), every_samples)
    if top > full_samples:
        raise ExperimentFileError(f"{where}: tuner.options.max_samples: {top} is beyond budget.max_samples "
                                  f"({full_samples}) of the trainer config")  # fmt: skip
    if low > top:
        raise ExperimentFileError(f"{where}: tuner.options.min_samples: {low} is above the top rung ({top})")
    if low < every_samples:
        raise ExperimentFileError(f"{where}: tuner.options.min_samples: the lowest rung ({low} samples) ends before "
                                  f"the first evaluation (eval.every_samples = {every_samples}); raise it")  # fmt: skip
    return AshaPlan(options, eta, tuple(rung_samples(top, low, eta, every_samples)), full_samples)
