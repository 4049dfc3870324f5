"""The project's errors as HTTP answers: a missing experiment or trial is 404, a database that cannot be
reached (or has an old schema) is 503, a request the export cannot serve is 422; the message always says why.

A 503 carries `Retry-After` (RETRY_AFTER_S seconds): a database that is away (restarting, failing over) comes back
by itself, and the server answers again without a restart (server.storage waits briefly, then answers 503 at once
for as long as it stays away)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hpo.errors import HpoError, NotFoundError, StorageError
from hpo.export.production import ExportError
from hpo.storage.engine import COMMAND_WAITS, SET_OUTAGE_S
from server.schemas import ErrorPublic, InvalidRequestPublic

DOCS_PATH = "/api/v1/docs"  # where server.app installs the Swagger UI page

log = logging.getLogger("server")
RETRY_AFTER_S = 5  # what a 503 asks clients to wait before they ask again

# Every route that reads the database answers these, each with its body's schema in the OpenAPI document.
ERROR_RESPONSES = {
    404: {"model": ErrorPublic, "description": "No such experiment, trial or best trial."},
    422: {"model": InvalidRequestPublic, "description": "A path or query parameter is invalid."},
    503: {"model": ErrorPublic, "description": "The database cannot be reached, or its schema is out of date."},
}

# What an action (the routes that need the token) may answer besides.
TOKEN_RESPONSES = {
    401: {"model": ErrorPublic, "description": "No bearer token, or not the server's token."},
    403: {"model": ErrorPublic, "description": "Actions are disabled: the server has no HPO_API_TOKEN."},
}

# The same for routes that answer HTML: FastAPI would file a `model` under the route's media type (text/html),
# but the errors are JSON. The schemas are the components the routes above register.
JSON_ERROR_RESPONSES = {
    code: {
        "description": response["description"],
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{response['model'].__name__}"}}},
    }
    for code, response in ERROR_RESPONSES.items()
}


def _answer(code: int, exc: Exception, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=code, headers=headers)


# What the storage's outage messages say to a command's user, and what they mean to an API client
_COMMAND_ADVICE = ((COMMAND_WAITS, "and the API answers again by itself."), (SET_OUTAGE_S, ""))


def unavailable_detail(exc: Exception) -> str:
    """A database outage's message for an API client: the storage's words less what it tells a command line's user
    to do (HPO_DATABASE_OUTAGE_S: a command waits, the API answers 503 with Retry-After meanwhile)."""
    text = str(exc)
    for said, meant in _COMMAND_ADVICE:
        text = text.replace(said, meant)
    return text


def retry_after() -> dict[str, str]:
    """The headers of a 503: when to ask again."""
    return {"Retry-After": str(RETRY_AFTER_S)}


async def _not_found(_request: Request, exc: Exception) -> JSONResponse:
    return _answer(status.HTTP_404_NOT_FOUND, exc)


async def _unavailable(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", exc)
    return JSONResponse({"detail": unavailable_detail(exc)}, status_code=503, headers=retry_after())


async def _unprocessable(_request: Request, exc: Exception) -> JSONResponse:
    return _answer(422, exc)


# What a body FastAPI refuses (none, JSON sent as application/json, bytes that are not UTF-8) should have been: the
# only body the API takes is POST /plan's experiment file.
BODY_HINT = ("the request body is the experiment file as YAML text: send it with `Content-Type: application/yaml` "
             "(curl: --data-binary @FILE -H 'Content-Type: application/yaml')")  # fmt: skip


async def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 (`InvalidRequestPublic`), also for a body that is not UTF-8 text: its bytes are echoed with
    U+FFFD for what does not decode, where FastAPI's own handler fails on them (a 500). A refused body's message
    says what the body must be and how to send it (FastAPI's alone, "Field required" or "JSON decode error", does
    not)."""
    errors = jsonable_encoder(exc.errors(), custom_encoder={bytes: lambda raw: raw.decode(errors="replace")})
    for error in errors:
        if error.get("loc", [None])[0] == "body":
            error["msg"] = f"{error['msg']}: {BODY_HINT}"
    return JSONResponse({"detail": errors}, status_code=422)


async def _no_route(request: Request, exc: StarletteHTTPException):
    """Starlette's bare "Not Found" for a path no endpoint has (a name holding '/', `%2F`, lands here): what is
    there instead. Every other HTTP error (an endpoint's own 404, a 405 with its Allow header) as FastAPI sends it."""
    if exc.status_code == status.HTTP_404_NOT_FOUND and exc.detail == "Not Found":
        detail = (f"no endpoint at {request.url.path}: the API's endpoints are listed at {DOCS_PATH} (an "
                  "experiment's name never holds '/')")  # fmt: skip
        return JSONResponse({"detail": detail}, status_code=status.HTTP_404_NOT_FOUND)
    return await http_exception_handler(request, exc)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _no_route)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    # Starlette picks the handler of the most specific class in the exception's MRO.
    app.add_exception_handler(NotFoundError, _not_found)
    app.add_exception_handler(StorageError, _unavailable)
    app.add_exception_handler(ExportError, _unprocessable)
    app.add_exception_handler(HpoError, _unprocessable)
