"""The project's errors as HTTP answers: a missing experiment or trial is 404, a database that cannot be
reached (or has an old schema) is 503, a request the export cannot serve is 422; the message always says why."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse

from hpo.errors import HpoError, NotFoundError, StorageError
from hpo.export import ExportError

log = logging.getLogger("server")

ERROR_RESPONSES = {
    404: {"description": "No such experiment, trial or best trial."},
    422: {"description": "A path or query parameter is invalid."},
    503: {"description": "The database cannot be reached, or its schema is out of date."},
}


def _answer(code: int, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=code)


async def _not_found(_request: Request, exc: Exception) -> JSONResponse:
    return _answer(status.HTTP_404_NOT_FOUND, exc)


async def _unavailable(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", exc)
    return _answer(status.HTTP_503_SERVICE_UNAVAILABLE, exc)


async def _unprocessable(_request: Request, exc: Exception) -> JSONResponse:
    return _answer(422, exc)


def install_error_handlers(app: FastAPI) -> None:
    # Starlette picks the handler of the most specific class in the exception's MRO.
    app.add_exception_handler(NotFoundError, _not_found)
    app.add_exception_handler(StorageError, _unavailable)
    app.add_exception_handler(ExportError, _unprocessable)
    app.add_exception_handler(HpoError, _unprocessable)
