from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from hpo.export.production import SIMULATED, check_arm, other_batch_sizes
from hpo.storage.base import Direction, ExperimentRecord, Storage, TrialRecord
from hpo.trials import TrialKind, TrialState
from search_spaces.space import trainer_key
from server.caching import MISSING, NOT_MODIFIED, cached_json, etag_of
from server.deps import HotReadDep, SpecsDep, StorageDep
from server.errors import ERROR_RESPONSES
from server.routes.experiments import best_public
from server.schemas import ARM_PATTERN, MAX_INT, BestAcrossPublic, BestTrialPublic, is_simulated
from server.storage import SpecCache

router = APIRouter(tags=["best configs"], responses=ERROR_RESPONSES)

INCLUDE_SIMULATED_DOC = (
    "Rank simulated experiments too (runner: simulated: their numbers were read from a learning-curve table, nothing "
    "was trained); left out by default, so a recommendation is a trained configuration."
)

Arm = Annotated[str | None, Query(pattern=ARM_PATTERN, description="Only this arm, e.g. optimizer.name=lamb.")]
BatchSize = Annotated[int | None, Query(ge=1, le=MAX_INT, description="Only trials with this global batch size.")]
Metric = Literal["samples_to_target", "time_to_target_s", "best_mlm_accuracy", "final_mlm_accuracy"]
WARNING_HEADER = "X-HPO-Warning"  # as the export's: hpo.export.production.SIMULATED is ASCII for it


@router.get("/experiments/{name}/best", response_model=BestTrialPublic, responses=NOT_MODIFIED)
async def best_config(request: Request, hot: HotReadDep, arm: Arm = None, global_batch_size: BatchSize = None):
    """The best completed trial (optionally within one arm or global batch size) and its complete config. With
    an `ETag`: asked again with `If-None-Match`, an unchanged answer is a 304. A simulated experiment's (nothing was
    trained) says so: `simulated: true` and an X-HPO-Warning header, as its export."""
    record, version, storage, specs, answers = hot.record, hot.version, hot.storage, hot.specs, hot.answers
    check_arm(specs.spec(record), arm)
    # The hot path of the API, so it stays on the event loop: one primary-key read (the experiment's trials_version,
    # read by the dependency before the answer it guards), less than a round trip through the thread pool and the
    # GIL hand-offs it brings (BENCHMARKS.md, "REST API under load"). Only when a trial changed is the best trial
    # looked up again.
    key = ("best", record.id, arm, global_batch_size)
    kept = answers.get(key, version)
    if kept is MISSING:
        trial_id = storage.best_trial_id(record.id, arm=arm, global_batch_size=global_batch_size)
        body = None if trial_id is None else specs.known_best_json(record, trial_id)
        if trial_id is not None and body is None:  # a finished trial never changes: its response is built once
            body = await run_in_threadpool(lambda: specs.best_json(record, storage.get_trial(trial_id)))
        kept = answers.put(key, version, body and (body, etag_of(body)))
    if kept is None:  # at a batch size the experiment has no best at: the message names the sizes it has
        other = await run_in_threadpool(other_batch_sizes, storage, record, arm, global_batch_size, "to show",
                                        "ask global_batch_size=")  # fmt: skip
        raise HTTPException(404, other or await run_in_threadpool(no_best_message, storage, record, arm,
                                                                  global_batch_size))  # fmt: skip
    return warn_if_simulated(cached_json(request, *kept), record)


@router.get("/experiments/{name}/best/arms", response_model=dict[str, BestTrialPublic], responses=NOT_MODIFIED)
async def best_config_per_arm(request: Request, hot: HotReadDep):
    """The best trial of every arm that has a completed trial, keyed by arm, in the order the experiment file declares
    its arms (`{}` for an experiment without arms that has one); a 404 without a completed trial, as the best config.
    With an `ETag`, and for a simulated experiment an X-HPO-Warning header, as the best config."""
    record, version, storage, specs, answers = hot.record, hot.version, hot.storage, hot.specs, hot.answers
    key = ("best per arm", record.id)
    kept = answers.get(key, version)
    if kept is MISSING:

        def build() -> bytes | None:
            from hpo.experiment.arms import in_arm_order  # the trainer config models: on first use, not at start-up

            bests = in_arm_order(specs.spec(record), storage.best_per_arm(record.id))
            if not bests and storage.best_trial_id(record.id) is None:  # no completed trial: a 404, as /best's
                return None
            entries = [json.dumps(arm).encode() + b":" + specs.best_json(record, trial) for arm, trial in bests.items()]
            return b"{" + b",".join(entries) + b"}"

        body = await run_in_threadpool(build)
        kept = answers.put(key, version, body and (body, etag_of(body)))
    if kept is None:
        raise HTTPException(404, await run_in_threadpool(no_best_message, storage, record, None, None))
    return warn_if_simulated(cached_json(request, *kept), record)


def warn_if_simulated(response: Response, record: ExperimentRecord) -> Response:
    """`response` with the export's X-HPO-Warning where `record` ran on the simulated runner (nothing was trained)."""
    if is_simulated(record):
        response.headers.append(WARNING_HEADER, SIMULATED.format(experiment=record.name))
    return response


