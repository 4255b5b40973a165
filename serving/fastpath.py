"""``GET /recommend`` answered before the framework's routing (an ASGI middleware).

A well-formed request — ``user_id`` of 1-128 characters, ``k`` absent or a plain decimal
in ``1..max_k``, ``exclude_seen`` absent or one of ``true/false/1/0``, no request body —
is answered here with the same bytes and headers the route would send. Anything else (a
missing or invalid parameter, another spelling of a boolean, a body, a ``root_path``)
goes on to the FastAPI route, which validates it and answers 422 as before: this path
only ever handles requests whose answer it knows to be the route's. Why: the routing,
dependency solving and response object were a large share of a worker's CPU per request
(figures: ``docs/decisions.md#serving-request-path``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import orjson

#: ``(user_id, k, exclude_seen) -> answer`` (the JSON object of ``GET /recommend``).
Answerer = Callable[[str, int, bool], Awaitable[dict[str, Any]]]
#: Whether a response closes its connection (``serving.balance``).
Closer = Callable[[], bool]

#: Longest ``user_id`` of ``GET /recommend`` (the route's own limit too; an event's ids have
#: the same bound, ``stream.rules.MAX_ID_LEN``).
MAX_USER_ID = 128

_BOOLS = {"true": True, "1": True, "false": False, "0": False}
_BODY_HEADERS = (b"content-length", b"transfer-encoding")
_JSON = (b"content-type", b"application/json")
_CLOSE = (b"connection", b"close")


def parse_recommend(query_string: bytes, default_k: int, max_k: int,
                    max_user_id: int = MAX_USER_ID) -> tuple[str, int, bool] | None:
    """``(user_id, k, exclude_seen)`` of a query string the route would accept as is, else
    ``None``. Decoded as Starlette does (latin-1, ``parse_qsl``, the last value of a
    repeated key wins)."""
    values = dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))
    user_id = values.get("user_id")
    if user_id is None or not 1 <= len(user_id) <= max_user_id:
        return None
    k = default_k
    raw_k = values.get("k")
    if raw_k is not None:
        if not (raw_k.isascii() and raw_k.isdigit()) or raw_k[0] == "0":
            return None
        k = int(raw_k)
        if k > max_k:
            return None
    exclude_seen = True
    raw_ex = values.get("exclude_seen")
    if raw_ex is not None:
        if raw_ex not in _BOOLS:
            return None
        exclude_seen = _BOOLS[raw_ex]
    return user_id, k, exclude_seen


class RecommendFastPath:
    """ASGI middleware: well-formed ``GET /recommend`` straight to ``answer``; ``close``:
    asked per answer, True adds ``Connection: close`` (``serving.balance``)."""

    def __init__(self, app: Any, answer: Answerer, default_k: int, max_k: int,
                 close: Closer | None = None) -> None:
        self.app = app
        self.answer = answer
        self.default_k = default_k
        self.max_k = max_k
        self.close = close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (scope["type"] == "http" and scope["path"] == "/recommend"
                and scope["method"] == "GET" and not scope.get("root_path")
                and not any(name in _BODY_HEADERS for name, _ in scope["headers"])):
            params = parse_recommend(scope["query_string"], self.default_k, self.max_k)
            if params is not None:
                body = orjson.dumps(await self.answer(*params))
                headers = [(b"content-length", str(len(body)).encode("latin-1")), _JSON]
                if self.close is not None and self.close():
                    headers.append(_CLOSE)
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
