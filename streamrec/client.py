"""The Python client of streamrec's HTTP APIs: ingest (``POST /events``, ``POST /items``) and
serving (``GET /recommend``, ``GET /users/{id}/features``, ``GET /model``), sync and asyncio.

    from streamrec.client import Client

    with Client("http://127.0.0.1:8001", "http://127.0.0.1:8000") as sr:
        sr.send([{"user_id": "alice", "item_id": "i42", "event_type": "click"}])
        for item in sr.recommend("alice", k=5).items:
            print(item.item_id, item.score)

:meth:`Client.send` batches events and gives each one without an ``event_id`` one before its
first attempt, so a retry is deduplicated downstream; 503, 429 and connection errors are
retried (``Retry-After``, else backoff with jitter), then :class:`Unavailable`; a 422 raises
:class:`InvalidEvents` naming each bad field, other refusals :class:`RequestFailed`.
:meth:`Client.upsert_items` sends catalogue items (``{"item_id", "attributes", "ts"?,
"deleted"?}``) the same way, in batches, with the same retries (an upsert sent twice is
harmless: the store keeps the newest version of an item).
:class:`AsyncClient` has the same methods as coroutines.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx

__all__ = [
    "AsyncClient", "Backoff", "Client", "Event", "HistoryEntry", "InvalidEvents", "NotFound",
    "Recommendation",
    "RecommendedItem", "RequestFailed", "SendResult", "StreamrecError", "Unavailable",
    "UpsertResult", "UserFeatures",
]

#: Answers worth retrying: the ingest API's "Kafka unavailable" and "rate limited".
RETRY_STATUSES = frozenset({429, 503})


# ------------------------------------------------------------------------------ errors


class StreamrecError(Exception):
    """Root of the client's errors."""


class RequestFailed(StreamrecError):
    """The API refused the request (a 4xx/5xx that is not retried)."""

    def __init__(self, status: int, detail: str, body: Any = None) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail, self.body = status, detail, body


class InvalidEvents(RequestFailed):
    """422: at least one event is invalid; nothing of that batch was written.
    ``errors`` holds ``{"index", "field", "error"}`` per problem, ``index`` in the batch;
    ``sent`` counts the events of earlier batches that were accepted."""

    def __init__(self, detail: str, errors: list[dict[str, Any]], sent: int, body: Any) -> None:
        super().__init__(422, detail, body)
        self.errors, self.sent = errors, sent


class NotFound(RequestFailed):
    """404: e.g. a user the feature store does not hold."""


class Unavailable(StreamrecError):
    """Still 503/429 or unreachable after every retry. ``sent`` counts the events of
    earlier batches that were accepted."""

    def __init__(self, message: str, status: int | None, sent: int = 0) -> None:
        super().__init__(message)
        self.status, self.sent = status, sent


# ------------------------------------------------------------------------------ types


@dataclass(frozen=True)
class Event:
    """One event of the ingest schema (``ts``: a timezone-aware datetime or epoch ms; None:
    the time the API receives it)."""

    user_id: str
    item_id: str
    event_type: str = "click"
    ts: datetime | int | None = None
    event_id: str | None = None
    value: float | None = None
    context: Mapping[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None}
        if isinstance(self.ts, datetime):
            if self.ts.tzinfo is None:
                raise ValueError("Event.ts must be timezone-aware")
            out["ts"] = self.ts.isoformat()
        return out


@dataclass(frozen=True)
class SendResult:
    accepted: int
    event_ids: list[str]
    retries: int = 0


@dataclass(frozen=True)
class UpsertResult:
    accepted: int
    item_ids: list[str]
    retries: int = 0


@dataclass(frozen=True)
class RecommendedItem:
    item_id: str
    score: float


@dataclass(frozen=True)
class Recommendation:
    """``source``: ``model``, ``popular`` (no model yet, or an unknown user) or ``degraded``
    (the feature store failed)."""

    user_id: str
    items: list[RecommendedItem]
    model_version: str | None
    source: str
    took_ms: float

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Recommendation:
        return cls(str(body["user_id"]),
                   [RecommendedItem(str(i["item_id"]), float(i["score"])) for i in body["items"]],
                   body.get("model_version"), str(body["source"]), float(body.get("took_ms", 0)))


@dataclass(frozen=True)
class HistoryEntry:
    item_id: str
    event_type: str
    ts_ms: int


