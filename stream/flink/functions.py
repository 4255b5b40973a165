"""PyFlink operator functions of the feature job: thin adapters around ``feature_store.features``.

Each keyed Python stage is called once per *batch*: the JVM collects a key bucket's records
over a short processing-time window and hands the stage one array (graph:
``stream/flink/job.py``). :class:`UserBatchStage` parses, dedupes, updates user features and
emits point-in-time samples, DLQ records and item updates; :class:`ItemBatchStage` keeps the
decayed item scores and feeds :class:`TrendingStage`. Batches because every JVM<->Python
crossing is a call with a conversion (``docs/decisions.md#feature-job-batches``). State is
written through to Flink at the end of every batch and Redis in one pipeline before the call
returns, so a checkpoint never precedes a write it covers. State, Redis retries and
rehydration in detail: docs/internals.md.
"""

from __future__ import annotations

import itertools
import json
import logging
import operator
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyflink.common import Row
from pyflink.common.time import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, StateTtlConfig, ValueStateDescriptor

from feature_store.features import (
    Event,
    FeatureParams,
    ItemState,
    TrendingState,
    UserState,
    item_features,
    pack_item,
    pack_user,
    trending,
    unpack_item,
    unpack_user,
    update_item,
    update_trending,
    update_user,
    user_counts,
    user_history,
)
from feature_store.store import Mark, open_store
from stream.flink.parse import try_parse
from stream.flink.rehydrate import CHECK_EVERY_S, REHYDRATE_TICK_MS, PartGuard, RetryingWrites
from stream.gc_tuning import tune_gc
from stream.kafka_client import dlq_record
from streamrec.settings import Settings

log = logging.getLogger(__name__)

#: SQL of the user stage's key: one hex digit of MD5(user_id), 16 buckets (the JVM computes
#: it before the shuffle; it spreads users over up to 16 subtasks).
USER_BUCKET_SQL = "SUBSTR(MD5(`user_key`), 1, 1)"
#: SQL building :func:`user_input` from the Kafka table's columns (the same format).
USER_INPUT_SQL = (
    "CONCAT(`user_key`, CHR(0), CAST(`partition` AS STRING), ':', CAST(`offset` AS STRING),"
    " ':', COALESCE(`value`, ''))"
)
#: Input of a batched stage (after the JVM key): the batch's records, in arrival order.
BATCH_INPUT = Types.BASIC_ARRAY(Types.STRING())
#: Output of the user stage: ``samples`` JSON, ``events.dlq`` JSON, item rows
#: (:func:`item_row`), one row per batch.
USER_BATCH_OUTPUT = Types.ROW_NAMED(
    ["samples", "dlq", "items"], [Types.BASIC_ARRAY(Types.STRING())] * 3
)
#: Output of the item stage: ``(key, batch)`` for the trending stage (one key, ``"0"``).
ITEM_BATCH_OUTPUT = Types.ROW([Types.STRING(), Types.PICKLED_BYTE_ARRAY()])
#: The item stage's key is the first character of an item row: one hex digit of crc32.
ITEM_BUCKET_BITS = 4


def user_input(user_key: str, partition: int, offset: int, raw: str) -> str:
    """``user_key NUL partition:offset:raw`` (built by :data:`USER_INPUT_SQL` in the job)."""
    return f"{user_key}\x00{partition}:{offset}:{raw}"


def parse_user_input(value: str) -> tuple[str, int, int, str]:
    """``(user_key, partition, offset, raw)`` of a :func:`user_input` value. A key holding NUL
    splits early: it then differs from the parsed user_id, and the record goes to the DLQ."""
    key, rest = value.split("\x00", 1)
    partition, offset, raw = rest.split(":", 2)
    return key, int(partition), int(offset), raw


#: Sort key of parsed :func:`user_input` values: ``(partition, offset)``, the order a batch is
#: applied in (a user's events share a partition, so this is each user's arrival order).
KAFKA_ORDER = operator.itemgetter(1, 2)


