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

import contextlib
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from feature_store.settings import Settings
from tests.support import free_port, service_env, wait_until

log = logging.getLogger(__name__)

T0_MS = 1_764_000_000_000  # event time of the first generated event (2025-11-24)
USERS = 40
ITEMS = 120
#: Every 5th event is an impression (weight 0: a feature update but no training sample).
IMPRESSION_EVERY = 5


def private_settings(root: Path, *, flink: bool = False, appendonly: bool = True) -> Settings:
    """Settings of a throwaway stack under ``root``: free ports, own topics, prefix, dirs."""
    from tests.conftest import test_stack_settings

    base = test_stack_settings()
    uid = f"c{uuid.uuid4().hex[:8]}"
    flink_ports = {"rest_port": free_port(), "rpc_port": free_port()} if flink else {}
    return base.model_copy(update={
        "stack": base.stack.model_copy(update={"run_dir": root / "stack", "ready_timeout_s": 240.0,
                                               "stop_timeout_s": 10.0}),
        "kafka": base.kafka.model_copy(update={
            "port": free_port(), "controller_port": free_port(), "heap": "384m", "partitions": 2,
            "events_topic": f"{uid}.events", "dlq_topic": f"{uid}.events.dlq",
            "samples_topic": f"{uid}.samples"}),
        "redis": base.redis.model_copy(update={"port": free_port(), "key_prefix": f"{uid}:",
                                               "appendonly": appendonly}),
        "flink": base.flink.model_copy(update={
            **flink_ports, "taskmanager_slots": 2, "checkpoint_interval_ms": 2000,
            "jobmanager_memory": "768m", "taskmanager_memory": "1280m"}),
        "ingest": base.ingest.model_copy(update={"port": free_port(), "produce_timeout_s": 3.0}),
        "serving": base.serving.model_copy(update={"port": free_port(), "poll_interval_s": 1.0}),
        "trainer": base.trainer.model_copy(update={
            "metrics_port": free_port(), "group_id": f"{uid}-trainer",
            "registry_dir": root / "models", "checkpoint_dir": root / "trainer",
            "export_every_s": 3.0, "batch_size": 64}),
    })  # fmt: skip


@dataclass
class Chaos:
    """A private stack plus the bookkeeping of every fault injected into it."""

    settings: Settings
    stack: Any  # deploy.stack.Stack
    #: (component, killed at, ready again at) in time.monotonic() seconds.
    outages: list[tuple[str, float, float]] = field(default_factory=list)

    def kill9(self, name: str) -> int:
        """SIGKILL the component's whole process group; returns the pid it killed."""
        from deploy.process import is_ours, read_pid

        record = read_pid(self.stack.pid_path(name))
        assert is_ours(record), f"{name} is not running"
        assert record is not None
        os.killpg(record.pid, signal.SIGKILL)

        def gone() -> bool:
            try:
                os.waitpid(record.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            return not is_ours(record)

        wait_until(gone, 15, f"{name} (pid {record.pid}) to die")
        return record.pid

    def kill_and_restart(self, name: str, down_s: float = 2.0) -> tuple[float, float]:
        """kill -9 ``name``, leave it down ``down_s`` under load, start it, wait until ready."""
        killed_at = time.monotonic()
        pid = self.kill9(name)
        log.info("killed %s (pid %d)", name, pid)
        time.sleep(down_s)  # the outage itself, not a wait for a condition
        self.stack.start_component(name)
        ready_at = time.monotonic()
        self.outages.append((name, killed_at, ready_at))
        return killed_at, ready_at

    def url(self, name: str) -> str:
        port = {"ingest-api": self.settings.ingest.port, "serving": self.settings.serving.port,
                "trainer": self.settings.trainer.metrics_port}[name]
        return f"http://127.0.0.1:{port}"



@contextlib.contextmanager
def private_stack(settings: Settings, components: list[str]) -> Iterator[Chaos]:
    """Start ``components`` (infra first) of a private stack; stop all of them at the end."""
    from deploy.stack import Stack

    with service_env(settings):
        stack = Stack(settings, available_commands={"ingest-api", "features", "train", "serve"})
        try:
            stack.up(components)
            yield Chaos(settings, stack)
        finally:
            stack.down()


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
