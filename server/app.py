"""The FastAPI application: settings, storage and routers wired together, and `serve` to run it under uvicorn."""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from hpo.errors import HpoError
from hpo.storage.engine import safe_url
from server.caching import AnswerCache
from server.docs import install_docs
from server.errors import install_error_handlers
from server.head import HeadAsGet
from server.query import strict_query
from server.routes import best, experiments, export, health, plan, reports, trials
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
        docs_url=None,  # served by server.docs from bundled assets: FastAPI's own page loads them from a CDN
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.storage = StorageHolder(settings.database_url, settings.api_database_timeout_s)
    app.state.specs = SpecCache()
    app.state.answers = AnswerCache()
    install_error_handlers(app)
    app.add_middleware(HeadAsGet)  # HEAD answers as GET, without the body
    install_docs(app, f"{API_PREFIX}/docs")
    strict = [Depends(strict_query)]  # a query key the route does not take, or a single one repeated: a 422
    for module in (health, experiments, trials, best, export, plan, reports):
        app.include_router(module.router, prefix=API_PREFIX, dependencies=strict)
    app.include_router(reports.home, dependencies=strict)  # `/`: the list of experiments, linking to each report
    return app


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port for uvicorn; a port another program holds is an HpoError that says so
    (bound here, not by uvicorn, which would only log the errno and exit 1)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port left in TIME_WAIT is free; a listener's not
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise HpoError(
                f"port {port} is in use on {host}: another program (perhaps another `hpo serve`) listens there; "
                "choose a free port with `hpo serve --port N` (or HPO_API_PORT), or stop that program"
            ) from None
        raise HpoError(f"cannot listen on {host}:{port}: {exc.strerror}; check --host/--port (HPO_API_HOST, "
                       "HPO_API_PORT)") from None  # fmt: skip
    return sock


def serve(settings: Settings) -> None:
    """Run the API under uvicorn (one worker) until interrupted; HpoError when it cannot listen on the port."""
    import uvicorn  # only `hpo serve` runs a server; tests and importers build the app alone

    sock = listening_socket(settings.api_host, settings.api_port)
    actions = "enabled (bearer token)" if settings.token else "disabled (no HPO_API_TOKEN)"
    print(
        f"serving the HPO API on http://{settings.api_host}:{settings.api_port}{API_PREFIX} "
        f"(docs: {API_PREFIX}/docs), database {safe_url(settings.database_url)}, actions {actions}",
        flush=True,
    )
    config = uvicorn.Config(create_app(settings), host=settings.api_host, port=settings.api_port, log_level="info",
                            access_log=settings.api_access_log)  # fmt: skip
    uvicorn.Server(config).run(sockets=[sock])
