from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from hpo.errors import ControllerBusyError
from hpo.export.production import arm_labels
from hpo.storage import Storage
from hpo.storage.base import ExperimentRecord, ExperimentStatus, TrialRecord
from server.deps import ExperimentDep, SpecsDep, StorageDep, TokenDep
from server.errors import ERROR_RESPONSES, TOKEN_RESPONSES
from server.schemas import (
    MAX_INT,
    MAX_PAGE,
    BestTrialPublic,
    DeletedPublic,
    ErrorPublic,
    ExperimentPublic,
    ExperimentSummaryPublic,
    NniWebUiPublic,
    Page,
    StopPublic,
    VerdictPublic,
)
from server.status import experiment_status
from server.storage import SpecCache, lasting

router = APIRouter(prefix="/experiments", tags=["experiments"], responses=ERROR_RESPONSES)


@router.get("", response_model=Page[ExperimentSummaryPublic])
def list_experiments(
    storage: StorageDep,
    offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
):
    """Every experiment, oldest first, one page of them."""
    records = storage.list_experiments()
    page = records[offset : offset + limit]
    items = [ExperimentSummaryPublic.from_record(r, experiment_status(r)) for r in page]
    return Page[ExperimentSummaryPublic](items=items, total=len(records), offset=offset, limit=limit)


@router.get("/{name}", response_model=ExperimentPublic)
def get_experiment(record: ExperimentDep, storage: StorageDep, specs: SpecsDep):
    """Status (live, interrupted, finished, ...), trial counts per state, arms, and the best trials so far; arms
    in the order the experiment file declares them."""
    from hpo.experiment.arms import in_arm_order  # the trainer config models: built on first use, not at start-up

    spec = specs.spec(record)
    counts = storage.count_trials_by_state(record.id)
    best = storage.best_trial(record.id)
    best_per_arm = in_arm_order(spec, storage.best_per_arm(record.id))
    summary = ExperimentSummaryPublic.from_record(record, experiment_status(record))
    return ExperimentPublic(
        **summary.model_dump(),
        stop_requested=record.stop_requested,
        controller_host=record.controller_host,
        controller_pid=record.controller_pid,
        heartbeat_at=record.heartbeat_at,
        controller_note=record.controller_note,
        trials={state.value: n for state, n in counts.items()},
        arms=arm_labels(spec),
        best=best_public(record, best, specs) if best else None,
        best_per_arm={arm: best_public(record, t, specs) for arm, t in best_per_arm.items()},
        verdict=experiment_verdict(record, storage, specs, counts),
        nni_webui=[NniWebUiPublic(**link) for link in record.nni_webui],
    )


@router.post(
    "/{name}/stop",
    response_model=StopPublic,
    dependencies=[TokenDep],
    responses={
        **TOKEN_RESPONSES,
        409: {
            "model": ErrorPublic,
            "description": "The experiment has ended, or its controller is not running "
            "(`interrupted`): no one would see the request; or its controller still runs on the server's machine "
            "though its heartbeat is old (stopped with `kill -STOP`, or unable to write): the message names its "
            "host and pid and what to do.",
        },  # fmt: skip
    },
)
def stop_experiment(record: ExperimentDep, storage: StorageDep):
    """Ask the experiment's controller to stop: running trials are ended, the experiment becomes `stopped`."""
    record = settled(storage, record)  # a controller that still runs here, its heartbeat old: a 409 that says so
    status = experiment_status(record)
    if status == "interrupted":  # a request no controller reads, which `hpo resume` would clear
        raise HTTPException(409, f"experiment {record.name} is interrupted: its controller is not running, so there "
                                 f"is nothing to stop (`hpo resume {record.name}` continues it)")  # fmt: skip
    if record.status is not ExperimentStatus.RUNNING:
        raise HTTPException(409, f"experiment {record.name} is {status}: there is nothing to stop")
    storage.request_stop(record.id)
    detail = f"stop requested; the controller of {record.name} ends its trials within seconds"
    return StopPublic(experiment=record.name, stop_requested=True, detail=detail)