def item_bucket(item_id: str) -> str:
    """Key of the item stage for ``item_id``: deterministic in every process (not ``hash``)."""
    return "%x" % (zlib.crc32(item_id.encode()) & ((1 << ITEM_BUCKET_BITS) - 1))


def item_row(item_id: str, event_type: str, ts_ms: int) -> str:
    """An item row of the user stage's output: ``bucket event_type TAB ts_ms TAB item_id``
    (the JVM keys it by its first character, :func:`item_bucket`)."""
    return f"{item_bucket(item_id)}{event_type}\t{ts_ms}\t{item_id}"


def parse_item_row(value: str) -> tuple[str, str, int]:
    """``(item_id, event_type, ts_ms)`` of an :func:`item_row` value."""
    event_type, ts, item_id = value[1:].split("\t", 2)
    return item_id, event_type, int(ts)


class StateCache:
    """This subtask's unpacked states by id, in front of a keyed ``MapState``.

    Only this subtask writes the keys of its buckets, and every batch writes the states it
    touched through (``put_all``), so an entry equals what the ``MapState`` holds, except where
    the state's TTL expired it there (processing time since its last write): an entry older
    than ``ttl_s`` is dropped when next used. At most ``capacity`` entries; when full, the
    least recently used half goes. A new function instance (restart, restore) starts empty.
    """

    def __init__(self, capacity: int, ttl_s: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[Any, float]] = {}

    def get(self, key: str, now_s: float) -> Any:
        """The state of ``key``, or ``None`` if not cached (or expired)."""
        entry = self._entries.pop(key, None)
        if entry is None or (self.ttl_s > 0 and now_s - entry[1] > self.ttl_s):
            return None
        self._entries[key] = entry  # most recently used last
        return entry[0]

    def put_all(self, states: dict[str, Any], now_s: float) -> None:
        """Cache ``states`` as written at ``now_s``."""
        entries = self._entries
        for key, state in states.items():
            entries.pop(key, None)
            entries[key] = (state, now_s)
        if len(entries) > self.capacity:
            for key in list(itertools.islice(entries, len(entries) - self.capacity // 2)):
                del entries[key]

    def __len__(self) -> int:
        return len(self._entries)


def _ttl_descriptor(descriptor: Any, ttl_s: int) -> Any:
    if ttl_s > 0:
        # State of a key idle for the Redis TTL is dropped too (processing time, as Redis).
        # Explicit incremental cleanup: PyFlink's default background cleanup builds a
        # RocksDB filter config through a Py4J gateway, which a TaskManager does not have.
        ttl = (
            StateTtlConfig.new_builder(Time.seconds(ttl_s))
            .disable_cleanup_in_background()
            .cleanup_incrementally(10, False)
            .build()
        )
        descriptor.enable_time_to_live(ttl)
    return descriptor


class _Stage(KeyedProcessFunction):
    """What the stages share: settings, feature parameters, the store, local metric counts,
    and the store generation of each part (``stream.flink.rehydrate``)."""

    #: part -> its generation bookkeeping; None (off) until ``_generation`` runs in ``open``
    #: (the unit tests of the batch logic build stages without it).
    _guards: dict[str, PartGuard] | None = None
    _part_prefix = ""

    def __init__(self, settings_json: str, bucket_ms: int, cache_size: int = 0) -> None:
        self._settings_json = settings_json
        self._bucket_ms = bucket_ms
        self._cache_size = cache_size

    def _setup(self, runtime_context: RuntimeContext) -> None:
        tune_gc()
        settings = Settings(**json.loads(self._settings_json))
        self.params = FeatureParams.from_settings(settings.features, bucket_ms=self._bucket_ms)
        self.store = RetryingWrites(open_store(settings))
        self.metrics = runtime_context.get_metrics_group()
        self._counters: dict[str, Any] = {}
        self._counts: dict[str, int] = {}

    def _keyed_states(
        self, runtime_context: RuntimeContext, name: str, ttl_s: int, unpack: Any, new: Any
    ) -> None:
        """The stage's ``MapState`` (id -> packed state) and the cache in front of it."""
        descriptor = MapStateDescriptor(name, Types.STRING(), Types.PICKLED_BYTE_ARRAY())
        self.states = runtime_context.get_map_state(_ttl_descriptor(descriptor, ttl_s))
        self.cache = StateCache(self._cache_size, ttl_s)
        self._unpack, self._new = unpack, new

    def _touch(self, touched: dict[str, Any], key: str, now_s: float) -> Any:
        """The state of ``key``, entered in ``touched`` (the batch's states): from the batch,
        else the cache, else Flink's ``MapState`` (unpacked), else a new one."""
        state = touched.get(key)
        if state is None:
            state = self.cache.get(key, now_s)
            if state is None:
                packed = self.states.get(key)
                state = self._unpack(packed) if packed is not None else self._new()
            touched[key] = state
        return state

    def _write_back(self, touched: dict[str, Any], pack: Any, now_s: float) -> None:
        self.states.put_all({key: pack(state) for key, state in touched.items()})
        self.cache.put_all(touched, now_s)

    def _generation(self, runtime_context: RuntimeContext, part_prefix: str) -> None:
        """Count write batches per part in keyed state and check them against the store."""
        self._part_prefix = part_prefix
        self._guards = {}
        self.writes = runtime_context.get_state(ValueStateDescriptor("writes", Types.LONG()))
        self._counter("store_rehydrated")

    def _guard(self, ctx: Any) -> PartGuard | None:
        """The current key's part, or None when the generation is off."""
        if self._guards is None:
            return None
        key = ctx.get_current_key()
        part = f"{self._part_prefix}/{key if isinstance(key, str) else key[0]}"
        guard = self._guards.get(part)
        if guard is None:
            guard = self._guards[part] = PartGuard(part, self.store)
        return guard

    def _write_marked(
        self, guard: PartGuard | None, write: Callable[[Mark | None], Any], now_s: float
    ) -> None:
        """``write(mark)`` with the part's next mark (``write(None)`` when the generation is
        off); a verdict of "behind" starts the part's rehydration."""
        if guard is None:
            write(None)
            return
        writes = (self.writes.value() or 0) + 1
        self.writes.update(writes)
        guard.after_write(write(guard.mark(writes)) is not False, now_s)

    def _tend(self, guard: PartGuard | None, ctx: Any, now_s: float) -> None:
        """After a batch and on the part's timer: check the store when due, re-write one
        chunk while rehydrating, keep one timer armed."""
        if guard is None:
            return
        writes = self.writes.value() or 0
        if guard.check_due(now_s):
            guard.check(writes, now_s)
        if guard.rehydrating:
            self._counts["store_rehydrated"] += guard.step(
                self._state_keys, lambda keys: self._rewrite(keys, now_s), writes, now_s)
            self._publish_metrics()
        timers = ctx.timer_service()
        delay = REHYDRATE_TICK_MS if guard.rehydrating else int(CHECK_EVERY_S * 1000)
        at = timers.current_processing_time() + delay
        if guard.timer_at is None or at < guard.timer_at:
            timers.register_processing_time_timer(at)
            guard.timer_at = at

    def _on_check_timer(self, timestamp: int, ctx: Any) -> None:
        guard = self._guard(ctx)
        if guard is None or guard.timer_at not in (None, timestamp):
            return  # a superseded timer (an earlier one was armed since)
        guard.timer_at = None
        self._tend(guard, ctx, time.time())

    def _state_keys(self) -> Iterable[str]:
        """The ids of the current key's states (what a rehydration re-writes)."""
        return list(self.states.keys())

    def _rewrite(self, keys: list[str], now_s: float) -> int:
        """Write the records of ``keys`` from their states again; returns how many."""
        raise NotImplementedError

    def _states_of(self, keys: list[str], now_s: float) -> dict[str, Any]:
        out = {}
        for key in keys:
            state = self.cache.get(key, now_s)
            if state is None:
                packed = self.states.get(key)
                if packed is None:
                    continue  # expired since it was listed
                state = self._unpack(packed)
            out[key] = state
        return out

    def _counter(self, name: str) -> None:
        self._counters[name] = self.metrics.counter(name)
        self._counts[name] = 0

    def _publish_metrics(self) -> None:
        for name, n in self._counts.items():
            if n:
                self._counters[name].inc(n)
                self._counts[name] = 0

    def _ttl(self, field: str) -> int:
        return int(json.loads(self._settings_json)["features"][field])

    def close(self) -> None:
        self._publish_metrics()
        self.store.close()


class UserBatchStage(_Stage):
    """Keyed by a user bucket: parse, dedupe, user features, samples; positives on to the items."""

    def __init__(self, settings_json: str, bucket_ms: int, topic: str, cache_size: int) -> None:
        super().__init__(settings_json, bucket_ms, cache_size)
        self._topic = topic

    def open(self, runtime_context: RuntimeContext) -> None:
        self._setup(runtime_context)
        self._keyed_states(runtime_context, "users", self._ttl("user_ttl_s"), unpack_user, UserState)
        self._types = frozenset(self.params.event_weights)
        for name in ("events_bad", "events_duplicate", "events_late", "events_applied",
                     "samples_emitted"):
            self._counter(name)
        self._generation(runtime_context, "users")

    def process_element(self, values: list[str], ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        watermark = ctx.timer_service().current_watermark()
        params, counts, types = self.params, self._counts, self._types
        now_s = time.time()
        now_ms = int(now_s * 1000)  # the ingest future bound, on processing time
        states: dict[str, UserState] = {}
        samples: list[str] = []
        dlq: list[str] = []
        items: list[str] = []
        for key, partition, offset, raw in sorted(map(parse_user_input, values), key=KAFKA_ORDER):
            parsed = try_parse(raw, types, now_ms)
            event = parsed.event
            if event is None or event.user_id != key:
                reason = parsed.reason or "user_id: the JVM read another key from this record"
                dlq.append(self._bad(raw, partition, offset, reason))
                continue
            outcome = update_user(self._touch(states, key, now_s), event, params)
            if outcome.duplicate:
                counts["events_duplicate"] += 1
                continue
            counts["events_applied"] += 1
            if event.ts_ms <= watermark:
                counts["events_late"] += 1  # late against the watermark at the batch's start
            if outcome.sample is not None:
                samples.append(outcome.sample.to_json())
                items.append(item_row(event.item_id, event.event_type, event.ts_ms))
        counts["samples_emitted"] += len(samples)
        guard = self._guard(ctx)
        if states:
            # A batch with only duplicates rewrites unchanged states: harmless, and rare.
            self._write_back(states, pack_user, now_s)
            self._write_marked(guard, lambda mark: self._write_users(states, mark), now_s)
        self._tend(guard, ctx, now_s)
        self._publish_metrics()
        if samples or dlq:
            yield Row(samples, dlq, items)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterator[Any]:
        self._on_check_timer(timestamp, ctx)
        yield from ()

    def _write_users(self, states: dict[str, UserState], mark: Mark | None) -> bool:
        params = self.params
        # user_features as its parts (no UserFeatures/HistoryEntry objects)
        return self.store.write_user_rows(
            ((uid, s.as_of_ms, s.seq, user_history(s), user_counts(s, params), s.last_seen_ms)
             for uid, s in states.items()),
            mark=mark,
        )

    def _rewrite(self, keys: list[str], now_s: float) -> int:
        states = self._states_of(keys, now_s)
        if states:
            self._write_users(states, None)
        return len(states)

    def _bad(self, raw: str, partition: int, offset: int, reason: str) -> str:
        self._counts["events_bad"] += 1
        log.warning("bad event at %s/%s@%s: %s", self._topic, partition, offset, reason)
        return dlq_record(reason, "features.parse", self._topic, partition, offset, raw).decode()


class ItemBatchStage(_Stage):
    """Keyed by an item bucket: decayed score and counts per item; each batch's
    ``(item_id, score, as_of)`` list goes on to the trending stage as one record."""

    def __init__(self, settings_json: str, bucket_ms: int, cache_size: int) -> None:
        super().__init__(settings_json, bucket_ms, cache_size)

    def open(self, runtime_context: RuntimeContext) -> None:
        self._setup(runtime_context)
        self._keyed_states(runtime_context, "items", self._ttl("item_ttl_s"), unpack_item, ItemState)
        self._generation(runtime_context, "items")

    def process_element(self, values: list[str], ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        params, now_s = self.params, time.time()
        guard = self._guard(ctx)
        states: dict[str, ItemState] = {}
        dirty: dict[str, ItemState] = {}
        for value in values:
            item_id, event_type, ts_ms = parse_item_row(value)
            state = self._touch(states, item_id, now_s)
            if update_item(state, Event("", "", item_id, event_type, ts_ms), params):
                dirty[item_id] = state
        if not dirty:
            self._tend(guard, ctx, now_s)
            return
        self._write_back(dirty, pack_item, now_s)
        feats = [item_features(s, iid, params) for iid, s in dirty.items()]
        self._write_marked(guard, lambda mark: self.store.write_batch(
            items=feats, item_seqs=[s.seq for s in dirty.values()], mark=mark), now_s)
        self._tend(guard, ctx, now_s)
        yield Row("0", [(f.item_id, f.score, f.as_of_ms) for f in feats])

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterator[Any]:
        self._on_check_timer(timestamp, ctx)
        yield from ()

    def _rewrite(self, keys: list[str], now_s: float) -> int:
        states = self._states_of(keys, now_s)
        if states:
            self.store.write_batch(
                items=[item_features(s, iid, self.params) for iid, s in states.items()],
                item_seqs=[s.seq for s in states.values()])
        return len(states)


class TrendingStage(_Stage):
    """One key (parallelism 1): the global top-N by decayed score, fed batches of items; the
    top list is written to Redis at most every ``flush_ms`` (a processing-time timer)."""

    def __init__(self, settings_json: str, bucket_ms: int, flush_ms: int) -> None:
        super().__init__(settings_json, bucket_ms)
        self._flush_ms = flush_ms

    def open(self, runtime_context: RuntimeContext) -> None:
        self._setup(runtime_context)
        self.state = runtime_context.get_state(
            ValueStateDescriptor("trending", Types.PICKLED_BYTE_ARRAY())
        )
        self.pending_state: TrendingState | None = None
        self._timer_at: int | None = None
        self._generation(runtime_context, "trending")

    def process_element(self, batch: Any, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        state: TrendingState = self.state.value() or TrendingState()
        for item_id, score, as_of in batch:
            update_trending(state, item_id, score, as_of, self.params)
        self.state.update(state)
        self.pending_state = state
        guard = self._guard(ctx)
        if self._flush_ms <= 0:
            yield from self.flush(guard)
        elif self._timer_at is None:
            at = ctx.timer_service().current_processing_time() + self._flush_ms
            ctx.timer_service().register_processing_time_timer(at)
            self._timer_at = at
        self._tend(guard, ctx, time.time())

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterator[Any]:
        if self._guards is None or timestamp == self._timer_at:
            self._timer_at = None
            yield from self.flush(self._guard(ctx))
        self._on_check_timer(timestamp, ctx)

    def flush(self, guard: PartGuard | None = None) -> Iterator[Any]:
        """Write the pending list (with the part's mark when ``guard`` is given)."""
        if self.pending_state is not None:
            state, self.pending_state = self.pending_state, None
            top = trending(state, self.params)
            self._write_marked(guard, lambda mark: self.store.write_batch(
                trending=top, trending_seq=state.seq, mark=mark), time.time())
        yield from ()

    def _state_keys(self) -> Iterable[str]:
        return ["0"] if self.state.value() is not None else []

    def _rewrite(self, keys: list[str], now_s: float) -> int:
        state: TrendingState | None = self.state.value()
        if state is None:
            return 0
        self.store.write_batch(trending=trending(state, self.params), trending_seq=state.seq)
        return 1

    def close(self) -> None:
        for _ in self.flush():
            pass  # nothing is emitted; the state is in the last checkpoint
        super().close()
