"""Fault injection: a private stack per module, steady client load, hard kills.

Nothing here touches the shared test stack's processes: each chaos module builds Settings on
free ports with its own run folder (``<tmp>/stack``) and starts what it needs with
:class:`deploy.stack.Stack`; the services read those Settings from the environment, as under
`streamrec up`. A kill is a real ``SIGKILL`` of the component's process group (``kill -9``),
never a graceful stop.

Load while faults are injected (:class:`EventLoad`, :class:`RecommendLoad`):

* events are posted in small batches with client-chosen ``event_id``s; a batch is retried
  (same ids) until it is answered 202, as a well-behaved client does, and its ids count as
  *acknowledged* only then. Ids of a batch that got any failed attempt are remembered as
  *retried*: a retry after a partial write is the one way a duplicate may reach Kafka.
* recommendations for known users are requested back to back; each answer's status, source
  and time are kept, so the test can tell "serving was down" from "serving failed".
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import Counter
from typing import Any

import httpx

from bench.harness import (  # noqa: F401 (the chaos modules import these from here)
    Chaos,
    free_port,
    private_settings,
    private_stack,
    service_env,
    wait_until,
)
from streamrec.settings import Settings

log = logging.getLogger(__name__)

T0_MS = 1_764_000_000_000  # event time of the first generated event (2025-11-24)
USERS = 40
ITEMS = 120
#: Every 5th event is an impression (weight 0: a feature update but no training sample).
IMPRESSION_EVERY = 5


def make_event(run: str, n: int) -> dict[str, Any]:
    kind = "impression" if n % IMPRESSION_EVERY == 0 else "click"
    return {"event_id": f"{run}-{n}", "user_id": f"u{n % USERS}", "item_id": f"i{(n * 7) % ITEMS}",
            "event_type": kind, "ts": T0_MS + n * 10}


class EventLoad(threading.Thread):
    """Posts batches of ``batch`` events back to back; retries a batch until it is acked."""

    def __init__(self, url: str, batch: int = 5, pause_s: float = 0.02) -> None:
        super().__init__(daemon=True, name="event-load")
        self.url = url
        self.batch = batch
        self.pause_s = pause_s
        self.run_id = uuid.uuid4().hex[:8]
        self.stop_event = threading.Event()
        self.acked: list[str] = []
        self.positives: set[str] = set()
        self.retried: set[str] = set()
        #: event_id -> time.monotonic() of the first failed attempt of its batch
        self.retried_at: dict[str, float] = {}
        self.failures: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._n = 0

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=10.0) as http:
                while not self.stop_event.is_set():
                    events = [make_event(self.run_id, self._n + i) for i in range(self.batch)]
                    self._n += self.batch
                    self._post_until_acked(http, events)
                    time.sleep(self.pause_s)  # pacing of the load generator
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _post_until_acked(self, http: httpx.Client, events: list[dict[str, Any]]) -> None:
        deadline = time.monotonic() + 300.0
        while time.monotonic() < deadline:
            try:
                resp = http.post("/events", json=events)
                if resp.status_code == 202:
                    ids = [e["event_id"] for e in events]
                    self.acked.extend(ids)
                    self.positives.update(e["event_id"] for e in events
                                          if e["event_type"] != "impression")
                    return
                self.failures[str(resp.status_code)] += 1
            except httpx.HTTPError as exc:
                self.failures[type(exc).__name__] += 1
            now = time.monotonic()
            for e in events:
                self.retried.add(e["event_id"])
                self.retried_at.setdefault(e["event_id"], now)
            time.sleep(0.2)  # client back-off before the retry
        raise AssertionError(f"batch {events[0]['event_id']} not acknowledged within 300 s")

    def acked_count(self) -> int:
        return len(self.acked)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(320)
        assert not self.is_alive(), "event load did not stop"
        if self.error is not None:
            raise self.error


class RecommendLoad(threading.Thread):
    """Requests recommendations of known users back to back."""

    def __init__(self, url: str, pause_s: float = 0.02) -> None:
        super().__init__(daemon=True, name="recommend-load")
        self.url = url
        self.pause_s = pause_s
        self.stop_event = threading.Event()
        #: (monotonic time of the request, status or -1 for a connection error, source)
        self.answers: list[tuple[float, int, str | None]] = []

    def run(self) -> None:
        n = 0
        with httpx.Client(base_url=self.url, timeout=5.0) as http:
            while not self.stop_event.is_set():
                started = time.monotonic()
                try:
                    resp = http.get("/recommend", params={"user_id": f"u{n % USERS}", "k": 10})
                    source = resp.json().get("source") if resp.status_code == 200 else None
                    self.answers.append((started, resp.status_code, source))
                except httpx.HTTPError:
                    self.answers.append((started, -1, None))
                n += 1
                time.sleep(self.pause_s)  # pacing of the load generator

    def ok_count(self) -> int:
        return sum(1 for _, status, _ in self.answers if status == 200)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(30)

    def failures_outside(self, windows: list[tuple[float, float]],
                         in_flight_s: float = 5.0) -> list[tuple[float, int]]:
        """Non-200 answers to requests that did not overlap any ``(start, end)`` window.

        A request that started up to ``in_flight_s`` (the client's timeout) before a window
        was still in flight when the process died, so its failure belongs to that outage.
        """
        return [(t, status) for t, status, _ in self.answers
                if status != 200 and not any(a - in_flight_s <= t <= b for a, b in windows)]


def per_fault(outages: list[tuple[str, float, float]], times: dict[str, float],
              ids: set[str]) -> dict[str, int]:
    """How many of ``ids`` had their first failure during each fault (until the next one)."""
    out: dict[str, int] = {}
    for i, (name, killed_at, _) in enumerate(outages):
        until = outages[i + 1][1] if i + 1 < len(outages) else float("inf")
        out[name] = sum(1 for x in ids if killed_at <= times.get(x, -1.0) < until)
    return out


def read_topic(settings: Settings, topic: str, timeout_s: float = 60.0) -> list[Any]:
    """Every record of ``topic`` from the beginning to its current end."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, enable_auto_commit=False,
                             group_id=None)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        ends = consumer.end_offsets(parts)
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for batch in consumer.poll(timeout_ms=500, max_records=50_000).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


def ids_in(records: list[Any], key: str) -> Counter[str]:
    return Counter(json.loads(r.value)[key] for r in records)


def progress(check: Any, what: str, timeout_s: float = 120.0) -> None:
    """Wait until ``check()`` is true (load made progress after a restart)."""
    wait_until(check, timeout_s, what, interval_s=0.25)
