"""Click-stream simulators for demos, end-to-end tests and offline evaluation.

Rating mode (:class:`ClickSimulator`): users with slowly drifting latent tastes click items by
a multinomial-logit choice of taste times Zipf popularity, among a slate of popular
impressions, so clicks are predictable from earlier clicks and similar users, not from
popularity alone (``docs/decisions.md#simulator``). With ``SimConfig.categories`` items also
have a category (their latent vectors lie around its centre) and tags that follow it; with
``new_item_share`` part of the catalogue arrives along the stream, never shown or clicked
before. Both off by default, which keeps every draw and event of earlier versions; the
catalogue goes to ``POST /items`` live and to a file of item records (``stream/items.py``).
Session mode (:class:`SessionSimulator`):
anonymous short interleaved sessions that re-click, follow a sparse transition matrix from the
last click, or jump to a popular item. Both are pure (seeded numpy, time passed in).
:func:`run` posts to the ingest API at a target rate; :func:`simulated_log` (or
:func:`rating_log` of a configured simulator) and :func:`write_ndjson` produce a log for
``streamrec replay`` / ``streamrec evaluate``. The models in detail: docs/internals.md.
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
    #: Item categories; 0: items have no attributes and the draws are those of a config
    #: without any of the catalogue options (the same events as before they existed).
    categories: int = 0
    #: How far an item's latent vector lies from its category's centre (length of the offset).
    category_spread: float = 0.5
    #: Tag vocabulary (with categories): each item carries 1..``max_tags`` of them.
    tags: int = 50
    max_tags: int = 4
    #: Share of the items not available at the start: introduced one by one along the stream.
    new_item_share: float = 0.0
    #: The new items arrive at evenly spaced visits over the first ``arrival_visits`` visits.
    arrival_visits: int = 20_000

    def __post_init__(self) -> None:
        if self.categories < 0 or self.tags < 1 or self.max_tags < 1 or self.arrival_visits < 1:
            raise ValueError("need categories >= 0, tags >= 1, max_tags >= 1, arrival_visits >= 1")
        if not 0.0 <= self.new_item_share < 1.0:
            raise ValueError("new_item_share must lie in [0, 1)")
        if self.category_spread < 0:
            raise ValueError("category_spread must be >= 0")

    @property
    def has_catalogue(self) -> bool:
        """True when items carry attributes or arrive along the stream."""
        return self.categories > 0 or self.new_item_share > 0


@dataclass
class SimStats:
    events: int = 0
    clicks: int = 0
    #: Catalogue items posted to ``POST /items``.
    items: int = 0
    batches: int = 0
    retries: int = 0
    failed: int = 0
    started: float = field(default_factory=time.monotonic)


class ClickSimulator:
    """Rating mode (module doc); with ``categories`` or ``new_item_share`` also a catalogue."""

    def __init__(self, config: SimConfig) -> None:
        c = self.config = config
        rng = np.random.default_rng(config.seed)
        self.rng = rng
        self.tastes = _unit(rng.normal(size=(c.users, c.dim)))
        #: Per item its category (-1: none) and tag indices; per category its centre.
        self.item_category = np.full(c.items, -1, np.int64)
        self.item_tags: list[list[int]] = [[] for _ in range(c.items)]
        if c.categories:
            self.centres = _unit(rng.normal(size=(c.categories, c.dim)))
            self.item_category = rng.integers(c.categories, size=c.items)
            offsets = rng.normal(size=(c.items, c.dim)) * (c.category_spread / np.sqrt(c.dim))
            self.item_vecs = _unit(self.centres[self.item_category] + offsets)
        else:
            self.item_vecs = _unit(rng.normal(size=(c.items, c.dim)))
        popularity = 1.0 / np.arange(1, c.items + 1) ** c.popularity_exponent
        rng.shuffle(popularity)
        self.popularity = popularity / popularity.sum()
        self._log_pop = np.log(self.popularity)
        if c.categories:
            self.item_tags = self._draw_tags(rng)
        # New items: a random share, introduced in a random order at evenly spaced visits
        # (no draw at all without them, so a config without new items keeps its events).
        n_new = round(c.new_item_share * c.items)
        arrivals = rng.permutation(c.items)[:n_new].tolist() if n_new else []
        self._arrivals: list[int] = arrivals
        self._arrival_visit = [(k + 1) * c.arrival_visits // (n_new + 1) for k in range(n_new)]
        self._next_arrival = 0
        self.available = np.ones(c.items, bool)
        self.available[arrivals] = False
        #: Event time each item became available: 0 from the start, absent while pending.
        self.introduced: dict[int, int] = dict.fromkeys(np.flatnonzero(self.available).tolist(), 0)
        self._fresh: list[int] = list(self.introduced) if c.has_catalogue else []
        self._visits = 0
        self._shown_p = self.popularity
        self._mask: np.ndarray | None = None
        if n_new:
            self._refresh_available()

    def _draw_tags(self, rng: np.random.Generator) -> list[list[int]]:
        """1..max_tags distinct tags per item, each picked with probability proportional to
        ``exp(4 <item, tag>)`` for latent tag directions: tags follow the category, and a
        little of where the item lies inside it."""
        c = self.config
        tag_vecs = _unit(rng.normal(size=(c.tags, c.dim)))
        logits = 4.0 * (self.item_vecs @ tag_vecs.T)
        weights = np.exp(logits - logits.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        counts = rng.integers(1, min(c.max_tags, c.tags) + 1, size=c.items)
        return [
            sorted(int(t) for t in rng.choice(c.tags, size=int(n), replace=False, p=w))
            for n, w in zip(counts, weights, strict=True)
        ]

    def _refresh_available(self) -> None:
        shown = np.where(self.available, self.popularity, 0.0)
        self._shown_p = shown / shown.sum()
        self._mask = np.where(self.available, 0.0, -np.inf)

    def _introduce(self, ts_ms: int) -> None:
        """Make the items whose arrival visit has come clickable from ``ts_ms`` on."""
        k = self._next_arrival
        while k < len(self._arrivals) and self._arrival_visit[k] <= self._visits:
            self.introduced[self._arrivals[k]] = ts_ms
            self._fresh.append(self._arrivals[k])
            self.available[self._arrivals[k]] = True
            k += 1
        if k > self._next_arrival:
            self._next_arrival = k
            self._refresh_available()

    def user_id(self, u: int) -> str:
        return f"sim-u{u}"

    def item_id(self, i: int) -> str:
        return f"sim-i{i}"

    def category_name(self, k: int) -> str:
        return f"cat-{k:02d}"

    def tag_name(self, t: int) -> str:
        return f"tag-{t:02d}"

    def attributes(self, i: int) -> dict[str, Any]:
        """Item ``i``'s catalogue attributes: ``category`` and ``tags`` (none without categories)."""
        if self.item_category[i] < 0:
            return {}
        return {"category": self.category_name(int(self.item_category[i])),
                "tags": [self.tag_name(t) for t in self.item_tags[i]]}

    def item_record(self, i: int) -> dict[str, Any]:
        """Item ``i`` in the wire format of ``stream/items.py`` (``ts``: its introduction)."""
        return {"item_id": self.item_id(i), "attributes": self.attributes(i),
                "ts": self.introduced[i], "deleted": False}

    def catalogue(self) -> list[dict[str, Any]]:
        """Wire records of the items introduced so far: those of the start (``ts`` 0) in id
        order, then the new ones in order of arrival (``ts``: the visit that introduced them)."""
        return [self.item_record(i) for i in self.introduced]

    def take_new_items(self) -> list[dict[str, Any]]:
        """Wire records of the items introduced since the last call (the start's on the first
        call); empty without a catalogue (:attr:`SimConfig.has_catalogue`)."""
        fresh, self._fresh = self._fresh, []
        return [self.item_record(i) for i in fresh]

    def choice_probs(self, u: int) -> np.ndarray:
        """Probability of each item to be user ``u``'s next click (0 for items not introduced)."""
        logits = self.config.sharpness * (self.item_vecs @ self.tastes[u]) + self._log_pop
        if self._mask is not None:
            logits = logits + self._mask
        e = np.exp(logits - logits.max())
        return e / e.sum()

    def step(self, ts_ms: int) -> list[dict[str, Any]]:
        """Events of one user visit at event time ``ts_ms``: impressions, then clicks. New
        items due at this visit are introduced first (at ``ts_ms``)."""
        c, rng = self.config, self.rng
        if self._next_arrival < len(self._arrivals):
            self._introduce(ts_ms)
        self._visits += 1
        u = int(rng.integers(c.users))
        n_available = c.items if self._mask is None else int(self.available.sum())
        n_clicks = min(1 + int(rng.poisson(max(c.clicks - 1.0, 0.0))), n_available)
        clicked = rng.choice(c.items, size=n_clicks, replace=False, p=self.choice_probs(u))
        shown = rng.choice(c.items, size=max(c.slate - n_clicks, 0), p=self._shown_p)
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
    if mode == "session":
        gaps = np.random.default_rng([seed, 7])  # event times apart from the simulator's draws
        ts = start_ms
        sessions = SessionSimulator(SessionConfig(items=items, seed=seed))
        for _ in range(events):
            yield sessions.click(ts)
            ts += max(2, round(gaps.exponential(gap_ms)))
        return
    sim = ClickSimulator(SimConfig(users=users, items=items, seed=seed))
    yield from rating_log(sim, events, start_ms=start_ms, gap_ms=gap_ms, impressions=impressions)


