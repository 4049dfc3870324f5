"""`hpo plan` over HTTP: the forecast of an experiment file (POST) or of a stored experiment (GET), run as the CLI
runs it, in a child process (`python -m hpo plan FILE --json`): the planner drives SMAC and the simulated
runner, which this server does not import (docs/architecture.md, the import direction), and a plan takes seconds
to minutes of CPU. Both are actions: they need the API token, as a stop does, because they spend the server's CPU."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import yaml
from fastapi import APIRouter, Body, HTTPException, Query, Request
from pydantic import BaseModel, Field

from hpo.interpreter import module_env
from hpo.limits import MAX_PROCESSES, MAX_SLOTS
from hpo.simulation.table import shipped_table
from server.deps import ExperimentDep, TokenDep
from server.errors import ERROR_RESPONSES, TOKEN_RESPONSES
from server.schemas import NAME_PATTERN, ErrorPublic, InvalidRequestPublic
from trainer.config import shipped_config

router = APIRouter(tags=["plan"], responses=ERROR_RESPONSES)
log = logging.getLogger("server")

MAX_REPETITIONS = 50
PLAN_TIMEOUT_S = 600.0  # a plan of 50 repetitions of a 200-trial SMAC preset takes minutes on 2 cores
STOP_GRACE_S = 30.0  # a plan stopped by SIGTERM ends its workers and deletes its temporary files within seconds
LISTEN_S = 0.5  # how often a running plan checks that its client is still there
ACTION = {
    **TOKEN_RESPONSES,
    422: {
        "model": InvalidRequestPublic,
        "description": "A query parameter is invalid (a list of them), or the experiment file is not valid or "
        "cannot be planned: `detail` is then the error `hpo plan` gives (the file, the field and what to do).",
    },  # fmt: skip
    504: {
        "model": ErrorPublic,
        "description": f"The plan took longer than {PLAN_TIMEOUT_S:.0f} s: ask for fewer "
        "repetitions, or run `hpo plan` on a machine of your own.",
    },  # fmt: skip
}
Repetitions = Annotated[int, Query(ge=1, le=MAX_REPETITIONS, description="Simulated runs of the experiment.")]
Slots = Annotated[int | None, Query(ge=1, le=MAX_SLOTS, description="Slots of the simulated cluster (default: the "
                                    "file's budget.max_parallel).")]  # fmt: skip
GpusPerSlot = Annotated[int | None, Query(ge=1, le=MAX_PROCESSES, description="GPUs per slot (default: the file's "
                                          "resources.gpus_per_trial).")]  # fmt: skip
Gpu = Annotated[Literal["a100", "h100"] | None, Query(description="The GPU whose samples/s set simulated durations.")]
Difference = Annotated[
    float | None,
    Query(
        ge=0,
        lt=1,
        allow_inf_nan=False,  # else nan is refused as "less than 1"
        description="A stated true difference (0.1: the first arm needs "
        "10 % fewer samples; 0: a tie) the repetitions run at and are judged "
        "against (`hpo plan --difference`); default: the table's own truth.",
    ),
]


class FigurePublic(BaseModel):
    median: float | None = Field(description="Over the repetitions; null: never (no repetition reached it).")
    low: float | None = Field(description="2.5th percentile of the repetitions.")
    high: float | None = Field(description="97.5th percentile of the repetitions.")


class CostPublic(BaseModel):
    gpu_hours: FigurePublic
    wall_hours: FigurePublic


class OutcomeSharePublic(BaseModel):
    count: int
    share: float
    low: float = Field(description="95 % Wilson interval of the share.")
    high: float


class BatchOutcomesPublic(BaseModel):
    outcomes: dict[str, OutcomeSharePublic] = Field(description="`winner OPTIMIZER`, `equivalent`, `not yet`.")
    judged: dict[str, OutcomeSharePublic] = Field(description="`right`, `wrong`, `equivalent`, `not yet`.")
    truth: dict[str, Any] = Field(description="The truth at this batch size, as `truth`.")


class PlanPublic(BaseModel):
    """What `hpo plan FILE --json` prints: every figure simulated (no training happens)."""

    simulated: bool = Field(description="Always true: the figures come from the simulated runner.")
    experiment: str
    source: str = Field(description="What was planned: `the posted experiment file`, or `the stored experiment NAME`.")
    moved: str | None = Field(description="A real experiment's runner and engine, planned on the simulated runner.")
    repetitions: int
    cluster: dict[str, Any] = Field(description="slots, gpus_per_slot, gpu, samples_per_s, sample_scale.")
    table: str | None = Field(description="The learning-curve table the simulated trials read; null where each batch "
                              "size is read from another shipped table (`tables_by_batch`).")  # fmt: skip
    tables_by_batch: dict[str, str] | None = Field(description="The shipped table each global batch size is read "
                                                   "from, where no one table has all to their budgets.")  # fmt: skip
    trials: int
    tuner: str
    confirm_seeds: int | str
    first_hit: CostPublic = Field(description="Until the first trial that reached the target ended.")
    answer: CostPublic = Field(description="Until the verdict (the experiment's end).")
    idle_fraction: FigurePublic
    confirmation_runs: FigurePublic
    outcomes: dict[str, OutcomeSharePublic] = Field(description="`winner ARM`, `equivalent`, `not yet`: the share "
                                                    "of the repetitions ending so.")  # fmt: skip
    truth: dict[str, Any] | None = Field(description="What the outcomes are judged against: `better` (the truly "
                                         "better arm; null: a tie), `difference`, `stated`, `line`, each arm's best "
                                         "configuration on the table; null without compare arms.")  # fmt: skip
    judged: dict[str, OutcomeSharePublic] = Field(description="`right`, `wrong`, `equivalent` (the arms truly "
                                                  "differ), `not yet`: the outcomes against the truth.")  # fmt: skip
    at_batches: dict[int, BatchOutcomesPublic] = Field(
        default_factory=dict,
        description="A batch-size study: per global batch size where two or more optimizers are compared, the "
        "verdict there (the study's question, which the confirmation rounds follow): its outcomes, their judgement "
        "and the truth there; empty for another experiment.",
    )
    seconds: float | None = Field(description="How long the plan took on the server.")
    lines: list[str] = Field(description="The forecast as `hpo plan` prints it.")


POSTED = "the posted experiment file"  # how a POSTed file's plan names it (its temporary copy is gone by then)

EXPERIMENT_FILE = Body(
    media_type="application/yaml",
    description="The experiment file (YAML), as `hpo run` takes it. Relative paths in it (base_config, "
    "runner.simulation.table) are read from the server's working directory; a shipped trainer config's or curve "
    "table's name (`base_config: demo_cpu`, `table: curves`) names it, wherever the server runs.",
    examples=["name: my_experiment\nbase_config: demo_cpu\n..."],
)


@router.post("/plan", response_model=PlanPublic, dependencies=[TokenDep], responses=ACTION)
async def plan_file(
    request: Request,
    body: Annotated[str, EXPERIMENT_FILE],
    repetitions: Repetitions = 10,
    slots: Slots = None,
    gpus_per_slot: GpusPerSlot = None,
    gpu: Gpu = None,
    difference: Difference = None,
):
    """Forecast an experiment file: GPU-hours and wall-clock to the first target-reaching configuration and to
    the verdict, idle slot-time, and the share of repetitions ending in each outcome (`hpo plan --json`)."""
    try:
        data = yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise HTTPException(422, f"the request body is not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise HTTPException(422, "the request body must be an experiment file: a YAML mapping with name, space, ...")
    return await _plan(request, _absolute_paths(data), repetitions, slots, gpus_per_slot, gpu, difference, POSTED)


@router.get("/experiments/{name}/plan", response_model=PlanPublic, dependencies=[TokenDep], responses=ACTION)
async def plan_stored(
    request: Request,
    record: ExperimentDep,
    repetitions: Repetitions = 10,
    slots: Slots = None,
    gpus_per_slot: GpusPerSlot = None,
    gpu: Gpu = None,
    difference: Difference = None,
):
    """Forecast a stored experiment again, as its spec was stored (self-contained: its base config inline): what
    it would cost and how likely an answer is, e.g. on more slots. Nothing is written."""
    stored = f"the stored experiment {record.name}"
    return await _plan(request, dict(record.spec["experiment"]), repetitions, slots, gpus_per_slot, gpu, difference,
                       stored)  # fmt: skip


def _absolute_paths(data: dict[str, Any]) -> dict[str, Any]:
    """Relative base_config and runner.simulation.table read from the server's working directory (the file is
    planned from a temporary copy elsewhere); a shipped config's or table's name (`bert_large`, `curves`) is left
    for `hpo plan` to find, as in a file, unless a file of that name is at hand there."""
    base = data.get("base_config")
    if isinstance(base, str) and shipped_config(base, Path.cwd()) is None:
        data["base_config"] = os.path.abspath(base)
    simulation = (data.get("runner") or {}).get("simulation") if isinstance(data.get("runner"), dict) else None
    table = simulation.get("table") if isinstance(simulation, dict) else None
    if isinstance(table, str) and shipped_table(table) is None:
        simulation["table"] = os.path.abspath(table)
    return data


async def _plan(
    request: Request,
    data: dict[str, Any],
    repetitions: int,
    slots: int | None,
    gpus_per_slot: int | None,
    gpu: str | None,
    difference: float | None = None,
    source: str = POSTED,
) -> dict[str, Any]:
    """`python -m hpo plan --json` on `data` written to a temporary file; its JSON, or its error as a 422, with the
    temporary file (gone when the answer is read) named as `source` says, e.g. "the posted experiment file". A plan
    whose client has gone (a closed connection, a cancelled request) is stopped as one past its deadline is."""
    with tempfile.TemporaryDirectory(prefix="hpo-api-plan-") as tmp:
        name = data.get("name")  # a slug names the copy (errors quote it); anything else could choose where to write
        path = (
            Path(tmp) / f"{name if isinstance(name, str) and re.fullmatch(NAME_PATTERN, name) else 'experiment'}.yaml"
        )
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        command = [sys.executable, "-m", "hpo", "plan", str(path), "--json", "--repetitions", str(repetitions)]
        options = (("--slots", slots), ("--gpus-per-slot", gpus_per_slot), ("--gpu", gpu), ("--difference", difference))
        for flag, value in options:
            if value is not None:
                command += [flag, str(value)]
        child = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE,
                                                     stderr=asyncio.subprocess.PIPE, cwd=os.getcwd(),
                                                     env=module_env(os.environ))  # fmt: skip
        talk = asyncio.ensure_future(child.communicate())  # reading its output, which could fill a pipe
        try:
            gone = await _wait_while_heard(talk, request, PLAN_TIMEOUT_S)
        except BaseException:  # the request cancelled, the server stopping: shielded, as anyio's cancellation would
            with anyio.CancelScope(shield=True):  # cancel every await of the stop too, the wait for the child's end
                await _stop(child, talk)
            raise
        if gone is not None:
            await _stop(child, talk)
            if gone == "deadline":
                raise HTTPException(504, f"the plan took longer than {PLAN_TIMEOUT_S:.0f} s and was stopped: ask "
                                         "for fewer repetitions")  # fmt: skip
            log.warning("plan of %s stopped: its client disconnected", path.name)
            raise HTTPException(499, "the client disconnected; the plan was stopped")  # no one reads it
        out, err = talk.result()
    if child.returncode != 0:
        lines = err.decode(errors="replace").splitlines()
        first = next((i for i, line in enumerate(lines) if line.startswith("error:")), None)
        detail = "\n".join(lines[first:]) if first is not None else "\n".join(lines)[-2000:] or "hpo plan failed"
        detail = detail.removeprefix("error: ")  # the command line's prefix: the status code says it here
        raise HTTPException(422, detail.replace(str(path), f"{source} ({path.name})"))
    answer = json.loads(out)
    answer["source"] = source
    answer["lines"] = [line.replace(str(path), source) for line in answer.get("lines", [])]
    return answer


async def _wait_while_heard(talk: asyncio.Future, request: Request, timeout_s: float) -> str | None:
    """Wait for the plan's output (`talk`): None once it has it, "deadline" past `timeout_s`, "disconnected" once
    the client has gone (checked every LISTEN_S)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        left = deadline - loop.time()
        if left <= 0:
            return "deadline"
        done, _ = await asyncio.wait({talk}, timeout=min(LISTEN_S, left))
        if done:
            return None
        if await request.is_disconnected():
            return "disconnected"


async def _stop(child: asyncio.subprocess.Process, talk: asyncio.Future | None = None) -> None:
    """End a plan: SIGTERM, on which `hpo plan` ends its worker processes and deletes its temporary files (SIGKILL
    would leave them); SIGKILL only where it has not ended STOP_GRACE_S later. `talk`: the read of its output under
    way, if any (else one is started: its output could fill a pipe)."""
    if child.returncode is None:
        child.terminate()
    talk = talk if talk is not None else asyncio.ensure_future(child.communicate())
    try:
        await asyncio.wait_for(asyncio.shield(talk), STOP_GRACE_S)
    except asyncio.TimeoutError:
        child.kill()
        await child.wait()
