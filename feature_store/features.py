"""Feature definitions: each feature is a deterministic function of (state, event), defined once.

The Flink feature job (``stream/flink/job.py``), the replay/backfill path and serving are
thin adapters around these functions; nothing else computes a feature, so training and
serving cannot drift apart. No I/O, no clocks: the only notion of time is the event time
carried by the events (``ts_ms``, epoch milliseconds).

Per user (:func:`update_user`): history and windowed counts; per item (:func:`update_item`):
a decayed score and counts; globally (:func:`update_trending`): the top items. Late and
out-of-order events apply at their event time, duplicates change nothing, and training
samples (:func:`make_sample`) are point-in-time correct. The exact rules (windows, buckets,
dedupe horizon, trending pruning): docs/internals.md.
"""

from __future__ import annotations

import marshal
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The point-in-time sample is one of the feature definitions; it lives in its own module.
from feature_store.sample import Sample as Sample
from feature_store.sample import make_sample as make_sample
from feature_store.store import HistoryEntry, ItemFeatures, Trending, UserFeatures

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

#: Window name -> length in ms, for user counts.
USER_WINDOWS: dict[str, int] = {"1h": HOUR_MS, "24h": DAY_MS, "7d": 7 * DAY_MS}
#: Window name -> length in ms, for item counts.
ITEM_WINDOWS: dict[str, int] = {"1h": HOUR_MS, "24h": DAY_MS}
_USER_WINDOW_MS = tuple(USER_WINDOWS.values())
_USER_KEEP_MS = max(_USER_WINDOW_MS)


@dataclass(frozen=True, slots=True)
class Event:
    """A validated event, as on the ``events`` topic (wire format in docs/design.md)."""

    event_id: str
    user_id: str
    item_id: str
    event_type: str
    ts_ms: int
    value: float | None = None
    context: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class FeatureParams:
    """Knobs of the feature definitions (built from ``settings.features`` by the adapters)."""

    event_weights: Mapping[str, float]
    history_len: int = 50
    item_half_life_s: float = 3600.0
    trending_n: int = 100
    bucket_ms: int = 60_000
    dedupe_horizon_ms: int = 7 * DAY_MS
    #: Event types that enter the history whatever their weight (positives always do).
    history_types: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, features: Any, **overrides: Any) -> FeatureParams:
        """From a ``FeatureSettings`` section; keyword overrides win."""
        values: dict[str, Any] = {
            "event_weights": dict(features.event_weights),
            "history_len": features.history_len,
            "item_half_life_s": features.item_half_life_s,
            "trending_n": features.trending_n,
            "history_types": frozenset(features.history_event_types),
        }
        values.update(overrides)
        return cls(**values)

    def weight(self, event_type: str) -> float:
        return float(self.event_weights.get(event_type, 0.0))


# ---------------------------------------------------------------------------------------------
# Buckets (shared by user and item windows)
# ---------------------------------------------------------------------------------------------


def _bucket(ts_ms: int, bucket_ms: int) -> int:
    return ts_ms // bucket_ms