def rating_log(
    sim: ClickSimulator,
    events: int,
    *,
    start_ms: int = LOG_START_MS,
    gap_ms: float = 1_000.0,
    impressions: bool = False,
) -> Iterator[dict[str, Any]]:
    """``events`` events of a rating-mode simulator (the times of :func:`simulated_log`);
    afterwards ``sim.catalogue()`` holds the items introduced along the log."""
    gaps = np.random.default_rng([sim.config.seed, 7])
    ts = start_ms
    left = events
    while left > 0:
        for event in sim.step(ts):
            if impressions or event["event_type"] != "impression":
                yield event
                left -= 1
                if left == 0:
                    return
        ts += max(2, round(gaps.exponential(gap_ms)))


def log_visits(config: SimConfig, events: int, impressions: bool = False) -> int:
    """About how many visits a rating-mode log of ``events`` events holds (an
    ``arrival_visits`` that spreads the new items over the whole log)."""
    per_visit = config.clicks + (config.slate if impressions else 0.0)
    return max(1, round(events / per_visit))


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
    client: Any = None,
) -> SimStats:
    """POST simulated events to ``ingest_url`` at about ``rate`` events/s with
    :class:`streamrec.client.Client` (503/429 retried with the same event ids after
    ``Retry-After``); a batch refused or still unavailable after the retries is counted as
    failed and logged. A simulator with a catalogue (:meth:`ClickSimulator.take_new_items`)
    has its items posted to ``POST /items`` before the batch of events that introduced them:
    the start's catalogue first, each new item before its first click. ``client``: one to
    use instead (tests)."""
    from streamrec.client import Client

    if client is not None:
        return _run(sim, client, rate, duration_s, batch, on_batch, should_stop, clock_ms)
    with Client(ingest_url, None, api_key=api_key, timeout_s=30.0, batch_size=batch,
                retries=30) as own:
        return _run(sim, own, rate, duration_s, batch, on_batch, should_stop, clock_ms)


def _run(
    sim: Simulator,
    client: Any,
    rate: float,
    duration_s: float | None,
    batch: int,
    on_batch: Callable[[SimStats], None] | None,
    should_stop: Callable[[], bool],
    clock_ms: Callable[[], int],
) -> SimStats:
    from streamrec.client import StreamrecError

    stats = SimStats()
    source = sim.events(clock_ms)
    new_items = getattr(sim, "take_new_items", None)
    t0 = time.monotonic()
    while not should_stop() and (duration_s is None or time.monotonic() - t0 < duration_s):
        events = [next(source) for _ in range(batch)]
        items = new_items() if new_items else []
        try:
            if items:
                client.upsert_items([catalogue_input(it) for it in items])
                stats.items += len(items)
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


def catalogue_input(record: dict[str, Any]) -> dict[str, Any]:
    """A wire item record as catalogue input (a ``POST /items`` body, a line of an NDJSON
    catalogue file): without ``ts`` when it is 0, since input ``ts`` follows the event-time
    rule; a missing ``ts`` is the receive time live and 0 when read from a file."""
    return {k: v for k, v in record.items() if k != "ts" or v}
