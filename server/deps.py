"""Dependencies the routes declare with `Annotated`: the storage, an experiment by name (alone, or with the storage and
the kept answers for the hot reads), the action token."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from hpo.errors import NotFoundError
from hpo.storage import Storage
from hpo.storage.base import ExperimentRecord
from hpo.storage.deadline import quick_reads
from server.caching import AnswerCache
from server.schemas import NAME_PATTERN
from server.settings import Settings
from server.storage import SpecCache, StorageHolder

_bearer = HTTPBearer(auto_error=False, description="The token set in HPO_API_TOKEN on the server.")


# The three below never block (the storage opens once, in a thread of its own that a request awaits), so they are
# `async def`: FastAPI runs a plain `def` dependency in its thread pool, a round trip that costs more than these
# functions do.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_storage(request: Request) -> Storage:
    return await opened(request.app.state.storage)


async def opened(holder: StorageHolder) -> Storage:
    """The storage of `holder` (`app.state.storage`), awaited while it opens: a connection attempt never holds the
    event loop, so routes that need no database answer meanwhile, and requests wait for one attempt together
    (server.storage.StorageHolder). A stand-in holder (the API load bench's timing wrapper) holds an open storage."""
    return await holder.opened() if isinstance(holder, StorageHolder) else holder.get()


async def get_specs(request: Request) -> SpecCache:
    return request.app.state.specs


SettingsDep = Annotated[Settings, Depends(get_settings)]
StorageDep = Annotated[Storage, Depends(get_storage)]
SpecsDep = Annotated[SpecCache, Depends(get_specs)]
ExperimentName = Annotated[str, Path(pattern=NAME_PATTERN, description="The experiment's name.")]


def get_experiment(name: ExperimentName, storage: StorageDep) -> ExperimentRecord:
    return storage.get_experiment_by_name(name)  # NotFoundError -> 404


ExperimentDep = Annotated[ExperimentRecord, Depends(get_experiment)]


async def get_experiment_ref(name: ExperimentName, storage: StorageDep, specs: SpecsDep) -> ExperimentRecord:
    """The experiment for routes that use only its fixed fields (id, name, direction, spec): read once, then
    from memory, checked with one primary-key read (`current_experiment`)."""
    return (await current_experiment(name, storage, specs))[0]


async def current_experiment(
    name: str, storage: Storage, specs: SpecCache, checked: bool = True
) -> tuple[ExperimentRecord, int | None]:
    """The experiment named `name` and its `trials_version`, read with this request (before its answer). A record
    kept from an earlier request costs one primary-key read, of its version, on the event loop; one removed since
    (`hpo delete`) is forgotten and looked up again by name: a 404, or the experiment recorded under the name since
    (ids are never given twice, so a kept id is the same experiment or none). `checked=False`: a kept record as it
    is, without its version (None), for a route that finds out itself (`gone_unless_read`)."""
    record = specs.known_experiment(name)
    if record is not None:
        if not checked:
            return record, None
        try:
            return record, _kept_version(storage, specs, record)
        except NotFoundError:
            pass  # forgotten: looked up again by name
    record = await run_in_threadpool(_lookup, storage, name)  # NotFoundError -> 404
    specs.remember_experiment(record)
    return record, record.trials_version


def _lookup(storage: Storage, name: str) -> ExperimentRecord:
    """One indexed lookup: under the short database deadline, as the event loop's reads (hpo/storage/deadline.py)."""
    with quick_reads():
        return storage.get_experiment_by_name(name)


ExperimentRefDep = Annotated[ExperimentRecord, Depends(get_experiment_ref)]


@dataclass(frozen=True)
class HotRead:
    """What the hot reads (best configs, trial lists) need, from one dependency instead of four: FastAPI resolves
    every dependency on every request, about 10 us apiece in process (BENCHMARKS.md, "REST API under load")."""

    record: ExperimentRecord  # as ExperimentRefDep: only its fixed fields are current
    version: int | None  # its trials_version, read before the answer it guards (server.caching); None: not read
    storage: Storage
    specs: SpecCache
    answers: AnswerCache


async def get_hot_read(name: ExperimentName, request: Request) -> HotRead:
    return await _hot_read(name, request, checked=True)


async def get_page_read(name: ExperimentName, request: Request) -> HotRead:
    """As get_hot_read for a trial list, but a page after a cursor reads no version: a page with trials shows that
    the experiment is there, and the list checks an empty one (`gone_unless_read`)."""
    return await _hot_read(name, request, checked="after" not in request.query_params)


async def _hot_read(name: str, request: Request, checked: bool) -> HotRead:
    state = request.app.state
    storage, specs = await opened(state.storage), state.specs
    record, version = await current_experiment(name, storage, specs, checked)
    return HotRead(record, version, storage, specs, state.answers)


def gone_unless_read(hot: HotRead) -> None:
    """NotFoundError (a 404) where the experiment of `hot`, read from memory without its version, has been removed
    since it was kept (`hpo delete`), which then forgets it; nothing where it is there."""
    _kept_version(hot.storage, hot.specs, hot.record)


def _kept_version(storage: Storage, specs: SpecCache, record: ExperimentRecord) -> int:
    """The trials_version of a kept experiment (one primary-key read); NotFoundError where it has been removed since,
    which forgets it."""
    try:
        return storage.trials_version(record.id)
    except NotFoundError:
        specs.forget_experiment(record)
        raise


HotReadDep = Annotated[HotRead, Depends(get_hot_read)]
PageReadDep = Annotated[HotRead, Depends(get_page_read)]


def require_token(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Actions need `Authorization: Bearer <HPO_API_TOKEN>`; without a configured token they are refused."""
    expected = settings.token
    if expected is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "actions are disabled on this server because no API token is configured: "
            "set HPO_API_TOKEN in the server's environment and restart `hpo serve`",
        )
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "this action needs the header `Authorization: Bearer <token>` with the server's HPO_API_TOKEN",
            headers={"WWW-Authenticate": "Bearer"},
        )
    # Constant time, on bytes: a timing difference must not reveal how much of the token was right.
    if not hmac.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "the bearer token is not the server's HPO_API_TOKEN",
            headers={"WWW-Authenticate": "Bearer"},
        )


TokenDep = Depends(require_token)
