"""What the API returns: `<Entity>Public` models, built from storage records by their `from_record`.

Floats that are NaN in the database (a diverged loss) are returned as null: JSON has no NaN.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from hpo.export.production import reached_target
from hpo.limits import MAX_COUNT
from hpo.storage.base import ExperimentRecord, MetricRecord, TrialRecord, curve_point
from hpo.trials import TrialState

if TYPE_CHECKING:
    from hpo.evidence.verdict import Verdict

# Path and query limits: ids and numbers are 32-bit integers in the database, names are slugs.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
ARM_PATTERN = r"^[^\x00-\x1f\x7f]{1,255}$"
MAX_INT = MAX_COUNT
MAX_PAGE = 1000
CURVE_METRICS = ("loss", "mlm_accuracy", "train_mlm_accuracy", "lr", "time_s", "sequences_per_s", "tokens_per_s")

Item = TypeVar("Item")


class ErrorPublic(BaseModel):
    detail: str = Field(description="What went wrong and what to do about it.")


class ParameterIssuePublic(BaseModel):
    """One invalid parameter, as FastAPI reports it."""

    loc: list[str | int] = Field(description='Where: e.g. ["query", "limit"].')
    msg: str
    type: str


class InvalidRequestPublic(BaseModel):
    """A 422: the parameters that failed validation, or (a request the data cannot serve: an unknown arm, a batch
    that does not split over the ranks) the reason as one message."""

    detail: str | list[ParameterIssuePublic]


class Page(BaseModel, Generic[Item]):
    items: list[Item]
    total: int = Field(description="How many items match, over all pages.")
    offset: int
    limit: int


class HealthPublic(BaseModel):
    status: str = Field(description="ok, or unavailable when the database cannot be reached.")
    database: str = Field(description="The database URL, password hidden.")
    detail: str | None = None


class ResultPublic(BaseModel):
    """How a finished trial ended."""

    objective: float | None = Field(description="The experiment's objective, penalty included.")
    samples_to_target: int | None
    time_to_target_s: float | None
    best_mlm_accuracy: float | None
    duration_s: float | None
    trainer_status: str | None = Field(description="The trainer's own end: reached_target, budget_exhausted, ...")

    @classmethod
    def from_record(cls, trial: TrialRecord) -> ResultPublic | None:
        if not trial.state.finished:
            return None
        return cls(
            objective=_finite(trial.objective),
            samples_to_target=trial.samples_to_target,
            time_to_target_s=_finite(trial.time_to_target_s),
            best_mlm_accuracy=_finite(trial.best_mlm_accuracy),
            duration_s=_finite(trial.duration_s),
            trainer_status=trial.metrics.get("status"),
        )


class TrialPublic(BaseModel):
    id: int
    number: int
    state: TrialState
    reason: str | None = Field(description="Why it failed, was re-queued, or stopped.")
    kind: str = Field(description="tuning, or confirmation (a re-run of a best config with another seed).")
    attempt: int = Field(description="How many times it was re-queued (a lost worker, a dead controller).")
    seed: int | None = Field(description="The training seed when it differs from the config's (confirmations).")
    arm: str | None
    params: dict[str, Any] = Field(description="The tuned parameters, by search-space name.")
    budget: float = Field(description="Fraction of the full training budget (multi-fidelity).")
    global_batch_size: int | None
    gpus: list[int] = Field(description="GPU ids it ran on (or is planned for); empty on CPU.")
    host: str | None
    worker: str | None = Field(description="The Dask worker that ran it, if any.")
    pid: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: ResultPublic | None = Field(description="Null while queued or running.")

    @classmethod
    def from_record(cls, trial: TrialRecord) -> TrialPublic:
        return cls(
            id=trial.id,
            number=trial.number,
            state=trial.state,
            reason=trial.reason,
            kind=trial.kind.value,
            attempt=trial.attempt,
            seed=trial.seed,
            arm=trial.arm,
            params=trial.params,
            budget=trial.budget,
            global_batch_size=trial.global_batch_size,
            gpus=list(trial.gpus),
            host=trial.host,
            worker=trial.worker,
            pid=trial.pid,
            created_at=trial.created_at,
            started_at=trial.started_at,
            finished_at=trial.finished_at,
            result=ResultPublic.from_record(trial),
        )


class TrialPage(BaseModel):
    """One page of an experiment's trials. Deep pages by key: pass the page's `next` as `after` for the next one."""

    items: list[TrialPublic]
    total: int | None = Field(
        description="How many trials match, over all pages; counted on pages asked without `after` (the first page "
        "of a cursor walk, offset pages) and null on pages asked with `after`, which would pay a count of the "
        "whole experiment on every page."
    )
    offset: int
    limit: int
    next: int | None = Field(
        description="The cursor of the next page in number order: pass it as `after` (it is the number of this "
        "page's last trial). Null on the last page (ask again with `after` = the last number seen for trials "
        "created since) and with order_by=objective (page that with offset)."
    )


class ImportedPublic(BaseModel):
    """Where an imported experiment's runs came from (`hpo import mlperf` / `hpo import rcp`); they ran elsewhere."""

    kind: str = Field(description="mlperf: MLPerf training result files; rcp: mlperf-logging's reference "
                      "convergence points (arms by batch size, one run per seed).")  # fmt: skip
    files: list[str] = Field(description="The files read.")
    runs: int = Field(description="Runs imported: one trial each (per configuration the first is its tuning trial, "
                      "the others its confirmation runs).")  # fmt: skip


