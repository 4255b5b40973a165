"""Traffic of the guard benchmark (``bench/guard.py``): the simulator's live clicks through
ingest, shifted mixes, and regressions produced as samples onto the samples topic.

:class:`Mirror` wraps the live simulator and applies every event it yields to local user
states with the feature job's own function (``feature_store.features.update_user``), so a
regression's samples carry the histories the feature job would have given them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from feature_store.features import Event as FeatureEvent
from feature_store.features import FeatureParams, UserState, update_user
from feature_store.sample import Sample
from stream.simulate import ClickSimulator, SimConfig

log = logging.getLogger(__name__)


class Mirror:
    """The live simulator, with the feature job's user states kept beside it (module doc)."""

    def __init__(self, sim: ClickSimulator, params: FeatureParams) -> None:
        self.sim = sim
        self.params = params
        self.users: dict[str, UserState] = {}
        self.clicks = 0
        self.lock = threading.Lock()
        self._seq = 0

    def sample(self, event: dict[str, Any]) -> Sample | None:
        """Apply ``event`` to its user's state; its training sample (None: not a positive)."""
        with self.lock:
            self._seq += 1
            state = self.users.setdefault(event["user_id"], UserState())
            out = update_user(state, FeatureEvent(
                f"guard-bench-{self._seq}", event["user_id"], event["item_id"],
                event["event_type"], int(event["ts"])), self.params)
            if out.sample is not None:
                self.clicks += 1
            return out.sample

    def events(self, clock_ms: Callable[[], int]) -> Iterator[dict[str, Any]]:
        """The simulator's events (what ``stream.simulate.run`` posts), mirrored."""
        for event in self.sim.events(clock_ms):
            self.sample(event)
            yield event


class Renamed:
    """A simulator whose users (and items) carry a prefix of their own: new ids."""

    def __init__(self, sim: ClickSimulator, prefix: str, new_items: bool = False) -> None:
        self.sim, self.prefix, self.new_items = sim, prefix, new_items

    def events(self, clock_ms: Callable[[], int]) -> Iterator[dict[str, Any]]:
        for event in self.sim.events(clock_ms):
            event["user_id"] = f"{self.prefix}-{event['user_id']}"
            if self.new_items:
                event["item_id"] = f"{self.prefix}-{event['item_id']}"
            yield event


class Catalogue:
    """A new catalogue: ``users`` new users click ``items`` new items uniformly."""

    def __init__(self, prefix: str, users: int, items: int, seed: int) -> None:
        self.prefix, self.users, self.items = prefix, users, items
        self.rng = np.random.default_rng(seed)

    def events(self, clock_ms: Callable[[], int]) -> Iterator[dict[str, Any]]:
        while True:
            yield {"user_id": f"{self.prefix}-u{int(self.rng.integers(self.users))}",
                   "item_id": f"{self.prefix}-i{int(self.rng.integers(self.items))}",
                   "event_type": "click", "ts": clock_ms()}


class Bot:
    """One user clicking one item, again and again."""

    def __init__(self, user: str, item: str) -> None:
        self.user, self.item = user, item

    def events(self, clock_ms: Callable[[], int]) -> Iterator[dict[str, Any]]:
        while True:
            yield {"user_id": self.user, "item_id": self.item, "event_type": "click",
                   "ts": clock_ms()}


class Load:
    """A simulator posting to ingest at a rate, in a thread, until :meth:`stop`."""

    def __init__(self, sim: Any, ingest: str, rate: float) -> None:
        from stream.simulate import SimStats, run

        self.stats = SimStats()
        self._stop = threading.Event()

        def keep(stats: SimStats) -> None:
            self.stats = stats

        self.thread = threading.Thread(
            target=run, args=(sim, ingest, rate),
            kwargs={"should_stop": self._stop.is_set, "on_batch": keep,
                    "batch": max(1, min(200, int(rate // 10) or 1))},
            daemon=True, name="guard-bench-load")
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(60)


def poisoned(sample: Sample, rng: np.random.Generator, items: int, share: float,
             item_id: Callable[[int], str]) -> tuple[Sample, bool]:
    """With probability ``share``: ``sample`` with a uniformly random item (its history
    kept, as tests/integration/test_guard.py poisons); returns (sample, poisoned?)."""
    if rng.random() >= share:
        return sample, False
    return replace(sample, item_id=item_id(int(rng.integers(items)))), True


def broken(sample: Sample) -> tuple[Sample, bool]:
    """``sample`` with an empty history: the broken feature."""
    return replace(sample, history=()), True


class SampleLoad:
    """The live simulator's traffic produced as samples onto the samples topic (ingest
    paused), each passed through ``transform`` (returns the sample and whether it is a bad
    row), until ``rows`` bad rows went out or :meth:`stop`."""

    def __init__(self, mirror: Mirror, settings: Any, rate: float, rows: int,
                 transform: Callable[[Sample], tuple[Sample, bool]]) -> None:
        self.mirror, self.settings, self.rate, self.rows = mirror, settings, rate, rows
        self.transform = transform
        self.sent = 0
        self.bad = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name="guard-bench-samples")
        self.thread.start()

    @property
    def done(self) -> bool:
        return self.bad >= self.rows or not self.thread.is_alive()

    def _run(self) -> None:
        from stream.kafka_client import make_producer

        topic = self.settings.kafka.samples_topic
        producer = make_producer(self.settings.kafka, linger_ms=20)
        t0, events = time.monotonic(), 0
        source = self.mirror.sim.events(lambda: time.time_ns() // 1_000_000)
        try:
            while not self._stop.is_set() and self.bad < self.rows:
                event = next(source)
                events += 1
                sample = self.mirror.sample(event)
                if sample is not None:
                    sample, bad = self.transform(replace(
                        sample, sample_id=f"guard-bench-{uuid.uuid4().hex}"))
                    producer.send(topic, key=sample.user_id.encode(),
                                  value=sample.to_json().encode())
                    self.sent += 1
                    self.bad += int(bad)
                ahead = events / self.rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)  # pacing to the target rate, not waiting on a condition
            producer.flush(timeout=60)
        finally:
            producer.close()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(60)


def live_simulator(seed: int = 3) -> ClickSimulator:
    """The live traffic's simulator: the freshness bench's shape (500 users, 2,000 items)."""
    return ClickSimulator(SimConfig(users=500, items=2000, seed=seed))
