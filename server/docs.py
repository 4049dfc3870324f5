"""The API's documentation page (Swagger UI) with its assets served by this app, so it works offline.

FastAPI's own page loads Swagger UI from a CDN and is blank without one. The assets here are the Swagger UI 5
bundle (it reads OpenAPI 3.1) shipped inside the `fastapi-offline` package: installed with the server, never
downloaded at run time.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")
# Swagger UI's defaults also ask an outside validator for a badge; null turns that off.
PARAMETERS = {"validatorUrl": None}


def assets_directory() -> str:
    """Where the installed Swagger UI bundle lies."""
    return str(files("fastapi_offline") / "static")


def install_docs(app: FastAPI, docs_url: str) -> None:
    """`docs_url`: the Swagger UI page over the app's OpenAPI document; `docs_url/assets/...`: its files."""
    assets = f"{docs_url}/assets"
    app.mount(assets, StaticFiles(directory=assets_directory()), name="docs-assets")

    @app.get(docs_url, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url,
            title=f"{app.title} - API documentation",
            swagger_js_url=f"{assets}/{ASSETS[0]}",
            swagger_css_url=f"{assets}/{ASSETS[1]}",
            swagger_favicon_url=f"{assets}/{ASSETS[2]}",
            swagger_ui_parameters=PARAMETERS,
        )