STATUS_DOC = (
    "live, interrupted (its controller died), unresponsive (its controller still runs on the server's "
    "machine, its heartbeat old: stopped, or unable to write), finished, stopped or failed."
)


class ExperimentSummaryPublic(BaseModel):
    """One line of the experiment list."""

    id: int
    name: str
    status: str = Field(description=STATUS_DOC)
    stored_status: str = Field(description="The status as the controller last wrote it.")
    description: str
    objective: str = Field(description="The objective metric.")
    direction: str
    trials_budget: int
    created_at: datetime
    ended_at: datetime | None
    simulated: bool = Field(description="Whether its trials ran on a simulated cluster (runner: simulated: curves "
                            "read from a recorded table, simulated times), not real training.")  # fmt: skip
    imported: ImportedPublic | None = Field(None, description="Set when the experiment was imported (MLPerf "
                                            "results or RCPs: its trials are runs read from files, not run here); "
                                            "null for an experiment that ran here.")  # fmt: skip

    @classmethod
    def from_record(cls, record: ExperimentRecord, status: str) -> ExperimentSummaryPublic:
        spec = record.spec.get("experiment", {})
        return cls(
            id=record.id,
            name=record.name,
            status=status,
            stored_status=record.status.value,
            description=spec.get("description", ""),
            objective=spec.get("objective", {}).get("metric", ""),
            direction=record.direction.value,
            trials_budget=spec.get("budget", {}).get("trials", 0),
            created_at=record.created_at,
            ended_at=record.ended_at,
            simulated=is_simulated(record),
            imported=_imported(record.spec.get("imported")),
        )


def is_simulated(record: ExperimentRecord) -> bool:
    """Whether the experiment ran on the simulated runner (its stored runner: the file's, or `--runner`'s): its
    trials' numbers were read from a learning-curve table, nothing was trained."""
    runner = record.spec.get("experiment", {}).get("runner")
    return isinstance(runner, dict) and runner.get("name") == "simulated"


def _imported(value) -> ImportedPublic | None:
    """The stored `imported` entry (hpo.mlperf.IMPORTED_KEY) of an imported experiment; None for one that ran here."""
    if not isinstance(value, dict):
        return None
    return ImportedPublic(kind=str(value.get("kind", "")), files=[str(f) for f in value.get("files") or []],
                          runs=int(value.get("runs") or 0))  # fmt: skip


class BestTrialPublic(BaseModel):
    """A best trial and the complete trainer config it stands for (full budget, ready to export)."""

    experiment: str
    arm: str | None
    reached_target: bool = Field(description="False: no trial reached the target; this is the best miss.")
    simulated: bool = Field(description="True: the experiment ran on the simulated runner (runner: simulated), so "
                            "nothing was trained: the trial's numbers were read from a learning-curve table and the "
                            "config is untested until trained (the answer carries an X-HPO-Warning header, as the "
                            "export does).")  # fmt: skip
    trial: TrialPublic
    config: dict[str, Any] = Field(
        description="The complete trainer config at the full budget: the export endpoint's, less the log.mlperf file "
        "every export names."
    )

    @classmethod
    def from_record(cls, record: ExperimentRecord, trial: TrialRecord, config: dict[str, Any]) -> BestTrialPublic:
        return cls(
            experiment=record.name,
            arm=trial.arm,
            reached_target=reached_target(trial, config["eval"]["target_mlm_accuracy"]),
            simulated=is_simulated(record),
            trial=TrialPublic.from_record(trial),
            config=config,
        )


class ArmEvidencePublic(BaseModel):
    """One arm in the verdict: its best configuration's confirmation runs (re-runs with other training seeds)."""

    label: str
    runs: int = Field(description="Finished confirmation runs of the arm's best configuration.")
    reached_target: int = Field(description="How many of them reached the target.")
    hit_rate: float | None = Field(description="reached_target / runs; null without a run.")
    samples_to_target_mean: float | None = Field(
        description="Mean samples to target over the runs that reached it, interpolated between evaluations."
    )
    interval_95: list[float] | None = Field(
        description="[low, high]: the 95 % Student-t interval of that mean, its low end at least 0; null with fewer "
        "than 2 hits."
    )
    max_samples: int | None = Field(description="The runs' sample budget (what a miss used up).")
    summary: str = Field(description="The arm's line as `hpo run` prints it.")


