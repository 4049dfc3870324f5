"""The FastAPI application: settings, storage and routers wired together, and `serve` to run it under uvicorn."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from hpo.storage.engine import safe_url
from server.errors import install_error_handlers
from server.routes import best, experiments, export, health, reports, trials
from server.settings import Settings
from server.storage import SpecCache, StorageHolder

API_PREFIX = "/api/v1"
log = logging.getLogger("server")


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API over the database in `settings` (default: read from the environment)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        app.state.storage.close()

    app = FastAPI(
        title="BERT optimizer HPO",
        summary="Experiments, trials, learning curves and best configs of the HPO service; export to production.",
        version="1",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.storage = StorageHolder(settings.database_url)
    app.state.specs = SpecCache()
    install_error_handlers(app)
    for module in (health, experiments, trials, best, export, reports):
        app.include_router(module.router, prefix=API_PREFIX)
    app.include_router(reports.home)  # `/`: the list of experiments, linking to each report
    return app


def serve(settings: Settings) -> None:
    """Run the API under uvicorn (one worker) until interrupted."""
    import uvicorn  # only `hpo serve` runs a server; tests and importers build the app alone

    actions = "enabled (bearer token)" if settings.token else "disabled (no HPO_API_TOKEN)"
    print(
        f"serving the HPO API on http://{settings.api_host}:{settings.api_port}{API_PREFIX} "
        f"(docs: {API_PREFIX}/docs), database {safe_url(settings.database_url)}, actions {actions}",
        flush=True,
    )
    uvicorn.run(create_app(settings), host=settings.api_host, port=settings.api_port, log_level="info",
                access_log=settings.api_access_log)  # fmt: skip
