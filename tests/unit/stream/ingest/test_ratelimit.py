"""The token bucket, alone and wired into the ingest API (fake producer, hand-driven clock)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from stream.ingest.api import create_app
from stream.ingest.ratelimit import TokenBucket
from streamrec.settings import load_settings


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class AckedFuture:
    def add_callback(self, fn: Any) -> AckedFuture:
        fn(None)
        return self

    def add_errback(self, _fn: Any) -> AckedFuture:
        return self


class AckingProducer:
    """Acknowledges every record at once (no Kafka in unit tests)."""

    def __init__(self) -> None:
        self.sent = 0

    def partitions_for(self, _topic: str) -> set[int]:
        return {0}

    def send(self, _topic: str, value: bytes, key: bytes) -> AckedFuture:
        self.sent += 1
        return AckedFuture()

    def close(self, timeout: float | None = None) -> None:
        return None


def test_bucket_admits_burst_then_refills_at_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(4.0, burst=2.0, clock=clock)
    assert [bucket.acquire() for _ in range(2)] == [0.0, 0.0]
    wait = bucket.acquire()
    assert wait == pytest.approx(0.25)
    clock.t += 0.25
    assert bucket.acquire() == 0.0
    assert bucket.acquire() > 0
    clock.t += 10.0  # refills up to the burst only
    assert [bucket.acquire() for _ in range(3)][:2] == [0.0, 0.0]
    assert TokenBucket.retry_after_s(0.01) == 1 and TokenBucket.retry_after_s(2.5) == 3


def test_zero_rate_never_limits() -> None:
    bucket = TokenBucket(0.0, clock=Clock())
    assert not bucket.enabled
    assert all(bucket.acquire() == 0.0 for _ in range(1000))
    with pytest.raises(ValueError):
        TokenBucket(-1.0)


def test_ingest_answers_429_with_retry_after_and_writes_nothing() -> None:
    clock = Clock()
    producer = AckingProducer()
    app = create_app(load_settings(), producer_factory=lambda _s: producer,
                     clock_ms=lambda: 1_750_000_000_000, rate_limit_per_s=2.0, rate_clock=clock)
    event = {"user_id": "u", "item_id": "m", "event_type": "click"}
    with TestClient(app) as client:
        assert [client.post("/events", json=event).status_code for _ in range(2)] == [202, 202]
        limited = client.post("/events", json=event)
        assert limited.status_code == 429
        assert limited.headers["retry-after"] == "1"
        assert producer.sent == 2
        clock.t += 0.5
        assert client.post("/events", json=event).status_code == 202
        metrics = client.get("/metrics").text
    assert producer.sent == 3
    assert 'streamrec_ingest_requests_total{status="429"} 1.0' in metrics


def test_ingest_without_limit_takes_a_burst() -> None:
    producer = AckingProducer()
    app = create_app(load_settings(), producer_factory=lambda _s: producer,
                     clock_ms=lambda: 1_750_000_000_000, rate_clock=Clock())
    with TestClient(app) as client:
        codes = {client.post("/events", json={"user_id": "u", "item_id": "m",
                                              "event_type": "click"}).status_code
                 for _ in range(50)}
    assert codes == {202} and producer.sent == 50