class DifferencePublic(BaseModel):
    """One arm against another: the ratio of their geometric mean samples to target, as a difference."""

    arm: str
    against: str
    percent: float = Field(description="arm's samples to target relative to against's, in % (negative: fewer).")
    interval_percent: list[float] = Field(description="[low, high] of that difference at `confidence` (the test of "
                                          "a winner, corrected for pairs of arms and sequential looks).")  # fmt: skip
    samples: float = Field(description="The same difference in samples (against's geometric mean as the base).")
    interval_samples: list[float] = Field(description="[low, high] of the difference in samples.")
    confidence: float = Field(description="The interval's confidence level (0.95 with two arms and one look).")
    equivalence_interval_percent: list[float] = Field(
        description="[low, high] at 1 - 2 (1 - confidence): equivalent when it lies within ±margin (two one-sided "
        "tests)."
    )


class BatchVerdictPublic(BaseModel):
    """A batch-size study's verdict at one global batch size, between the optimizers that ran there."""

    outcome: Literal["winner", "equivalent", "not yet"] = Field(description="The verdict's answer there.")
    winner: str | None = Field(description="The winning optimizer there; null unless the outcome is winner.")
    line: str = Field(description="The one-line verdict there, with the difference, its interval and the margin.")
    runs_needed: int | None = Field(description="Not yet: about how many runs per arm would likely decide there.")
    differences: list[DifferencePublic] = Field(description="The leading optimizer against the others there.")
    shared: int = Field(description="Over how many batch sizes the error is shared (the batch sizes the study "
                        "declares: each verdict is tested at 1 / shared of the level; `differences` give the "
                        "confidence).")  # fmt: skip


class VerdictPublic(BaseModel):
    """Which compare arm reaches the target in fewer samples, whether the arms are equivalent, or not yet, as
    `hpo run` and the report say (hpo.evidence.verdict)."""

    outcome: Literal["winner", "equivalent", "not yet"] = Field(description="The verdict's answer.")
    winner: str | None = Field(description="The winning arm's label; null unless the outcome is winner.")
    line: str = Field(description="The one-line verdict, with the difference, its interval and the margin.")
    margin: float = Field(description="verdict.margin: equivalent means within ±margin (a fraction, 0.05 = 5 %).")
    confirm_seeds: int | Literal["auto"] = Field(
        description="budget.confirm_seeds: confirmation re-runs per arm's best configuration, or auto (rounds until "
        "the verdict decides)."
    )
    look: int = Field(description="The look (round of confirmations) the verdict is at.")
    looks: int = Field(description="Looks at most: 1 with a fixed confirm_seeds.")
    round: str = Field(description="Where the confirmation rounds stand, per arm.")
    runs_per_arm: dict[str, int] = Field(description="Finished confirmation runs per arm.")
    runs_needed: int | None = Field(description="Not yet: about how many runs per arm would likely decide at the "
                                    "observed spread and difference.")  # fmt: skip
    differences: list[DifferencePublic] = Field(description="The leading arm against every other (every pair when "
                                                "equivalent).")  # fmt: skip
    arms: list[ArmEvidencePublic]
    lines: list[str] = Field(description="The verdict as `hpo run` prints it, line by line.")
    at_batches: dict[int, BatchVerdictPublic] = Field(
        default_factory=dict,
        description="A batch-size study: the verdict at each global batch size where two or more optimizers ran "
        "(the study's question, which its confirmation rounds follow; this verdict compares arms across batch sizes "
        "too); empty for another experiment.",
    )

    @classmethod
    def from_verdict(cls, verdict: Verdict, confirm_seeds: int | str, plan: str, round_line: str,
                     at_batches: dict[int, Verdict] | None = None, batch_lines: list[str] | None = None
                     ) -> VerdictPublic:  # fmt: skip
        """`at_batches` and `batch_lines`: a batch-size study's verdict at each batch size and its lines
        (`hpo.evidence.confirmations.batch_verdict_lines`)."""
        from hpo.evidence.verdict import verdict_lines  # scipy: loaded on first use, not at start-up

        arms = [
            ArmEvidencePublic(
                label=arm.label,
                runs=arm.runs,
                reached_target=arm.hits,
                hit_rate=arm.hit_rate,
                samples_to_target_mean=arm.mean,
                interval_95=None if arm.low is None else [arm.low, arm.high],
                max_samples=arm.max_samples,
                summary=arm.describe(),
            )
            for arm in verdict.arms
        ]
        data = verdict.as_dict()
        batches = {
            batch: BatchVerdictPublic(
                outcome=v.outcome.value,
                winner=v.winner,
                line=v.line,
                runs_needed=v.runs_needed,
                differences=[c.as_dict() for c in v.comparisons],
                shared=v.shared,
            )  # fmt: skip
            for batch, v in (at_batches or {}).items()
        }
        return cls(**data, confirm_seeds=confirm_seeds, round=round_line, arms=arms,
                   lines=[*verdict_lines(verdict, plan), *(batch_lines or [])], at_batches=batches)  # fmt: skip


