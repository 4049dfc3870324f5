from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request
from starlette.concurrency import run_in_threadpool

from hpo.errors import HpoError, NotFoundError
from hpo.export.production import check_arm
from hpo.storage.base import ExperimentRecord, Storage, TrialRecord
from hpo.trials import TrialState
from server.caching import MISSING, NOT_MODIFIED, cached_json
from server.deps import ExperimentRefDep, PageReadDep, StorageDep, gone_unless_read
from server.errors import ERROR_RESPONSES
from server.schemas import ARM_PATTERN, MAX_INT, MAX_PAGE, CurvePublic, TrialPage, TrialPublic
from server.storage import SpecCache

router = APIRouter(prefix="/experiments/{name}/trials", tags=["trials"], responses=ERROR_RESPONSES)

AFTER_DOC = (
    "Cursor: only trials numbered above this one, in number order (a previous page's `next`). A negative or "
    "non-integer value is a 422 naming `after`."
)
ARM_DOC = "Only this arm's trials; given once (a repeated arm is a 422 naming it: one request per arm)."
TrialNumber = Annotated[int, Path(ge=0, le=MAX_INT, description="The trial's number within the experiment.")]


@router.get("", response_model=TrialPage, responses=NOT_MODIFIED)
async def list_trials(
    request: Request,
    hot: PageReadDep,
    state: Annotated[list[TrialState] | None, Query(description="Only trials in these states.")] = None,
    arm: Annotated[str | None, Query(pattern=ARM_PATTERN, description=ARM_DOC)] = None,
    order_by: Annotated[Literal["number", "objective"], Query(description="objective: best first.")] = "number",
    offset: Annotated[int, Query(ge=0, le=MAX_INT, description="Skip this many trials (for small offsets).")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    after: Annotated[int | None, Query(ge=0, le=MAX_INT, description=AFTER_DOC)] = None,
):
    """The experiment's trials, filtered by state and arm, in number order or best objective first. Page deep
    experiments by key: `after` = the previous page's `next` (each page costs the same however deep it is and
    however few trials match the filters, and trials created meanwhile are neither skipped nor repeated); `total`
    is counted only on pages without `after`. With an `ETag`: asked again with `If-None-Match`, an unchanged page
    is a 304."""
    record, storage, specs, answers = hot.record, hot.storage, hot.specs, hot.answers
    if arm is not None:  # an arm it does not have would list nothing: a 422 naming its arms, as `hpo trials` has it
        check_listed_arm(record, specs, arm)
    if after is not None and (order_by != "number" or offset):
        raise HTTPException(
            422,
            f"after={after} cannot be combined with order_by=objective or an offset: after pages in number order "
            "from a trial number; page by objective with offset alone",
        )
    states = list(state) if state else None
    page = {"state": states, "arm": arm, "offset": offset, "limit": limit + 1, "order_by": order_by, "after": after}
    # A page without `after` shows `total`: the count is kept under the experiment's trials_version, read first.
    counted = ("count", record.id, tuple(sorted({s.value for s in states})) if states else None, arm)
    version = hot.version if after is None else None
    total = None if after is not None else answers.get(counted, version)
    # The page's ids, states and attempts first (one index range, one more row than the page: whether another page
    # follows), then only the trials whose list entry is not kept: a finished trial's is built once. A key page
    # stays on the event loop, as the best config does (BENCHMARKS.md, "REST API under load"); a deep offset or a
    # count of the whole experiment goes to the thread pool.
    if after is None and offset:
        versions = await run_in_threadpool(lambda: storage.list_trial_versions(record.id, **page))
    else:
        versions = storage.list_trial_versions(record.id, **page)
    if not versions and after is not None and hot.version is None:  # no trial after it: is the experiment there?
        gone_unless_read(hot)
    more, versions = len(versions) > limit, versions[:limit]
    bodies = {v.id: specs.known_trial_json(v) for v in versions}
    missing = [v.id for v in versions if bodies[v.id] is None]
    count_now = total is MISSING
    if missing or count_now:

        def read() -> tuple[int | None, list]:
            count = storage.count_trials(record.id, state=states, arm=arm) if count_now else None
            return count, storage.get_trials(missing)

        count, trials = await run_in_threadpool(read)
        if count_now:
            total = answers.put(counted, version, count)
        bodies.update((t.id, specs.trial_json(t)) for t in trials)
    after_last = versions[-1].number if more and order_by == "number" else None
    tail = {"total": total, "offset": offset, "limit": limit, "next": after_last}  # TrialPage's fields, in order
    body = (
        b'{"items":['
        + b",".join(bodies[v.id] for v in versions)
        + b"],"
        + json.dumps(tail, separators=(",", ":"))[1:].encode()
    )
    return cached_json(request, body)


@router.get("/{number}", response_model=TrialPublic)
def get_trial(record: ExperimentRefDep, storage: StorageDep, number: TrialNumber):
    """One trial: parameters, GPUs, host and worker, state and reason, and its result once finished."""
    return TrialPublic.from_record(trial_by_number(record, storage, number))


@router.get("/{number}/metrics", response_model=CurvePublic)
def get_trial_metrics(record: ExperimentRefDep, storage: StorageDep, number: TrialNumber):
    """The trial's learning curve: per step, samples seen, elapsed time, loss, accuracy and every other value."""
    trial = trial_by_number(record, storage, number)
    return CurvePublic.from_records(record.name, number, storage.get_metrics(trial.id))


def check_listed_arm(record: ExperimentRecord, specs: SpecCache, arm: str) -> None:
    """Refuse an arm the experiment does not have; one whose stored definition no longer validates is not checked
    (its trials are still listed)."""
    try:
        spec = specs.spec(record)
    except HpoError:
        return
    check_arm(spec, arm)


def trial_by_number(record: ExperimentRecord, storage: Storage, number: int) -> TrialRecord:
    """The trial, or a 404 that names the experiment as the client does (by name) and where its trials are."""
    try:
        return storage.get_trial_by_number(record.id, number)
    except NotFoundError:
        raise NotFoundError(
            f"experiment {record.name} has no trial number {number}: its trial list "
            f"(/experiments/{record.name}/trials) shows the numbers it has"
        ) from None