@router.get("/best", response_model=BestAcrossPublic)
def best_config_across_experiments(
    response: Response,
    storage: StorageDep,
    specs: SpecsDep,
    global_batch_size: Annotated[int, Query(ge=1, le=MAX_INT, description="The global batch size.")],
    optimizer: Annotated[Literal["adamw", "lamb"], Query(description="The optimizer.")],
    metric: Annotated[Metric, Query(description="Only experiments with this objective.")] = "samples_to_target",
    include_simulated: Annotated[bool, Query(description=INCLUDE_SIMULATED_DOC)] = False,
):
    """The best config for a global batch size and optimizer over every experiment whose objective is `metric`: each
    experiment's best is a candidate, one that reached the target ranking above every one that missed it, and of
    two misses the one that ended nearer its target first. Simulated experiments (nothing trained) are left out unless
    `include_simulated=true`; a simulated best then says so (`simulated: true`, an X-HPO-Warning header)."""
    candidates: list[tuple[ExperimentRecord, TrialRecord]] = []
    left_out: list[ExperimentRecord] = []  # simulated experiments, not asked for
    for record in storage.list_experiments():
        spec = specs.spec(record)
        if spec.objective.metric != metric:
            continue
        if is_simulated(record) and not include_simulated:
            left_out.append(record)
            continue
        trial = _best_with(storage, specs, record, global_batch_size, optimizer)
        if trial is not None:
            candidates.append((record, trial))
    if not candidates:
        found = (f"no experiment with objective {metric} has a completed {optimizer} trial at global batch size "
                 f"{global_batch_size}")  # fmt: skip
        simulated = [r.name for r in left_out if _best_with(storage, specs, r, global_batch_size, optimizer)]
        if simulated:
            found += (f", but the simulated {_names(simulated)}, left out (nothing was trained there): ask "
                      "include_simulated=true to rank simulated experiments too")  # fmt: skip
        raise HTTPException(404, found)
    direction = Direction.MAXIMIZE if metric.endswith("accuracy") else Direction.MINIMIZE
    sign = 1.0 if direction is Direction.MINIMIZE else -1.0
    # A miss of samples or time to target scores a penalty scaled by its own experiment's budget (hpo.objective):
    # below another experiment's hits where that budget is small, and below a nearer miss of a longer budget. Every
    # hit ranks above every miss, and misses rank by how far short of their target they ended.
    ranked = [(best_public(record, trial, specs), trial) for record, trial in candidates]
    ranked.sort(key=lambda pair: (direction is Direction.MINIMIZE and not pair[0].reached_target,
                                  _shortfall(pair[0], pair[1]) if direction is Direction.MINIMIZE else 0.0,
                                  sign * pair[1].objective, pair[1].finished_at))  # fmt: skip
    public = [best for best, _ in ranked]
    if public[0].simulated:
        response.headers.append(WARNING_HEADER, SIMULATED.format(experiment=public[0].experiment))
    return BestAcrossPublic(
        global_batch_size=global_batch_size, optimizer=optimizer, metric=metric, include_simulated=include_simulated,
        best=public[0], candidates=public,
    )  # fmt: skip


def _names(names: list[str]) -> str:
    return f"experiment {names[0]} has one" if len(names) == 1 else f"experiments {', '.join(names)} have one"


def _shortfall(best: BestTrialPublic, trial: TrialRecord) -> float:
    """How far short of its target a miss ended, as a share of the target (hpo.objective's gap); 0 for a hit."""
    if best.reached_target:
        return 0.0
    target = best.config["eval"]["target_mlm_accuracy"]
    return min(max((target - (trial.best_mlm_accuracy or 0.0)) / target, 0.0), 1.0) if target > 0 else 1.0


def _best_with(
    storage: Storage, specs: SpecCache, record: ExperimentRecord, global_batch_size: int, optimizer: str
) -> TrialRecord | None:
    """The experiment's best trial that trains with `optimizer` at `global_batch_size`, if any."""
    from hpo.experiment.arms import arm_label, arms  # builds the trainer config models: on first use, not at start-up

    spec = specs.spec(record)
    tuned = [name for name in spec.space if trainer_key(name) == "optimizer.name"]
    if not tuned:  # one optimizer for the whole experiment
        if spec.resolved_base().get("optimizer", {}).get("name", "lamb") != optimizer:
            return None
        return storage.best_trial(record.id, global_batch_size=global_batch_size)
    compared = [key for key in spec.compare if key in tuned]
    if compared:  # an arm per optimizer (possibly crossed with other compare keys): the best of its arms
        labels = [arm_label(values) for values in arms(spec) if values[compared[0]] == optimizer]
        found = [storage.best_trial(record.id, arm=label, global_batch_size=global_batch_size) for label in labels]
        return _best_of([t for t in found if t is not None], record.direction)
    # Tuned but not compared: read the completed tuning trials at this batch size and keep this optimizer's (a
    # confirmation run re-runs a best configuration with another seed: a lucky seed is not a better configuration,
    # as `best_trial` has it too).
    completed = storage.list_trials(record.id, state=TrialState.COMPLETED)
    mine = [
        t
        for t in completed
        if t.kind is TrialKind.TUNING and t.global_batch_size == global_batch_size and t.objective is not None
        and any(t.params.get(name) == optimizer for name in tuned)
    ]  # fmt: skip
    return _best_of(mine, record.direction)


def _best_of(trials: list[TrialRecord], direction: Direction) -> TrialRecord | None:
    sign = 1.0 if direction is Direction.MINIMIZE else -1.0
    return min(trials, key=lambda t: (sign * t.objective, t.number), default=None)


def no_best_message(storage: Storage, record: ExperimentRecord, arm: str | None, global_batch_size: int | None) -> str:
    """Why there is no best trial to show: no completed trial (its trial list says why), or no trial at all."""
    if not storage.tally_trials(record.id):  # its trial list is empty: it would say nothing
        return (f"experiment {record.name} has no trial yet, so no best one; its status "
                f"(/experiments/{record.name}) says where it stands")  # fmt: skip
    where = "".join(
        [f" in arm {arm}" if arm else "", f" at global batch size {global_batch_size}" if global_batch_size else ""]
    )
    return f"experiment {record.name} has no completed trial{where} yet; its trial list says why"
