"""Click-stream simulators for demos, end-to-end tests and offline evaluation.

Rating mode (:class:`ClickSimulator`): users with slowly drifting latent tastes click items by
a multinomial-logit choice of taste times Zipf popularity, among a slate of popular
impressions, so clicks are predictable from earlier clicks and similar users, not from
popularity alone (``docs/decisions.md#simulator``). Session mode (:class:`SessionSimulator`):
anonymous short interleaved sessions that re-click, follow a sparse transition matrix from the
last click, or jump to a popular item. Both are pure (seeded numpy, time passed in).
:func:`run` posts to the ingest API at a target rate; :func:`simulated_log` and
:func:`write_ndjson` produce a log for ``streamrec replay`` / ``streamrec evaluate``. The
models in detail: docs/internals.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimConfig:
    users: int = 500
    items: int = 2_000
    dim: int = 8
    slate: int = 10
    sharpness: float = 8.0
    popularity_exponent: float = 0.8
    #: Mean number of clicks of a visit (at least one).
    clicks: float = 1.5
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
        popularity = 1.0 / np.arange(1, config.items + 1) ** config.popularity_exponent
        rng.shuffle(popularity)
        self.popularity = popularity / popularity.sum()
        self._log_pop = np.log(self.popularity)

    def user_id(self, u: int) -> str:
        return f"sim-u{u}"

    def item_id(self, i: int) -> str:
        return f"sim-i{i}"

    def choice_probs(self, u: int) -> np.ndarray:
        """Probability of each item to be user ``u``'s next click."""
        logits = self.config.sharpness * (self.item_vecs @ self.tastes[u]) + self._log_pop
        e = np.exp(logits - logits.max())
        return e / e.sum()

    def step(self, ts_ms: int) -> list[dict[str, Any]]:
        """Events of one user visit at event time ``ts_ms``: impressions, then clicks."""
        c, rng = self.config, self.rng
        u = int(rng.integers(c.users))
        n_clicks = min(1 + int(rng.poisson(max(c.clicks - 1.0, 0.0))), c.items)
        clicked = rng.choice(c.items, size=n_clicks, replace=False, p=self.choice_probs(u))
        shown = rng.choice(c.items, size=max(c.slate - n_clicks, 0), p=self.popularity)
        slate = np.unique(np.concatenate([clicked, shown]))
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


@dataclass(frozen=True)
class SessionConfig:
    items: int = 2_000
    #: Sessions open at once; each event comes from one of them, picked uniformly.
    concurrent: int = 50
    #: Clicks per session: ``min_length`` + a geometric number, capped at ``max_length``.
    min_length: int = 2
    mean_length: float = 6.0
    max_length: int = 20
    #: Successors per item in the transition matrix.
    fanout: int = 5
    #: Probability that a click repeats one of the session's earlier clicks (uniformly).
    reclick: float = 0.15
    #: Otherwise: probability of following the transition matrix (else a popular item).
    follow: float = 0.7
    #: Item popularity: ``rank ** -zipf`` over a random order of the items.
    zipf: float = 1.0
    seed: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_length <= self.mean_length <= self.max_length:
            raise ValueError("need 1 <= min_length <= mean_length <= max_length")
        if not (0 <= self.reclick <= 1 and 0 <= self.follow <= 1):
            raise ValueError("reclick and follow are probabilities")
        if self.items <= self.fanout or self.concurrent < 1:
            raise ValueError("need items > fanout and concurrent >= 1")


@dataclass
class _Session:
    user: int
    length: int
    clicks: list[int] = field(default_factory=list)