@dataclass(frozen=True)
class UserFeatures:
    """What the feature store holds for a user, current to ``as_of_ms`` (event time):
    recent interactions (most recent first) and counts per window and event type."""

    user_id: str
    history: list[HistoryEntry]
    counts: dict[str, dict[str, int]]
    last_seen_ms: int
    as_of_ms: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> UserFeatures:
        return cls(str(body["user_id"]),
                   [HistoryEntry(str(h["item_id"]), str(h["event_type"]), int(h["ts_ms"]))
                    for h in body.get("history", [])],
                   {w: {t: int(n) for t, n in c.items()} for w, c in body.get("counts", {}).items()},
                   int(body.get("last_seen_ms", 0)), int(body.get("as_of_ms", 0)))


# ------------------------------------------------------------------------------ shared logic


def new_event_id() -> str:
    """A random 128-bit id in hex, the same shape the ingest API gives events without one."""
    return os.urandom(16).hex()


def _wire(events: Iterable[Event | Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in events:
        body = e.as_json() if isinstance(e, Event) else dict(e)
        if body.get("event_id") is None:
            body["event_id"] = new_event_id()
        out.append(body)
    return out


def retry_after_s(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date); None if absent or invalid."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter, capped; ``Retry-After`` wins when given."""

    base_s: float = 0.2
    cap_s: float = 10.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        if retry_after is not None:
            return min(retry_after, self.cap_s * 6)
        return rng.uniform(0, min(self.cap_s, self.base_s * 2 ** attempt))


def _raise_for(resp: httpx.Response, sent: int = 0) -> None:
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if resp.status_code == 422 and isinstance(body, dict):
        raise InvalidEvents(str(detail), list(body.get("errors", [])), sent, body)
    if resp.status_code == 404:
        raise NotFound(404, str(detail), body)
    raise RequestFailed(resp.status_code, str(detail), body)


class _Base:
    def __init__(self, ingest_url: str | None, serving_url: str | None, *,
                 api_key: str | None, batch_size: int, retries: int, backoff: Backoff,
                 seed: int | None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.ingest_url = ingest_url.rstrip("/") if ingest_url else None
        self.serving_url = serving_url.rstrip("/") if serving_url else None
        self.headers = {"x-api-key": api_key} if api_key else {}
        self.batch_size, self.retries, self.backoff = batch_size, retries, backoff
        self.rng = random.Random(seed)

    def _url(self, base: str | None, what: str, path: str) -> str:
        if base is None:
            raise StreamrecError(f"no {what} URL given to the client")
        return base + path

    def _batches(self, events: Iterable[Event | Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
        return self._split(_wire(events))

    def _split(self, wire: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        return [wire[i:i + self.batch_size] for i in range(0, len(wire), self.batch_size)]

    def _after(self, attempt: int, resp: httpx.Response | None, exc: Exception | None,
               ids: list[str], ids_field: str = "event_ids") -> float | None:
        """The outcome of one POST of a batch: None when accepted (its ids, the answer's
        ``ids_field``, appended to ``ids``), else the seconds to wait before the next attempt;
        raises when the batch is refused or this was the last attempt."""
        if resp is not None and resp.status_code == 202:
            ids.extend(resp.json()[ids_field])
            return None
        if resp is not None and resp.status_code not in RETRY_STATUSES:
            _raise_for(resp, len(ids))
        if attempt >= self.retries:
            reason = f"HTTP {resp.status_code}" if resp is not None else f"unreachable ({exc!r})"
            raise Unavailable(f"ingest still {reason} after {attempt + 1} attempts",
                              resp.status_code if resp is not None else None, len(ids))
        wait = retry_after_s(resp.headers) if resp is not None else None
        return self.backoff.delay(attempt, wait, self.rng)


# ------------------------------------------------------------------------------ clients


class Client(_Base):
    """Blocking client. ``ingest_url``/``serving_url`` may be None if unused."""

    def __init__(self, ingest_url: str | None = "http://127.0.0.1:8001",
                 serving_url: str | None = "http://127.0.0.1:8000", *,
                 api_key: str | None = None, timeout_s: float = 10.0, batch_size: int = 500,
                 retries: int = 8, backoff: Backoff | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 transport: httpx.BaseTransport | None = None, seed: int | None = None) -> None:
        super().__init__(ingest_url, serving_url, api_key=api_key, batch_size=batch_size,
                         retries=retries, backoff=backoff or Backoff(), seed=seed)
        self.sleep = sleep
        self.http = httpx.Client(timeout=timeout_s, headers=self.headers, transport=transport)

    def send(self, events: Iterable[Event | Mapping[str, Any]]) -> SendResult:
        """POST the events in batches; returns what was accepted (all of them, or raises)."""
        ids, retries = self._post_batches("/events", self._batches(events), "event_ids")
        return SendResult(len(ids), ids, retries)

    def upsert_items(self, items: Iterable[Mapping[str, Any]]) -> UpsertResult:
        """POST catalogue items in batches (``POST /items``); returns what was accepted."""
        batches = self._split([dict(item) for item in items])
        ids, retries = self._post_batches("/items", batches, "item_ids")
        return UpsertResult(len(ids), ids, retries)

    def _post_batches(self, path: str, batches: list[list[dict[str, Any]]],
                      ids_field: str) -> tuple[list[str], int]:
        url = self._url(self.ingest_url, "ingest", path)
        ids: list[str] = []
        retries = 0
        for batch in batches:
            attempt = 0
            while True:
                resp, exc = None, None
                try:
                    resp = self.http.post(url, json=batch)
                except httpx.TransportError as error:
                    exc = error
                delay = self._after(attempt, resp, exc, ids, ids_field)
                if delay is None:
                    break
                retries, attempt = retries + 1, attempt + 1
                self.sleep(delay)
        return ids, retries

    def recommend(self, user_id: str, k: int = 10, exclude_seen: bool = True) -> Recommendation:
        resp = self.http.get(self._url(self.serving_url, "serving", "/recommend"),
                             params={"user_id": user_id, "k": k,
                                     "exclude_seen": str(exclude_seen).lower()})
        if resp.status_code != 200:
            _raise_for(resp)
        return Recommendation.from_json(resp.json())

    def features(self, user_id: str) -> UserFeatures:
        """The user's features; :class:`NotFound` for a user the store does not hold."""
        resp = self.http.get(self._url(self.serving_url, "serving", f"/users/{quote(user_id, safe='')}/features"))
        if resp.status_code != 200:
            _raise_for(resp)
        return UserFeatures.from_json(resp.json())

    def model(self) -> dict[str, Any]:
        """``GET /model``: the served version, its age and what it was trained through."""
        resp = self.http.get(self._url(self.serving_url, "serving", "/model"))
        if resp.status_code != 200:
            _raise_for(resp)
        return dict(resp.json())

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Base):
    """The asyncio twin of :class:`Client` (``async with``; every method awaited)."""

    def __init__(self, ingest_url: str | None = "http://127.0.0.1:8001",
                 serving_url: str | None = "http://127.0.0.1:8000", *,
                 api_key: str | None = None, timeout_s: float = 10.0, batch_size: int = 500,
                 retries: int = 8, backoff: Backoff | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 transport: httpx.AsyncBaseTransport | None = None,
                 seed: int | None = None) -> None:
        super().__init__(ingest_url, serving_url, api_key=api_key, batch_size=batch_size,
                         retries=retries, backoff=backoff or Backoff(), seed=seed)
        self.sleep = sleep
        self.http = httpx.AsyncClient(timeout=timeout_s, headers=self.headers,
                                      transport=transport)

    async def send(self, events: Iterable[Event | Mapping[str, Any]]) -> SendResult:
        ids, retries = await self._post_batches("/events", self._batches(events), "event_ids")
        return SendResult(len(ids), ids, retries)

    async def upsert_items(self, items: Iterable[Mapping[str, Any]]) -> UpsertResult:
        batches = self._split([dict(item) for item in items])
        ids, retries = await self._post_batches("/items", batches, "item_ids")
        return UpsertResult(len(ids), ids, retries)

    async def _post_batches(self, path: str, batches: list[list[dict[str, Any]]],
                            ids_field: str) -> tuple[list[str], int]:
        url = self._url(self.ingest_url, "ingest", path)
        ids: list[str] = []
        retries = 0
        for batch in batches:
            attempt = 0
            while True:
                resp, exc = None, None
                try:
                    resp = await self.http.post(url, json=batch)
                except httpx.TransportError as error:
                    exc = error
                delay = self._after(attempt, resp, exc, ids, ids_field)
                if delay is None:
                    break
                retries, attempt = retries + 1, attempt + 1
                await self.sleep(delay)
        return ids, retries

    async def recommend(self, user_id: str, k: int = 10,
                        exclude_seen: bool = True) -> Recommendation:
        resp = await self.http.get(self._url(self.serving_url, "serving", "/recommend"),
                                   params={"user_id": user_id, "k": k,
                                           "exclude_seen": str(exclude_seen).lower()})
        if resp.status_code != 200:
            _raise_for(resp)
        return Recommendation.from_json(resp.json())

    async def features(self, user_id: str) -> UserFeatures:
        resp = await self.http.get(
            self._url(self.serving_url, "serving", f"/users/{quote(user_id, safe='')}/features"))
        if resp.status_code != 200:
            _raise_for(resp)
        return UserFeatures.from_json(resp.json())

    async def model(self) -> dict[str, Any]:
        resp = await self.http.get(self._url(self.serving_url, "serving", "/model"))
        if resp.status_code != 200:
            _raise_for(resp)
        return dict(resp.json())

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
