from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response

from hpo.export.production import (
    CONFIG_PATH_PATTERN,
    FORMATS,
    MEDIA_TYPES,
    Format,
    batch_sizes_done,
    check_arm,
    export_arm,
    render,
)
from hpo.storage.base import ExperimentRecord, Storage
from server.deps import ExperimentRefDep, SpecsDep, StorageDep
from server.errors import ERROR_RESPONSES
from server.routes.best import Arm, BatchSize, no_best_message

router = APIRouter(tags=["export"], responses=ERROR_RESPONSES)

# YAML and JSON bodies are a mapping (the config; provenance + config); the torchrun body is a shell line.
_CONTENT = {MEDIA_TYPES[fmt]: {"schema": {"type": "string" if fmt == "torchrun" else "object"}} for fmt in FORMATS}


@router.get(
    "/experiments/{name}/export",
    response_class=Response,
    responses={200: {"description": "The exported config or command.", "content": _CONTENT}},
)
def export_best_config(
    record: ExperimentRefDep,
    storage: StorageDep,
    specs: SpecsDep,
    format: Annotated[Format, Query(description="yaml (a runnable trainer config), json, or torchrun.")] = "yaml",
    arm: Arm = None,
    global_batch_size: BatchSize = None,
    nodes: Annotated[int, Query(ge=1, le=4096, description="Nodes of the production run.")] = 1,
    gpus_per_node: Annotated[int, Query(ge=1, le=64, description="GPUs (ranks) per node.")] = 1,
    config_path: Annotated[
        str,
        Query(
            min_length=1,
            max_length=1024,
            pattern=CONFIG_PATH_PATTERN,
            description="Config file the torchrun command names; no control or line-break characters.",
        ),
    ] = "best.yaml",  # fmt: skip
):
    """The best config as a complete trainer config (YAML or JSON) or as the torchrun command that runs it: in an
    experiment that compares arms, without `arm`, the best trial of the verdict's winner when it names one (with
    `global_batch_size`, of the verdict's winner at that size: a batch-size study's verdict there). A config from
    an experiment where no trial reached the target says so (and an X-HPO-Warning header for each warning)."""
    spec = specs.spec(record)
    check_arm(spec, arm)
    arm_of, chosen = export_arm(spec, arm, global_batch_size, lambda batch: _winner(storage, record, spec, batch),
                                lambda: _best_batch(storage, record))  # fmt: skip
    trial = storage.best_trial(record.id, arm=arm_of, global_batch_size=global_batch_size)
    if trial is None:
        raise HTTPException(404, _no_trial_message(storage, record, arm, global_batch_size))
    exported = render(
        record, trial, format, nodes=nodes, gpus_per_node=gpus_per_node, config_path=config_path, spec=spec,
        chosen=chosen,
    )  # fmt: skip
    response = Response(exported.text, media_type=exported.media_type)
    for warning in exported.warnings:  # each its own header line, as HTTP allows for a repeated field
        response.headers.append("X-HPO-Warning", warning)
    return response


def _winner(storage: Storage, record: ExperimentRecord, spec, global_batch_size: int | None) -> str | None:
    """The verdict's winner, from the stored evidence (a few aggregates and the confirmation runs): the experiment's,
    or at a global batch size the winner of the verdict that compared runs there (`stored_winner_at`)."""
    from hpo.evidence.confirmations import stored_winner_at  # scipy: loaded on first use, not at start-up

    return stored_winner_at(storage, record.id, spec, global_batch_size)


def _best_batch(storage: Storage, record: ExperimentRecord) -> int | None:
    """The global batch size of the best trial of any arm (where a batch-size study's export is, without one asked)."""
    best = storage.best_trial(record.id)
    return best.global_batch_size if best is not None else None


def _no_trial_message(storage: Storage, record: ExperimentRecord, arm: str | None, global_batch_size: int | None
                      ) -> str:  # fmt: skip
    """Why there is nothing to export; at a batch size where the experiment has none, the sizes it has (as `hpo export
    --batch-size` says them)."""
    done = batch_sizes_done(storage, record.id, arm) if global_batch_size else []
    sizes = [size for size in done if size != global_batch_size]
    if not sizes:
        return no_best_message(record.name, arm, global_batch_size)
    of_arm = f" of arm {arm}" if arm else ""
    other = " (or another of those)" if len(sizes) > 1 else ""
    return (f"experiment {record.name} has no completed trial{of_arm} with global batch size {global_batch_size} to "
            f"export; its completed trials{of_arm} have global batch size {', '.join(map(str, sizes))}: ask "
            f"global_batch_size={sizes[0]}{other}")  # fmt: skip