@router.delete(
    "/{name}",
    response_model=DeletedPublic,
    dependencies=[TokenDep],
    responses={
        **TOKEN_RESPONSES,
        409: {
            "model": ErrorPublic,
            "description": "A live controller drives the experiment (its heartbeat is fresh, or its process still "
            "runs on the server's machine whatever its heartbeat): the message names its host and pid and what to do.",
        },
    },
)
def delete_experiment(record: ExperimentDep, storage: StorageDep, specs: SpecsDep):
    """Remove the experiment with its trials and their learning curves, in one transaction, as `hpo delete` does;
    refused (409) while its controller heartbeats, or while it still runs on the server's machine though its heartbeat
    is old (stopped, or unable to write: `hpo delete` refuses it too). Its run directory stays. Every route answers
    404 for it at once."""
    from hpo.engine.liveness import controller_identity, stale_after_s

    record = settled(storage, record)
    try:
        removed = storage.purge_experiment(record.id, *controller_identity(), stale_after_s())
    except ControllerBusyError as exc:
        raise HTTPException(409, str(exc)) from exc
    specs.forget_experiment(record)
    trials, values = removed if removed is not None else (None, None)  # None: a retry found the removal done
    counted = "" if trials is None else f": {trials:,} trials, {values:,} metric values"
    return DeletedPublic(experiment=record.name, trials=trials, metric_values=values,
                         run_dir=record.spec.get("run_dir"),
                         detail=f"deleted experiment {record.name!r}{counted}; its run directory stays")  # fmt: skip


def settled(storage: Storage, record: ExperimentRecord) -> ExperimentRecord:
    """The record once a controller killed on this machine a moment ago has let its claim lapse; a 409 where its
    controller still runs on this machine (the server's) though its heartbeat is old, as `hpo delete` and `hpo
    resume` refuse it (hpo.engine.settle)."""
    from hpo.engine.settle import settle_controller

    try:
        return settle_controller(storage, record, quiet=True)
    except ControllerBusyError as exc:
        raise HTTPException(409, str(exc)) from exc


def experiment_verdict(
    record: ExperimentRecord, storage: Storage, specs: SpecCache, counts: dict
) -> VerdictPublic | None:
    """The verdict of a compare experiment as `hpo run` prints it (hpo.evidence.verdict over the stored evidence:
    the confirmation runs and a few aggregates, however many tuning trials there are); None without compare arms.
    Kept while no controller drives the experiment and its trial counts stay the same (once it has a trial)."""
    spec = specs.spec(record)
    if not spec.compare:
        return None
    key = None
    if record.status is not ExperimentStatus.RUNNING and lasting(record):
        key = (record.id, record.status, tuple(sorted((state.value, n) for state, n in counts.items())))
        known = specs.known_verdict(key)
        if known is not None:
            return known
    # the trainer config models and scipy: loaded on first use, not at start-up
    from hpo.evidence.confirmations import batch_verdict_lines, round_line, shown_batch_verdicts, stored_evidence

    evidence = stored_evidence(storage, record.id)
    verdict = evidence.verdict(spec)
    at_batches = shown_batch_verdicts(spec, evidence)  # a batch-size study's verdict at each batch size
    batch_lines = batch_verdict_lines(spec, at_batches)
    rounds = round_line(spec, evidence.confirmations, evidence.best)
    public = VerdictPublic.from_verdict(verdict, spec.budget.confirm_seeds, spec.budget.confirmation_plan(), rounds,
                                        at_batches, batch_lines)  # fmt: skip
    if key is not None:
        specs.remember_verdict(key, public)
    return public


def best_public(record: ExperimentRecord, trial: TrialRecord, specs: SpecCache) -> BestTrialPublic:
    """The best trial with its production config (cached: a finished trial never changes)."""
    return BestTrialPublic.from_record(record, trial, specs.config(record, trial))
