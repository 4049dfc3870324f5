from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from hpo.errors import DatabaseUnavailableError, NotFoundError, StorageError
from hpo.storage.engine import safe_url
from hpo.storage.retry import without_waiting
from server.errors import retry_after, unavailable_detail
from server.schemas import HealthPublic

router = APIRouter(tags=["health"])


@router.get(
    "/health",
    response_model=HealthPublic,
    responses={503: {"model": HealthPublic, "description": "The database cannot be reached."}},
)
def health(request: Request):
    """Whether the server can reach its database (503 with the reason, "the database is down: ..." while it is
    away, and Retry-After when it cannot). Never waits for the database."""
    holder = request.app.state.storage
    database = safe_url(holder.url)
    try:
        with without_waiting():
            holder.get().get_experiment_by_name("-")  # one indexed lookup; no experiment has this name
    except NotFoundError:
        pass
    except StorageError as exc:
        down = isinstance(exc, DatabaseUnavailableError)
        detail = f"the database is down: {unavailable_detail(exc)}" if down else str(exc)
        body = HealthPublic(status="unavailable", database=database, detail=detail)
        return JSONResponse(body.model_dump(), status_code=503, headers=retry_after())
    return HealthPublic(status="ok", database=database)
