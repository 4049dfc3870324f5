from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from hpo.errors import NotFoundError, StorageError
from hpo.storage.engine import safe_url
from server.schemas import HealthPublic

router = APIRouter(tags=["health"])


@router.get(
    "/health",
    response_model=HealthPublic,
    responses={503: {"model": HealthPublic, "description": "The database cannot be reached."}},
)
def health(request: Request):
    """Whether the server can reach its database (503 with the reason when it cannot)."""
    holder = request.app.state.storage
    database = safe_url(holder.url)
    try:
        holder.get().get_experiment_by_name("-")  # one indexed lookup; no experiment has this name
    except NotFoundError:
        pass
    except StorageError as exc:
        body = HealthPublic(status="unavailable", database=database, detail=str(exc))
        return JSONResponse(body.model_dump(), status_code=503)
    return HealthPublic(status="ok", database=database)
