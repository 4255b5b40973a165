"""Ingest API against the real broker: what is answered 202 is in Kafka, field by field;
what is refused (422, 413) is not; a stopped broker gives 503 and a retrying client loses
nothing and duplicates nothing."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kafka.partitioner.default import murmur2

from stream.ingest.api import create_app
from streamrec.settings import Settings
from tests.support import consume, free_port, wait_until

pytestmark = pytest.mark.integration

NOW_MS = int(datetime(2025, 6, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)


def with_ingest(settings: Settings, **ingest: object) -> Settings:
    return settings.model_copy(update={"ingest": settings.ingest.model_copy(update=ingest)})


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    app = create_app(
        with_ingest(settings, max_body_bytes=20_000, max_batch=50), clock_ms=lambda: NOW_MS
    )
    with TestClient(app) as c:
        yield c


def test_posted_events_arrive_field_by_field(settings: Settings, client: TestClient) -> None:
    batch = [
        {"user_id": "alice", "item_id": "m1", "event_type": "click", "event_id": "e-1"},
        {
            "user_id": "bob",
            "item_id": "m2",
            "event_type": "rating",
            "ts": "2024-05-01T12:00:00.5+02:00",
            "value": 4,
            "context": {"page": "home", "pos": 2, "mobile": True, "score": 0.25},
        },
        {"user_id": "ünï", "item_id": "m3", "event_type": "purchase", "ts": 1_700_000_000},
    ]
    resp = client.post("/events", json=batch)
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["accepted"] == 3 and body["event_ids"][0] == "e-1"
    ndjson = '{"user_id": "carol", "item_id": "m4", "event_type": "like", "ts": 1700000000123}\n'
    resp2 = client.post(
        "/events", content=ndjson.encode(), headers={"content-type": "application/x-ndjson"}
    )
    assert resp2.status_code == 202, resp2.text
    ids = body["event_ids"] + resp2.json()["event_ids"]

    records = consume(settings.kafka.bootstrap, settings.kafka.events_topic, 4, timeout_s=30)
    assert len(records) == 4
    got = {json.loads(r.value)["event_id"]: (r.key, json.loads(r.value)) for r in records}
    expected = [
        {"user_id": "alice", "item_id": "m1", "event_type": "click", "ts": NOW_MS,
         "value": None, "context": None},
        {"user_id": "bob", "item_id": "m2", "event_type": "rating",
         "ts": int(datetime(2024, 5, 1, 10, 0, 0, 500_000, tzinfo=UTC).timestamp() * 1000),
         "value": 4.0, "context": {"page": "home", "pos": 2, "mobile": True, "score": 0.25}},
        {"user_id": "ünï", "item_id": "m3", "event_type": "purchase", "ts": 1_700_000_000_000,
         "value": None, "context": None},
        {"user_id": "carol", "item_id": "m4", "event_type": "like", "ts": 1_700_000_000_123,
         "value": None, "context": None},
    ]  # fmt: skip
    partitions = {r.key: r.partition for r in records}
    for key, partition in partitions.items():  # Kafka's default keyed partitioning (murmur2)
        assert partition == (murmur2(key) & 0x7FFFFFFF) % settings.kafka.partitions
    for event_id, want in zip(ids, expected, strict=True):
        key, value = got[event_id]
        assert key == want["user_id"].encode()
        assert list(value) == [
            "event_id",
            "user_id",
            "item_id",
            "event_type",
            "ts",
            "value",
            "context",
        ]
        assert value == {"event_id": event_id, **want}


def test_invalid_batch_is_refused_whole(settings: Settings, client: TestClient) -> None:
    batch = [
        {"user_id": "ok", "item_id": "m1", "event_type": "click"},
        {"user_id": "", "item_id": "m1", "event_type": "click"},
        {"user_id": "u", "item_id": "m1", "event_type": "teleport", "ts": "2024-01-01T00:00:00"},
        {"user_id": "u", "item_id": "m1", "event_type": "click", "colour": "red"},
    ]
    resp = client.post("/events", json=batch)
    assert resp.status_code == 422 and resp.json()["error"] == "invalid"
    errors = [(e["index"], e["field"]) for e in resp.json()["errors"]]
    assert errors == [(1, "user_id"), (2, "event_type"), (2, "ts"), (3, "colour")]

    dup = b'{"user_id": "a", "user_id": "b", "item_id": "m", "event_type": "click"}'
    resp = client.post("/events", content=dup, headers={"content-type": "application/json"})
    assert resp.status_code == 422 and "duplicate" in resp.text

    # The valid first event was not written either: a marker posted afterwards is the only record.
    assert (
        client.post(
            "/events", json={"user_id": "m", "item_id": "x", "event_type": "click"}
        ).status_code
        == 202
    )
    records = consume(settings.kafka.bootstrap, settings.kafka.events_topic, 2, timeout_s=5)
    assert [json.loads(r.value)["user_id"] for r in records] == ["m"]

    metrics = client.get("/metrics").text
    assert 'streamrec_ingest_events_rejected_total{reason="invalid"} 5.0' in metrics
    assert "streamrec_ingest_events_accepted_total 1.0" in metrics


def test_too_large_bodies_and_batches_get_413(settings: Settings, client: TestClient) -> None:
    big = json.dumps([{"user_id": "u" * 100, "item_id": "m", "event_type": "click"}] * 150).encode()
    assert len(big) > 20_000
    resp = client.post("/events", content=big, headers={"content-type": "application/json"})
    assert resp.status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the size is counted while reading
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096]

    resp = client.post("/events", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413

    too_many = [{"user_id": "u", "item_id": "m", "event_type": "click"}] * 51
    resp = client.post("/events", json=too_many)
    assert resp.status_code == 413 and "batch limit" in resp.text

    assert consume(settings.kafka.bootstrap, settings.kafka.events_topic, 1, timeout_s=3) == []


def test_health_and_docs(client: TestClient) -> None:
    health = client.get("/health").json()
    assert health["kafka"]["producer"] == "ready"
    assert client.get("/docs").status_code == 200
    schema = client.get("/openapi.json").json()
    assert "EventIn" in schema["components"]["schemas"]


@pytest.mark.chaos
def test_broker_down_gives_503_and_retries_arrive_once(settings: Settings, tmp_path: Path) -> None:
    """A private broker (own ports and run dir) is stopped and restarted; other tests keep theirs."""
    from deploy.stack import Stack
    from stream.kafka_client import ensure_topics

    private = settings.model_copy(update={
        "stack": settings.stack.model_copy(update={"run_dir": tmp_path / "stack"}),
        "kafka": settings.kafka.model_copy(update={
            "port": free_port(), "controller_port": free_port(), "heap": "384m", "partitions": 2,
        }),
        "ingest": settings.ingest.model_copy(update={"produce_timeout_s": 3.0}),
    })  # fmt: skip
    stack = Stack(private)
    stack.start_component("kafka")
    try:
        ensure_topics(private.kafka, [private.kafka.events_topic])
        batch_a = [
            {"user_id": f"u{i}", "item_id": "m", "event_type": "click", "event_id": f"a{i}"}
            for i in range(20)
        ]
        batch_b = [
            {"user_id": f"u{i}", "item_id": "m", "event_type": "like", "event_id": f"b{i}"}
            for i in range(20)
        ]
        with TestClient(create_app(private)) as client:
            assert client.post("/events", json=batch_a).status_code == 202

            stack.stop_component("kafka")
            down = client.post("/events", json=batch_b)
            assert down.status_code == 503
            assert int(down.headers["retry-after"]) > 0
            assert client.get("/health").json()["status"] == "degraded"

            stack.start_component("kafka")

            def retry() -> bool:
                return client.post("/events", json=batch_b).status_code == 202

            wait_until(retry, timeout_s=90, what="a retried batch to be accepted", interval_s=1.0)

        records = consume(private.kafka.bootstrap, private.kafka.events_topic, 40, timeout_s=30)
        counts = Counter(json.loads(r.value)["event_id"] for r in records)
        assert set(counts) == {e["event_id"] for e in batch_a + batch_b}
        assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1]
    finally:
        stack.down()


def test_api_key_and_media_type(settings: Settings) -> None:
    from pydantic import SecretStr

    app = create_app(with_ingest(settings, api_key=SecretStr("s3cret")))
    event = {"user_id": "u", "item_id": "m", "event_type": "click"}
    with TestClient(app) as client:
        assert client.post("/events", json=event).status_code == 401
        assert client.post("/events", json=event, headers={"x-api-key": "nope"}).status_code == 401
        form = client.post(
            "/events",
            content=b"user_id=u",
            headers={"x-api-key": "s3cret", "content-type": "text/plain"},
        )
        assert form.status_code == 415
        assert (
            client.post("/events", json=event, headers={"x-api-key": "s3cret"}).status_code == 202
        )
    records = consume(settings.kafka.bootstrap, settings.kafka.events_topic, 1, timeout_s=10)
    assert len(records) == 1


def test_no_broker_at_startup_gives_fast_503(settings: Settings) -> None:
    nowhere = settings.model_copy(update={
        "kafka": settings.kafka.model_copy(update={"port": free_port()}),
        "ingest": settings.ingest.model_copy(update={"produce_timeout_s": 1.0}),
    })  # fmt: skip
    with TestClient(create_app(nowhere)) as client:
        resp = client.post("/events", json={"user_id": "u", "item_id": "m", "event_type": "click"})
        assert resp.status_code == 503 and resp.headers["retry-after"]
        assert client.get("/health").json()["status"] == "degraded"
        assert "streamrec_ingest_events_accepted_total 0.0" in client.get("/metrics").text