class NniWebUiPublic(BaseModel):
    """Where the NNI web UI of one NNI experiment of an `engine: nni` experiment was last served."""

    arm: str | None = Field(description="The compare arm that NNI experiment ran; null without compare arms.")
    nni_experiment: str = Field(description="NNI's experiment id (a resumed arm runs a new one: `-r1`, `-r2`).")
    url: str = Field(
        description="The web UI's address. It answers while the controller runs that NNI experiment, and after "
        "`hpo webui NAME` (on the controller's machine) reopens it, which may take another port and stores it here."
    )


class ExperimentPublic(ExperimentSummaryPublic):
    stop_requested: bool
    controller_host: str | None
    controller_pid: int | None
    heartbeat_at: datetime | None = Field(description="The controller's last heartbeat.")
    controller_note: str | None = Field(description="What the controller last said: progress, why trials wait.")
    trials: dict[str, int] = Field(description="Trial counts per state.")
    arms: list[str] = Field(
        description="The arms compared (equal trial budgets each), in the order the experiment "
        "file declares them, as every per-arm list here; empty without compare."
    )
    best: BestTrialPublic | None = Field(description="The best trial so far, over all arms.")
    best_per_arm: dict[str, BestTrialPublic] = Field(
        description="The best trial of every arm that has a completed trial, keyed by arm."
    )
    verdict: VerdictPublic | None = Field(description="The comparison of the arms; null without compare arms.")
    nni_webui: list[NniWebUiPublic] = Field(
        description="engine: nni only: the NNI web UI of each of its NNI experiments (one per arm, and one more "
        "per resume of an arm); empty for engine: local."
    )


class MetricPointPublic(BaseModel):
    """The values a trial reported at one step."""

    step: int
    samples: int | None = Field(description="Training samples seen.")
    time_s: float | None = Field(description="Elapsed training seconds (reported with evaluations).")
    loss: float | None
    mlm_accuracy: float | None = Field(description="Evaluation masked-LM accuracy.")
    values: dict[str, float | None] = Field(description="Every value reported at this step, by name.")


class CurvePublic(BaseModel):
    experiment: str
    trial: int
    points: list[MetricPointPublic]

    @classmethod
    def from_records(cls, experiment: str, trial: int, records: list[MetricRecord]) -> CurvePublic:
        by_step: dict[tuple[int, int], MetricPointPublic] = {}
        for record in records:
            key = curve_point(record)
            point = by_step.get(key)
            if point is None:
                point = by_step[key] = MetricPointPublic(
                    step=record.step, samples=record.samples, time_s=None, loss=None, mlm_accuracy=None, values={}
                )
            value = _finite(record.value)
            point.values[record.name] = value
            if record.name in ("time_s", "loss", "mlm_accuracy"):
                setattr(point, record.name, value)
        return cls(experiment=experiment, trial=trial, points=[by_step[key] for key in sorted(by_step)])


class BestAcrossPublic(BaseModel):
    """The best config for a global batch size and optimizer, over every experiment with that objective."""

    global_batch_size: int
    optimizer: str
    metric: str
    include_simulated: bool = Field(description="Whether simulated experiments (runner: simulated: nothing trained) "
                                    "were candidates; they are left out unless asked.")  # fmt: skip
    best: BestTrialPublic
    candidates: list[BestTrialPublic] = Field(description="The best of each experiment that has one, best first.")


class StopPublic(BaseModel):
    experiment: str
    stop_requested: bool
    detail: str


class DeletedPublic(BaseModel):
    experiment: str
    trials: int | None = Field(description="Trials removed with it (tuning trials and confirmation runs); null where "
                               "a retry of the request found the first try's removal done.")  # fmt: skip
    metric_values: int | None = Field(description="Values of their learning curves removed (null as trials).")
    run_dir: str | None = Field(description="Its run directory on the controller's machine, which stays (the trials' "
                                "logs and checkpoints): a new `hpo run` of its file there needs it gone.")  # fmt: skip
    detail: str


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None
