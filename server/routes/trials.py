from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query

from hpo.trials import TrialState
from server.deps import ExperimentRefDep, StorageDep
from server.errors import ERROR_RESPONSES
from server.schemas import ARM_PATTERN, MAX_INT, MAX_PAGE, CurvePublic, Page, TrialPublic

router = APIRouter(prefix="/experiments/{name}/trials", tags=["trials"], responses=ERROR_RESPONSES)

TrialNumber = Annotated[int, Path(ge=0, le=MAX_INT, description="The trial's number within the experiment.")]


@router.get("", response_model=Page[TrialPublic])
def list_trials(
    record: ExperimentRefDep,
    storage: StorageDep,
    state: Annotated[list[TrialState] | None, Query(description="Only trials in these states.")] = None,
    arm: Annotated[str | None, Query(pattern=ARM_PATTERN, description="Only this arm's trials.")] = None,
    order_by: Annotated[Literal["number", "objective"], Query(description="objective: best first.")] = "number",
    offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
):
    """The experiment's trials, filtered by state and arm, in number order or best objective first."""
    states = list(state) if state else None
    total = storage.count_trials(record.id, state=states, arm=arm)
    trials = storage.list_trials(record.id, state=states, arm=arm, offset=offset, limit=limit, order_by=order_by)
    items = [TrialPublic.from_record(t) for t in trials]
    return Page[TrialPublic](items=items, total=total, offset=offset, limit=limit)


@router.get("/{number}", response_model=TrialPublic)
def get_trial(record: ExperimentRefDep, storage: StorageDep, number: TrialNumber):
    """One trial: parameters, GPUs, host and worker, state and reason, and its result once finished."""
    return TrialPublic.from_record(storage.get_trial_by_number(record.id, number))


@router.get("/{number}/metrics", response_model=CurvePublic)
def get_trial_metrics(record: ExperimentRefDep, storage: StorageDep, number: TrialNumber):
    """The trial's learning curve: per step, samples seen, elapsed time, loss, accuracy and every other value."""
    trial = storage.get_trial_by_number(record.id, number)
    return CurvePublic.from_records(record.name, number, storage.get_metrics(trial.id))
