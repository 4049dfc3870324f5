"""HEAD, which every HTTP server must answer (RFC 9110, section 9.3.2; monitors and proxies send it): the GET of the
same URL without its body. FastAPI routes answer only the methods they declare, so a HEAD request reaches them as
a GET and the body is dropped on the way out; status and headers (Content-Length, ETag) are the GET's."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """ASGI middleware: HEAD is served as GET without the body; every other request passes untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_body)
