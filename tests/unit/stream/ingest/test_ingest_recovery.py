"""The ingest API replaces a producer that lost records (fake producers, no Kafka).

A kafka-python idempotent producer whose in-flight batches expired during a broker crash
never sends again; the API must not keep answering 503 with it forever
(`tests/chaos/test_services_kill9.py` shows it against a real broker).
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from stream.ingest.api import create_app
from streamrec.settings import load_settings

EVENT = {"user_id": "u", "item_id": "m", "event_type": "click"}


class Future:
    def __init__(self, outcome: str) -> None:
        self.outcome = outcome

    def add_callback(self, fn: Any) -> Future:
        if self.outcome == "ack":
            fn(None)
        return self

    def add_errback(self, fn: Any) -> Future:
        if self.outcome == "fail":
            fn(RuntimeError("Expiring 1 record(s)"))
        return self


class Producer:
    """``outcome``: "ack", "fail" (errback) or "hang" (never completes)."""

    def __init__(self, outcome: str, close_raises: bool = False) -> None:
        self.outcome = outcome
        self.close_raises = close_raises
        self.closed = False
        self._sender = self  # what _close_producer force-closes
        self.forced = False

    def partitions_for(self, _topic: str) -> set[int]:
        return {0}

    def send(self, _topic: str, value: bytes, key: bytes) -> Future:
        return Future(self.outcome)

    def close(self, timeout: float | None = None) -> None:
        self.closed = True
        if self.close_raises:
            raise TimeoutError("Timeout waiting for future")

    def force_close(self) -> None:
        self.forced = True


def make_client(producers: list[Producer], timeout_s: float = 0.2) -> TestClient:
    queue = list(producers)
    settings = load_settings(ingest={"produce_timeout_s": timeout_s})
    app = create_app(settings, producer_factory=lambda _s: queue.pop(0),
                     clock_ms=lambda: 1_750_000_000_000)
    return TestClient(app)


def test_failed_records_replace_the_producer() -> None:
    broken, fresh = Producer("fail", close_raises=True), Producer("ack")
    with make_client([broken, fresh]) as client:
        assert client.post("/events", json=EVENT).status_code == 503
        assert broken.closed and broken.forced  # close() raised: the sender was forced
        assert client.post("/events", json=EVENT).status_code == 202
        assert client.get("/health").json()["kafka"]["producer"] == "ready"


def test_unacknowledged_records_replace_the_producer() -> None:
    stuck, fresh = Producer("hang"), Producer("ack")
    with make_client([stuck, fresh]) as client:
        resp = client.post("/events", json=EVENT)
        assert resp.status_code == 503 and resp.headers["retry-after"]
        assert stuck.closed
        assert client.post("/events", json=EVENT).status_code == 202


def test_shutdown_survives_a_producer_that_cannot_flush() -> None:
    stuck = Producer("hang", close_raises=True)
    with make_client([stuck]) as client:
        assert client.get("/health").status_code == 200
    assert stuck.closed and stuck.forced