class SessionSimulator:
    """Anonymous sessions with re-clicks and strong item-to-item transitions (module doc)."""

    def __init__(self, config: SessionConfig) -> None:
        c = self.config = config
        rng = self.rng = np.random.default_rng(config.seed)
        popularity = (rng.permutation(c.items) + 1.0) ** -c.zipf
        self.popularity = popularity / popularity.sum()
        # successors[i]: fanout distinct items != i, uniformly; weights[i] sum to 1.
        self.successors = np.empty((c.items, c.fanout), np.int64)
        for i in range(c.items):
            others = rng.choice(c.items - 1, size=c.fanout, replace=False)
            self.successors[i] = others + (others >= i)
        self.weights = rng.dirichlet(np.ones(c.fanout), size=c.items)
        self._popular_cdf = np.cumsum(self.popularity)
        self._weights_cdf = np.cumsum(self.weights, axis=1)
        self._open: list[_Session] = []
        self._sessions = 0

    def user_id(self, u: int) -> str:
        return f"sess-{u}"

    def item_id(self, i: int) -> str:
        return f"sim-i{i}"

    def _new_session(self) -> _Session:
        c, rng = self.config, self.rng
        extra = c.mean_length - c.min_length
        length = c.min_length + (int(rng.geometric(1.0 / (1.0 + extra))) - 1 if extra else 0)
        self._sessions += 1
        return _Session(self._sessions - 1, min(length, c.max_length))

    def _next_item(self, session: _Session) -> int:
        c, rng = self.config, self.rng
        if session.clicks:
            if rng.random() < c.reclick:
                earlier = list(dict.fromkeys(session.clicks))
                return earlier[int(rng.integers(len(earlier)))]
            if rng.random() < c.follow:
                last = session.clicks[-1]
                k = np.searchsorted(self._weights_cdf[last], rng.random(), side="right")
                return int(self.successors[last, min(int(k), c.fanout - 1)])
        k = np.searchsorted(self._popular_cdf, rng.random(), side="right")
        return min(int(k), c.items - 1)

    def click(self, ts_ms: int) -> dict[str, Any]:
        """The next click of one of the open sessions, at event time ``ts_ms``."""
        while len(self._open) < self.config.concurrent:
            self._open.append(self._new_session())
        k = int(self.rng.integers(len(self._open)))
        session = self._open[k]
        item = self._next_item(session)
        session.clicks.append(item)
        if len(session.clicks) >= session.length:
            self._open[k] = self._new_session()
        return {
            "user_id": self.user_id(session.user),
            "item_id": self.item_id(item),
            "event_type": "click",
            "ts": ts_ms,
        }

    def events(self, clock_ms: Callable[[], int]) -> Iterator[dict[str, Any]]:
        while True:
            yield self.click(clock_ms())


class Simulator(Protocol):
    def events(self, clock_ms: Callable[[], int]) -> Iterator[dict[str, Any]]: ...


#: 2024-01-01T00:00:00Z: the default first event time of a simulated log.
LOG_START_MS = 1_704_067_200_000
MODES = ("rating", "session")


def simulated_log(
    mode: str,
    events: int,
    *,
    seed: int = 1,
    users: int = 500,
    items: int = 2_000,
    start_ms: int = LOG_START_MS,
    gap_ms: float = 1_000.0,
    impressions: bool = False,
) -> Iterator[dict[str, Any]]:
    """``events`` events of a simulator, with event times from ``start_ms``, deterministic.

    Event times advance by an exponential gap of mean ``gap_ms`` (at least 2 ms) per session
    click (session mode) or per visit (rating mode: the impressions of a visit at its time,
    its clicks 1 ms later). Rating mode yields the clicks only unless ``impressions``: every
    click follows an impression of its item, which would put the item among the user's
    earlier interactions (``streamrec evaluate --exclude rated``).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    gaps = np.random.default_rng([seed, 7])  # event times apart from the simulator's draws
    ts = start_ms
    left = events
    if mode == "session":
        sim = SessionSimulator(SessionConfig(items=items, seed=seed))
        while left > 0:
            yield sim.click(ts)
            left -= 1
            ts += max(2, round(gaps.exponential(gap_ms)))
        return
    visits = ClickSimulator(SimConfig(users=users, items=items, seed=seed))
    while left > 0:
        for event in visits.step(ts):
            if impressions or event["event_type"] != "impression":
                yield event
                left -= 1
                if left == 0:
                    return
        ts += max(2, round(gaps.exponential(gap_ms)))


def write_ndjson(path: Path, events: Iterable[dict[str, Any]]) -> int:
    """Write ``events`` one JSON object a line (the ingest schema); returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("wb") as fh:
        for event in events:
            fh.write(orjson.dumps(event) + b"\n")
            n += 1
    return n


def run(
    sim: Simulator,
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
    """POST simulated events to ``ingest_url`` at about ``rate`` events/s with
    :class:`streamrec.client.Client` (503/429 retried with the same event ids after
    ``Retry-After``); a batch refused or still unavailable after the retries is counted as
    failed and logged."""
    from streamrec.client import Client, StreamrecError

    stats = SimStats()
    source = sim.events(clock_ms)
    t0 = time.monotonic()
    with Client(ingest_url, None, api_key=api_key, timeout_s=30.0, batch_size=batch,
                retries=30) as client:
        while not should_stop() and (duration_s is None or time.monotonic() - t0 < duration_s):
            events = [next(source) for _ in range(batch)]
            try:
                stats.retries += client.send(events).retries
            except StreamrecError as exc:
                log.error("ingest refused a batch: %s", exc)
                stats.failed += len(events)
            stats.events += len(events)
            stats.clicks += sum(e["event_type"] == "click" for e in events)
            stats.batches += 1
            if on_batch:
                on_batch(stats)
            ahead = stats.events / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)  # pacing to the target rate, not waiting on a condition
    return stats
    stats.failed += len(events)
    log.error("gave up on a batch of %d events after repeated retries", len(events))
