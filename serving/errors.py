"""Errors of the serving package, one root, mapped to HTTP in one place (``serving.app``)."""

from __future__ import annotations


class ServingError(Exception):
    """Root of serving errors; ``status`` is the HTTP status the API answers with."""

    status: int = 500
    code: str = "serving_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(ServingError):
    status = 400
    code = "bad_request"


class Unauthorized(ServingError):
    status = 401
    code = "unauthorized"


class Forbidden(ServingError):
    status = 403
    code = "forbidden"


class NotFound(ServingError):
    status = 404
    code = "not_found"


class Conflict(ServingError):
    status = 409
    code = "conflict"


class VersionRefused(ServingError):
    """A model version failed a load check (checksum, shape, smoke query)."""

    status = 422
    code = "version_refused"