def window_count(buckets: Mapping[int, int], as_of_ms: int, window_ms: int, bucket_ms: int) -> int:
    """Events in the window of length ``window_ms`` ending at ``as_of_ms`` (bucket rule above)."""
    last = _bucket(as_of_ms, bucket_ms)
    first = last - max(1, window_ms // bucket_ms) + 1
    return sum(n for b, n in buckets.items() if first <= b <= last)


def window_counts(
    buckets: Mapping[int, int], as_of_ms: int, windows_ms: Sequence[int], bucket_ms: int
) -> list[int]:
    """:func:`window_count` for several windows in one pass over the buckets."""
    last = _bucket(as_of_ms, bucket_ms)
    firsts = [last - max(1, w // bucket_ms) + 1 for w in windows_ms]
    sums = [0] * len(firsts)
    for b, n in buckets.items():
        if b <= last:
            for k, first in enumerate(firsts):
                if b >= first:
                    sums[k] += n
    return sums


def _prune(buckets: dict[int, int], as_of_ms: int, keep_ms: int, bucket_ms: int) -> None:
    first = _bucket(as_of_ms, bucket_ms) - max(1, keep_ms // bucket_ms) + 1
    if buckets and min(buckets) < first:  # the common case, nothing to drop, stays in C
        for b in [b for b in buckets if b < first]:
            del buckets[b]


def is_late(event: Event, watermark_ms: int | None) -> bool:
    """True if ``event`` is behind the watermark (it is still applied; this is for metrics)."""
    return watermark_ms is not None and event.ts_ms <= watermark_ms


# ---------------------------------------------------------------------------------------------
# Users
# ---------------------------------------------------------------------------------------------


#: Forget event ids older than the dedupe horizon every this many events (keeps updates O(1)).
_SEEN_PRUNE_EVERY = 64


@dataclass(slots=True)
class UserState:
    """Everything the job keeps per user (serialisable with pickle)."""

    #: (item_id, event_type, ts_ms, event_id), most recent first (``history`` above).
    history: list[tuple[str, str, int, str]] = field(default_factory=list)
    #: event_type -> bucket index -> count.
    buckets: dict[str, dict[int, int]] = field(default_factory=dict)
    #: event_id -> ts_ms of recently applied events (dedupe).
    seen: dict[str, int] = field(default_factory=dict)
    last_seen_ms: int = -1
    as_of_ms: int = -1
    #: Number of events applied; with ``as_of_ms`` it orders the versions of the record.
    seq: int = 0


#: Tag of the packed state encoding (:func:`pack_user`, :func:`pack_item`); bump on a change.
STATE_FORMAT = 1


def pack_user(state: UserState) -> bytes:
    """``state`` as compact bytes (``marshal`` of plain tuples, lists, dicts and ints).

    The stream job keeps this in its keyed state, cheaper to write and read than pickling the
    dataclass (docs/decisions.md#feature-state-encoding). ``marshal`` (format 4, stable since
    Python 3.4) ties a checkpoint to CPython, which the job runs on anyway.
    """
    return marshal.dumps(
        (STATE_FORMAT, state.history, state.buckets, state.seen, state.last_seen_ms,
         state.as_of_ms, state.seq)
    )


def unpack_user(data: bytes) -> UserState:
    """The inverse of :func:`pack_user`."""
    fmt, history, buckets, seen, last_seen_ms, as_of_ms, seq = marshal.loads(data)
    if fmt != STATE_FORMAT:
        raise ValueError(f"unknown user state format {fmt}")
    return UserState(history, buckets, seen, last_seen_ms, as_of_ms, seq)


@dataclass(frozen=True, slots=True)
class UserOutcome:
    duplicate: bool
    sample: Sample | None


def update_user(state: UserState, event: Event, params: FeatureParams) -> UserOutcome:
    """Apply ``event`` to ``state`` in place (deterministic, no I/O) and build its sample."""
    if event.event_id in state.seen or _in_old_history(state, event.event_id, params):
        return UserOutcome(duplicate=True, sample=None)
    sample = make_sample(state, event, params.event_weights, params.history_len)

    state.seq += 1
    bucket_ms = params.bucket_ms
    moved = False  # did as_of_ms enter a newer bucket (only then can buckets fall out)?
    if event.ts_ms > state.as_of_ms:
        moved = state.as_of_ms < 0 or event.ts_ms // bucket_ms != state.as_of_ms // bucket_ms
        state.as_of_ms = event.ts_ms
    state.last_seen_ms = state.as_of_ms
    state.seen[event.event_id] = event.ts_ms

    keep_ms = _USER_KEEP_MS
    oldest_bucket = _bucket(state.as_of_ms, bucket_ms) - keep_ms // bucket_ms + 1
    bucket = _bucket(event.ts_ms, bucket_ms)
    if bucket >= oldest_bucket:
        per_type = state.buckets.get(event.event_type)
        if per_type is None:
            per_type = state.buckets[event.event_type] = {}
        per_type[bucket] = per_type.get(bucket, 0) + 1
    if params.weight(event.event_type) > 0 or event.event_type in params.history_types:
        _insert_history(state.history, event, params.history_len)

    # Every bucket is at or after oldest_bucket once an update returns, and only a newer
    # as_of bucket moves oldest_bucket: the pruning pass is needed only then.
    if moved:
        for etype in list(state.buckets):
            _prune(state.buckets[etype], state.as_of_ms, keep_ms, bucket_ms)
            if not state.buckets[etype]:
                del state.buckets[etype]
    if state.seq % _SEEN_PRUNE_EVERY == 0:
        horizon = state.as_of_ms - params.dedupe_horizon_ms
        state.seen = {eid: ts for eid, ts in state.seen.items() if ts > horizon}
    return UserOutcome(duplicate=False, sample=sample)


def _in_old_history(state: UserState, event_id: str, params: FeatureParams) -> bool:
    """Whether ``event_id`` is the id of a history entry that ``seen`` may have forgotten.

    ``seen`` holds every applied event newer than ``as_of_ms - dedupe_horizon_ms``: pruning
    keeps the ids newer than the horizon of its time, and ``as_of_ms`` never decreases. So
    only the history entries at or behind the current horizon need a look: the oldest ones,
    at the end of the (most recent first) list.
    """
    horizon = state.as_of_ms - params.dedupe_horizon_ms
    for entry in reversed(state.history):
        if entry[2] > horizon:
            return False
        if entry[3] == event_id:
            return True
    return False


def _insert_history(history: list[tuple[str, str, int, str]], event: Event, cap: int) -> None:
    entry = (event.item_id, event.event_type, event.ts_ms, event.event_id)
    pos = 0
    while pos < len(history) and history[pos][2] > event.ts_ms:
        pos += 1
    if pos >= cap:
        return
    history.insert(pos, entry)
    del history[cap:]


def user_counts(state: UserState, params: FeatureParams) -> dict[str, dict[str, int]]:
    """Window name -> event type -> count, of the windows ending at ``state.as_of_ms``
    (event types sorted; zero counts omitted)."""
    counts: dict[str, dict[str, int]] = {name: {} for name in USER_WINDOWS}
    c1h, c24h, c7d = counts.values()
    as_of, bucket_ms = state.as_of_ms, params.bucket_ms
    last = _bucket(as_of, bucket_ms)
    f1h, f24h, f7d = (last - max(1, w // bucket_ms) + 1 for w in _USER_WINDOW_MS)
    for etype in sorted(state.buckets):
        n1h = n24h = n7d = 0
        for b, n in state.buckets[etype].items():  # window_counts, unrolled for 3 windows
            if f7d <= b <= last:
                n7d += n
                if b >= f24h:
                    n24h += n
                    if b >= f1h:
                        n1h += n
        if n1h:
            c1h[etype] = n1h
        if n24h:
            c24h[etype] = n24h
        if n7d:
            c7d[etype] = n7d
    return counts


_WITHOUT_ID = operator.itemgetter(slice(0, 3))


def user_history(state: UserState) -> list[tuple[str, str, int]]:
    """``(item_id, event_type, ts_ms)`` of the user's history, most recent first."""
    return list(map(_WITHOUT_ID, state.history))


def user_features(state: UserState, user_id: str, params: FeatureParams) -> UserFeatures:
    """The user's feature record, current to ``state.as_of_ms``: :func:`user_history`,
    :func:`user_counts`, ``last_seen_ms``. (A writer may encode those parts directly.)"""
    return UserFeatures(
        user_id=user_id,
        history=tuple([HistoryEntry(i, t, ts) for i, t, ts, _ in state.history]),
        counts=user_counts(state, params),
        last_seen_ms=state.last_seen_ms,
        as_of_ms=state.as_of_ms,
    )


# ---------------------------------------------------------------------------------------------
# Items
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ItemState:
    score: float = 0.0
    as_of_ms: int = -1
    #: bucket index -> count of positive events.
    buckets: dict[int, int] = field(default_factory=dict)
    seq: int = 0


def pack_item(state: ItemState) -> bytes:
    """``state`` as compact bytes (see :func:`pack_user`)."""
    return marshal.dumps((STATE_FORMAT, state.score, state.as_of_ms, state.buckets, state.seq))


def unpack_item(data: bytes) -> ItemState:
    """The inverse of :func:`pack_item`."""
    fmt, score, as_of_ms, buckets, seq = marshal.loads(data)
    if fmt != STATE_FORMAT:
        raise ValueError(f"unknown item state format {fmt}")
    return ItemState(score, as_of_ms, buckets, seq)


def decay(score: float, from_ms: int, to_ms: int, half_life_s: float) -> float:
    """``score`` valid at ``from_ms`` seen from ``to_ms``."""
    return score * math.pow(2.0, -(to_ms - from_ms) / (half_life_s * 1000.0))


def update_item(state: ItemState, event: Event, params: FeatureParams) -> bool:
    """Apply a (deduplicated) event to the item's state in place; False if not a positive."""
    weight = params.weight(event.event_type)
    if weight <= 0:
        return False
    state.seq += 1
    if event.ts_ms >= state.as_of_ms:
        if state.as_of_ms >= 0:
            state.score = decay(state.score, state.as_of_ms, event.ts_ms, params.item_half_life_s)
        state.score += weight
        state.as_of_ms = event.ts_ms
    else:
        state.score += decay(weight, event.ts_ms, state.as_of_ms, params.item_half_life_s)
    keep_ms = max(ITEM_WINDOWS.values())
    oldest = _bucket(state.as_of_ms, params.bucket_ms) - keep_ms // params.bucket_ms + 1
    bucket = _bucket(event.ts_ms, params.bucket_ms)
    if bucket >= oldest:
        state.buckets[bucket] = state.buckets.get(bucket, 0) + 1
    _prune(state.buckets, state.as_of_ms, keep_ms, params.bucket_ms)
    return True


_ITEM_KEEP_MS = max(ITEM_WINDOWS.values())


def _range_count(buckets: Mapping[int, int], first: int, last: int) -> int:
    """Sum of the buckets ``first..last`` (inclusive): :func:`window_count` of one window,
    by looking up the window's buckets when they are fewer than the stored ones."""
    if last - first + 1 < len(buckets):
        return sum(filter(None, map(buckets.get, range(first, last + 1))))
    return sum(n for b, n in buckets.items() if first <= b <= last)


def item_features(state: ItemState, item_id: str, params: FeatureParams) -> ItemFeatures:
    """The item's record. Counts as :func:`window_count` of each window ending at
    ``as_of_ms``, computed from what :func:`update_item` keeps true of the buckets: none
    newer than ``as_of_ms`` (the newest event time), none older than the largest window
    (pruned), so the largest window holds them all (a 24 h window has up to 1,440 one-minute
    buckets; summing their values is ~10x cheaper than testing each)."""
    buckets, bucket_ms = state.buckets, params.bucket_ms
    last = _bucket(state.as_of_ms, bucket_ms)
    counts = {
        name: sum(buckets.values()) if w == _ITEM_KEEP_MS
        else _range_count(buckets, last - max(1, w // bucket_ms) + 1, last)
        for name, w in ITEM_WINDOWS.items()
    }
    return ItemFeatures(item_id=item_id, score=state.score, counts=counts, as_of_ms=state.as_of_ms)


# ---------------------------------------------------------------------------------------------
# Trending
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class TrendingState:
    #: item_id -> (score, as_of_ms) as last reported by the item.
    items: dict[str, tuple[float, int]] = field(default_factory=dict)
    as_of_ms: int = -1
    seq: int = 0


def update_trending(
    state: TrendingState, item_id: str, score: float, as_of_ms: int, params: FeatureParams
) -> None:
    """Record an item's latest (score, as_of) and keep the top ``trending_n``."""
    prev = state.items.get(item_id)
    if prev is not None and prev[1] > as_of_ms:
        return
    state.seq += 1
    state.items[item_id] = (score, as_of_ms)
    state.as_of_ms = max(state.as_of_ms, as_of_ms)
    if len(state.items) > 2 * params.trending_n:
        keep = dict(_ranked(state, params))
        state.items = {i: state.items[i] for i in list(keep)[: params.trending_n]}


def _ranked(state: TrendingState, params: FeatureParams) -> list[tuple[str, float]]:
    at = state.as_of_ms
    scored = [
        (item, decay(score, ts, at, params.item_half_life_s))
        for item, (score, ts) in state.items.items()
    ]
    scored.sort(key=lambda pair: (-pair[1], pair[0]))
    return scored


def trending(state: TrendingState, params: FeatureParams) -> Trending:
    """The top ``trending_n`` items, scores decayed to ``state.as_of_ms``, best first."""
    return Trending(items=tuple(_ranked(state, params)[: params.trending_n]), as_of_ms=state.as_of_ms)
