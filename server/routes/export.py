from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response

from hpo.export.production import (
    CONFIG_PATH_PATTERN,
    FORMATS,
    MEDIA_TYPES,
    Format,
    check_arm,
    other_batch_sizes,
    render,
)
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
    an experiment where no trial reached the target, or whose trial ran only a short rung of a multi-fidelity tuner,
    says so (and an X-HPO-Warning header for each warning)."""
    from hpo.evidence.confirmations import chosen_trial  # scipy: loaded on first use, not at start-up

    spec = specs.spec(record)
    check_arm(spec, arm)
    trial, chosen, among = chosen_trial(storage, record, spec, arm, global_batch_size)
    if trial is None:
        raise HTTPException(404, other_batch_sizes(storage, record, arm, global_batch_size, "to export",
                                                   "ask global_batch_size=")
                            or no_best_message(storage, record, arm, global_batch_size))  # fmt: skip
    exported = render(
        record, trial, format, nodes=nodes, gpus_per_node=gpus_per_node, config_path=config_path, spec=spec,
        chosen=chosen, among=among,
    )  # fmt: skip
    response = Response(exported.text, media_type=exported.media_type)
    for warning in exported.warnings:  # each its own header line, as HTTP allows for a repeated field
        response.headers.append("X-HPO-Warning", warning)
    return response
