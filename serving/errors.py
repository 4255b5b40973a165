"""Errors of the serving package, one root, mapped to HTTP in one place (:func:`install`).

Every error a route raises is a :class:`ServingError`; the app answers it with its ``status``
and the body ``{"error": code, "detail": message}``. (Request validation stays FastAPI's: 422.)
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


class ServingError(Exception):
    """Root of serving errors; ``status`` is the HTTP status the API answers with."""

    status: int = 500
    code: str = "serving_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unauthorized(ServingError):
    status = 401
    code = "unauthorized"


class Forbidden(ServingError):
    status = 403
    code = "forbidden"


class NotFound(ServingError):
    status = 404
    code = "not_found"


class VersionRefused(ServingError):
    """A model version failed a load check (checksum, shape, smoke query)."""

    status = 422
    code = "version_refused"


class StoreUnavailable(ServingError):
    """The online store cannot be read (a route that needs it answers 503)."""

    status = 503
    code = "store_unavailable"


class ScrapeError(ServingError):
    """A dashboard source could not be read; the message is the reason shown on the dashboard
    (the collector marks the source down: it never reaches a client as an error)."""

    status = 502
    code = "scrape_failed"


async def _answer(request: Request, exc: Exception) -> JSONResponse:
    err = exc if isinstance(exc, ServingError) else ServingError(str(exc))
    return JSONResponse({"error": err.code, "detail": err.message}, status_code=err.status)


def install(app: FastAPI) -> None:
    """Map every :class:`ServingError` raised in ``app``'s routes to its HTTP answer."""
    app.add_exception_handler(ServingError, _answer)
