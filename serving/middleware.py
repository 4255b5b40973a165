"""ASGI middleware of the serving app that is not a route's business: the request body cap.

(The ``GET /recommend`` fast path, also a middleware, lives in ``serving.fastpath``.)
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class BodyLimit:
    """ASGI middleware: buffer at most ``limit`` bytes of a request body, else answer 413.

    FastAPI parses a JSON body before the route runs (so before the admin token is checked);
    without a cap an anonymous client could make the process hold an arbitrarily large body.
    """

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        has_body = False
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if value.isdigit() and int(value) > self.limit:
                    await self._too_large(scope, receive, send)
                    return
                has_body = value != b"0"
            elif name == b"transfer-encoding":
                has_body = True
        if not has_body:  # nothing to buffer (e.g. every GET /recommend)
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Any, receive: Any, send: Any) -> None:
        response = JSONResponse(
            {"error": "payload_too_large", "detail": f"request body exceeds {self.limit} bytes"},
            status_code=413, headers={"Connection": "close"})
        await response(scope, receive, send)
