"""streamrec.client against scripted HTTP answers (httpx.MockTransport): batching, stable
event ids across retries, Retry-After and backoff, typed results, the exceptions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from streamrec.client import (
    AsyncClient,
    Backoff,
    Client,
    Event,
    InvalidEvents,
    NotFound,
    RequestFailed,
    Unavailable,
    retry_after_s,
)

Script = list[httpx.Response]


def ingest(script: Script, seen: list[list[dict[str, Any]]]) -> Callable[[httpx.Request], httpx.Response]:
    """Answers POST /events from ``script`` (then 202), recording every body."""

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/events"
        body = json.loads(request.content)
        seen.append(body)
        if script:
            return script.pop(0)
        return httpx.Response(202, json={"accepted": len(body),
                                         "event_ids": [e["event_id"] for e in body]})
    return handle


def sync_client(handler: Any, sleeps: list[float], **kw: Any) -> Client:
    return Client("http://ingest", "http://serving", transport=httpx.MockTransport(handler),
                  sleep=sleeps.append, seed=1, **kw)


def test_batches_and_ids_kept_across_retries() -> None:
    seen: list[list[dict[str, Any]]] = []
    sleeps: list[float] = []
    script = [httpx.Response(503, headers={"Retry-After": "2"}),
              httpx.Response(429, headers={"Retry-After": "0.5"})]
    events = [{"user_id": f"u{i}", "item_id": "i1", "event_type": "click"} for i in range(5)]
    events[3]["event_id"] = "mine"
    with sync_client(ingest(script, seen), sleeps, batch_size=2) as sr:
        result = sr.send(events)
    assert [len(b) for b in seen] == [2, 2, 2, 2, 1]  # first batch sent three times
    assert seen[0] == seen[1] == seen[2]  # the same ids on every attempt: deduplicated
    assert sleeps == [2.0, 0.5]  # Retry-After honoured
    assert result.accepted == 5 and result.retries == 2
    assert result.event_ids[3] == "mine"
    assert len(set(result.event_ids)) == 5


def test_backoff_without_retry_after_grows_and_is_capped() -> None:
    seen: list[list[dict[str, Any]]] = []
    sleeps: list[float] = []
    script = [httpx.Response(503)] * 6
    with sync_client(ingest(script, seen), sleeps, backoff=Backoff(base_s=1.0, cap_s=4.0)) as sr:
        sr.send([Event("u", "i")])
    assert len(sleeps) == 6
    for attempt, slept in enumerate(sleeps):
        assert 0.0 <= slept <= min(4.0, 2 ** attempt)


def test_connection_errors_are_retried_then_unavailable() -> None:
    calls = []

    def down(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("refused", request=request)

    sleeps: list[float] = []
    with sync_client(down, sleeps, retries=3) as sr, pytest.raises(Unavailable) as err:
        sr.send([Event("u", "i")])
    assert len(calls) == 4 and len(sleeps) == 3
    assert err.value.status is None and err.value.sent == 0


def test_unavailable_reports_what_earlier_batches_sent() -> None:
    seen: list[list[dict[str, Any]]] = []
    script = [httpx.Response(202, json={"accepted": 1, "event_ids": ["a"]})] + [
        httpx.Response(503)] * 3
    with sync_client(ingest(script, seen), [], batch_size=1, retries=2) as sr, \
            pytest.raises(Unavailable) as err:
        sr.send([Event("u", "i", event_id="a"), Event("u", "j")])
    assert err.value.status == 503 and err.value.sent == 1


def test_invalid_events_name_the_field_and_are_not_retried() -> None:
    seen: list[list[dict[str, Any]]] = []
    body = {"detail": "1 invalid event", "errors": [{"index": 0, "field": "event_type",
                                                     "error": "unknown"}]}
    with sync_client(ingest([httpx.Response(422, json=body)], seen), []) as sr, \
            pytest.raises(InvalidEvents) as err:
        sr.send([{"user_id": "u", "item_id": "i", "event_type": "nope"}])
    assert len(seen) == 1
    assert err.value.errors[0]["field"] == "event_type" and err.value.status == 422


def test_other_refusals_raise_request_failed() -> None:
    with sync_client(ingest([httpx.Response(401, json={"detail": "no key"})], []), []) as sr, \
            pytest.raises(RequestFailed) as err:
        sr.send([Event("u", "i")])
    assert err.value.status == 401 and "no key" in str(err.value)


def test_event_timestamps() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert Event("u", "i", ts=when).as_json()["ts"] == "2026-01-02T03:04:05+00:00"
    assert Event("u", "i", ts=1_700_000_000_000).as_json()["ts"] == 1_700_000_000_000
    with pytest.raises(ValueError):
        Event("u", "i", ts=datetime(2026, 1, 2)).as_json()  # noqa: DTZ001 - the case refused


def test_retry_after_forms() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert retry_after_s({"retry-after": "3"}) == 3.0
    assert retry_after_s({"retry-after": format_datetime(now + timedelta(seconds=7), usegmt=True)},
                         now) == 7.0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None


def serving(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/recommend":
        assert request.url.params["k"] == "2"
        return httpx.Response(200, json={
            "user_id": request.url.params["user_id"], "model_version": "v7", "source": "model",
            "took_ms": 1.5, "items": [{"item_id": "a", "score": 0.9}, {"item_id": "b", "score": 0.5}]})
    if request.url.path == "/users/alice/features":
        return httpx.Response(200, json={
            "user_id": "alice", "history": [{"item_id": "a", "event_type": "click", "ts_ms": 5}],
            "counts": {"1h": {"click": 1}}, "last_seen_ms": 5, "as_of_ms": 5})
    return httpx.Response(404, json={"error": "not_found", "detail": "unknown user_id 'bob'"})


def test_recommend_and_features_are_typed() -> None:
    with sync_client(serving, []) as sr:
        rec = sr.recommend("alice", k=2)
        assert rec.model_version == "v7" and rec.source == "model"
        assert [(i.item_id, i.score) for i in rec.items] == [("a", 0.9), ("b", 0.5)]
        feats = sr.features("alice")
        assert feats.history[0].item_id == "a" and feats.counts == {"1h": {"click": 1}}
        with pytest.raises(NotFound, match="bob"):
            sr.features("bob")


def test_async_client_same_contract() -> None:
    seen: list[list[dict[str, Any]]] = []
    sleeps: list[float] = []
    handle = ingest([httpx.Response(503, headers={"Retry-After": "1"})], seen)

    async def route(request: httpx.Request) -> httpx.Response:
        return handle(request) if request.url.path == "/events" else serving(request)

    async def record(s: float) -> None:
        sleeps.append(s)

    async def main() -> tuple[Any, Any]:
        async with AsyncClient("http://ingest", "http://serving", sleep=record,
                               transport=httpx.MockTransport(route), batch_size=3) as sr:
            sent = await sr.send(Event(f"u{i}", "i") for i in range(4))
            return sent, await sr.recommend("alice", k=2)

    sent, rec = asyncio.run(main())
    assert [len(b) for b in seen] == [3, 3, 1] and seen[0] == seen[1]
    assert sleeps == [1.0] and sent.accepted == 4
    assert rec.items[0].item_id == "a"


def catalogue(script: Script, seen: list[list[dict[str, Any]]]) -> Callable[[httpx.Request], httpx.Response]:
    """Answers POST /items from ``script`` (then 202), recording every body."""

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/items"
        body = json.loads(request.content)
        seen.append(body)
        if script:
            return script.pop(0)
        return httpx.Response(202, json={"accepted": len(body),
                                         "item_ids": [i["item_id"] for i in body]})
    return handle


def test_upsert_items_batches_and_retries() -> None:
    seen: list[list[dict[str, Any]]] = []
    sleeps: list[float] = []
    items = [{"item_id": f"i{n}", "attributes": {"category": "c"}} for n in range(5)]
    script = [httpx.Response(503, headers={"Retry-After": "1"})]
    with sync_client(catalogue(script, seen), sleeps, batch_size=2) as sr:
        result = sr.upsert_items(items)
    assert [len(b) for b in seen] == [2, 2, 2, 1] and seen[0] == seen[1]
    assert result.accepted == 5 and result.retries == 1 and sleeps == [1.0]
    assert result.item_ids == [f"i{n}" for n in range(5)]
    refused = [httpx.Response(422, json={"error": "invalid", "detail": "1 invalid field(s)",
               "errors": [{"index": 0, "field": "attributes.colour", "error": "unknown"}]})]
    with sync_client(catalogue(refused, []), []) as sr, pytest.raises(InvalidEvents) as info:
        sr.upsert_items(items[:1])
    assert info.value.errors[0]["field"] == "attributes.colour"
    with sync_client(catalogue([httpx.Response(503)] * 3, []), [], retries=2) as sr:
        with pytest.raises(Unavailable):
            sr.upsert_items(items[:1])


def test_async_upsert_items() -> None:
    seen: list[list[dict[str, Any]]] = []

    async def run() -> Any:
        async def no_sleep(_s: float) -> None:
            return None

        async with AsyncClient("http://ingest", None, batch_size=3, sleep=no_sleep,
                               transport=httpx.MockTransport(catalogue([], seen))) as sr:
            return await sr.upsert_items([{"item_id": f"i{n}"} for n in range(4)])

    result = asyncio.run(run())
    assert result.accepted == 4 and [len(b) for b in seen] == [3, 1]
