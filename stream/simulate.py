"""A click-stream simulator for demos and end-to-end tests.

Users have latent tastes (unit vectors in a small space) that drift slowly; items have latent
vectors and a popularity bias. Each step picks a user, shows a slate of items (mostly popular
ones, some random) as impressions, and clicks each with probability
``sigmoid(sharpness * <taste, item> + bias)``. The model can therefore learn something real:
what a user clicks is predictable from what they clicked before and from similar users.

:class:`ClickSimulator` is pure (seeded numpy, time passed in); :func:`run` posts its events
to the ingest API at a target rate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimConfig:
    users: int = 500
    items: int = 2_000
    dim: int = 8
    slate: int = 10
    sharpness: float = 6.0
    bias: float = -3.0
    drift: float = 0.02
    seed: int = 1


@dataclass
class SimStats:
    events: int = 0
    clicks: int = 0
    batches: int = 0
    retries: int = 0
    failed: int = 0
    started: float = field(default_factory=time.monotonic)


class ClickSimulator:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        rng = np.random.default_rng(config.seed)
        self.rng = rng
        self.tastes = _unit(rng.normal(size=(config.users, config.dim)))
        self.item_vecs = _unit(rng.normal(size=(config.items, config.dim)))
        popularity = rng.zipf(1.3, size=config.items).astype(np.float64)
        self.popularity = popularity / popularity.sum()

    def user_id(self, u: int) -> str:
        return f"sim-u{u}"

    def item_id(self, i: int) -> str:
        return f"sim-i{i}"

    def click_prob(self, u: int, items: np.ndarray) -> np.ndarray:
        c = self.config
        return 1.0 / (1.0 + np.exp(-(c.sharpness * (self.item_vecs[items] @ self.tastes[u]) + c.bias)))

    def step(self, ts_ms: int) -> list[dict[str, Any]]:
        """Events of one user visit at event time ``ts_ms``: impressions, then clicks."""
        c, rng = self.config, self.rng
        u = int(rng.integers(c.users))
        n_pop = c.slate // 2
        slate = np.unique(np.concatenate([
            rng.choice(c.items, size=n_pop, p=self.popularity),
            rng.integers(c.items, size=c.slate - n_pop),
        ]))
        clicked = slate[rng.random(len(slate)) < self.click_prob(u, slate)]
        events = [self._event(u, int(i), "impression", ts_ms) for i in slate]
        events += [self._event(u, int(i), "click", ts_ms + 1) for i in clicked]
        if c.drift:
            self.tastes[u] = _unit(self.tastes[u] + c.drift * rng.normal(size=c.dim))
        return events

    def events(self, clock_ms: Callable[[], int]) -> Iterator[dict[str, Any]]:
        while True:
            yield from self.step(clock_ms())

    def _event(self, u: int, i: int, kind: str, ts_ms: int) -> dict[str, Any]:
        return {"user_id": self.user_id(u), "item_id": self.item_id(i), "event_type": kind,
                "ts": ts_ms}


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def run(
    sim: ClickSimulator,
    ingest_url: str,
    rate: float,
    *,
    duration_s: float | None = None,
    batch: int = 200,
    api_key: str | None = None,
    clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    on_batch: Callable[[SimStats], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> SimStats:
    """POST simulated events to ``ingest_url`` at about ``rate`` events/s.

    A 503 (Kafka unavailable) is retried with the same events after ``Retry-After``; any
    other error answer is counted as failed and logged.
    """
    import httpx

    stats = SimStats()
    headers = {"content-type": "application/json"}
    if api_key:
        headers["x-api-key"] = api_key
    source = sim.events(clock_ms)
    t0 = time.monotonic()
    with httpx.Client(timeout=30.0, headers=headers) as client:
        while not should_stop() and (duration_s is None or time.monotonic() - t0 < duration_s):
            events = [next(source) for _ in range(batch)]
            _post(client, f"{ingest_url}/events", events, stats)
            stats.events += len(events)
            stats.clicks += sum(e["event_type"] == "click" for e in events)
            stats.batches += 1
            if on_batch:
                on_batch(stats)
            ahead = stats.events / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)  # pacing to the target rate, not waiting on a condition
    return stats


def _post(client: Any, url: str, events: list[dict[str, Any]], stats: SimStats) -> None:
    import httpx

    for _attempt in range(30):
        try:
            resp = client.post(url, json=events)
        except httpx.HTTPError as exc:
            log.warning("ingest unreachable (%s); retrying", exc)
            stats.retries += 1
            time.sleep(1.0)
            continue
        if resp.status_code == 202:
            return
        if resp.status_code == 503:
            stats.retries += 1
            time.sleep(float(resp.headers.get("retry-after", "1")))
            continue
        log.error("ingest refused a batch: %s %s", resp.status_code, resp.text[:300])
        stats.failed += len(events)
        return
    stats.failed += len(events)
    log.error("gave up on a batch of %d events after repeated retries", len(events))
