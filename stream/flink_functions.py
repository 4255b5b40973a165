"""PyFlink operator functions of the feature job: thin adapters around ``feature_store.features``.

Two keyed Python stages do all the per-event work (the graph is in ``stream/flink_features.py``):

* :class:`UserStage` (keyed by user_id): parse + validate the raw record (``stream/flink_parse``),
  dedupe, user features and the point-in-time sample;
* :class:`ItemStage` (keyed by item_id): decayed score and counts; each flush sends its batch of
  ``(item_id, score, as_of)`` to :class:`TrendingStage` (one key, parallelism 1) as ONE record.

The user stage has ONE output, rows ``(kind, k, v, u)`` of four strings (:data:`USER_OUTPUT`):
``kind`` :data:`SAMPLE` for a positive event (``k`` its item_id, ``v`` the ``samples`` JSON, ``u``
:func:`item_update` for the item stage) or :data:`DLQ` (``v`` the ``events.dlq`` JSON); the JVM
splits them with SQL (the Kafka sinks are SQL tables; the item rows are ``k, u`` of the sample
rows), and rows crossing the boundary are flat strings (:func:`user_input`,
:func:`item_update`). One row per positive, not a sample row and an item row: every output row
is a Python->Java conversion. Measured against side outputs for samples and DLQ records with
nested ``Row`` values: the same CPU in the user stage's thread (24.3 vs 24.8 CPU-s for 150k
events). Either would do; this one keeps every sink in SQL.

Each keyed stage keeps one ``ValueState`` per key holding the packed state
(:func:`feature_store.features.pack_user` / ``pack_item``: one read and one write per event,
~3x cheaper than pickling the dataclass). Feature records are buffered and written to Redis in
one pipelined batch when ``batch_size`` keys are pending or ``flush_ms`` after the first one (a
processing-time timer), and when the function closes; a Redis error fails the task so Flink
restarts it from the last checkpoint. Records are full snapshots written "only if newer
(as_of, seq)" (``feature_store/FORMAT.md``), so the records re-emitted after a restart rewrite
identical values and nothing is counted twice. Metric counters are added up locally and
published on flush, and the watermark (only used to count late events) is read once per flush:
both are Java calls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from pyflink.common import Row
from pyflink.common.time import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import StateTtlConfig, ValueStateDescriptor

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
from feature_store.redis_store import RedisOnlineStore, encode_user_values
from feature_store.settings import Settings
from stream.flink_parse import try_parse
from stream.gc_tuning import tune_gc
from stream.kafka_io import dlq_record

log = logging.getLogger(__name__)

#: Input of the user stage (after the JVM key): :func:`user_input` of the Kafka record.
USER_INPUT = Types.STRING()
#: Output of the user stage: (kind, key, value, item update); see :data:`SAMPLE`, :data:`DLQ`.
USER_OUTPUT = Types.ROW_NAMED(
    ["kind", "k", "v", "u"], [Types.STRING(), Types.STRING(), Types.STRING(), Types.STRING()]
)
#: Input of the item stage (after the JVM key): :func:`item_update`.
ITEM_INPUT = Types.STRING()
#: Kinds of user stage output rows: a positive event (k = item_id, v = its ``samples`` JSON,
#: u = :func:`item_update` for the item stage), a bad record (v = its ``events.dlq`` JSON).
SAMPLE, DLQ = "s", "d"
#: SQL building :func:`user_input` from the Kafka table's columns (the same format).
USER_INPUT_SQL = (
    "CONCAT(`user_key`, CHR(0), CAST(`partition` AS STRING), ':', CAST(`offset` AS STRING),"
    " ':', COALESCE(`value`, ''))"
)


def user_input(user_key: str, partition: int, offset: int, raw: str) -> str:
    """``user_key NUL partition:offset:raw`` (built by :data:`USER_INPUT_SQL` in the job)."""
    return f"{user_key}\x00{partition}:{offset}:{raw}"


def parse_user_input(value: str) -> tuple[str, int, int, str]:
    """``(user_key, partition, offset, raw)`` of a :func:`user_input` value. A key holding NUL
    splits early: it then differs from the parsed user_id, and the record goes to the DLQ."""
    key, rest = value.split("\x00", 1)
    partition, offset, raw = rest.split(":", 2)
    return key, int(partition), int(offset), raw


def item_update(item_id: str, event_type: str, ts_ms: int) -> str:
    """The ``u`` column of a :data:`SAMPLE` row: ``event_type TAB ts_ms TAB item_id``."""
    return f"{event_type}\t{ts_ms}\t{item_id}"


def parse_item_update(value: str) -> tuple[str, str, int]:
    """``(item_id, event_type, ts_ms)`` of an :func:`item_update` value."""
    event_type, ts, item_id = value.split("\t", 2)
    return item_id, event_type, int(ts)


class _Buffered(KeyedProcessFunction):
    """Shared batching of store writes and metrics (see the module docstring)."""

    def __init__(self, settings_json: str, flush_ms: int, batch_size: int, bucket_ms: int) -> None:
        self._settings_json = settings_json
        self._flush_ms = flush_ms
        self._batch_size = batch_size
        self._bucket_ms = bucket_ms
        self._timer_at: int | None = None

    def _setup(self, runtime_context: RuntimeContext, name: str, ttl_s: int = 0) -> None:
        tune_gc()
        settings = Settings(**json.loads(self._settings_json))
        self.params = FeatureParams.from_settings(settings.features, bucket_ms=self._bucket_ms)
        self.store = RedisOnlineStore(settings.redis, settings.features)
        descriptor = ValueStateDescriptor(name, Types.PICKLED_BYTE_ARRAY())
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
        self.state = runtime_context.get_state(descriptor)
        self.metrics = runtime_context.get_metrics_group()
        self._counters: dict[str, Any] = {}
        self._counts: dict[str, int] = {}
        self._timer_at = None

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

    def _schedule(self, ctx: KeyedProcessFunction.Context, pending: int) -> bool:
        """Register the flush timer if needed; True if the buffer must be flushed now."""
        if pending >= self._batch_size:
            return True
        if self._timer_at is None:
            at = ctx.timer_service().current_processing_time() + self._flush_ms
            ctx.timer_service().register_processing_time_timer(at)
            self._timer_at = at
        return False

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterator[Any]:
        self._timer_at = None
        self._on_flush_timer(ctx)
        yield from self.flush()

    def _on_flush_timer(self, ctx: KeyedProcessFunction.OnTimerContext) -> None:
        """Hook run before a timer-driven flush."""

    def flush(self) -> Iterator[Any]:  # pragma: no cover - overridden
        yield from ()

    def close(self) -> None:
        for _ in self.flush():
            pass  # outputs cannot be emitted while closing; state is in the last checkpoint
        self._publish_metrics()
        self.store.close()


class UserStage(_Buffered):
    """Keyed by user_id: parse, dedupe, user features, samples; positives on to the items."""

    def __init__(self, settings_json: str, flush_ms: int, batch_size: int, bucket_ms: int,
                 topic: str) -> None:
        super().__init__(settings_json, flush_ms, batch_size, bucket_ms)
        self._topic = topic

    def open(self, runtime_context: RuntimeContext) -> None:
        self._setup(runtime_context, "user", self._ttl("user_ttl_s"))
        self._types = frozenset(self.params.event_weights)
        self.pending: dict[str, UserState] = {}
        self._watermark: int | None = None
        for name in ("events_bad", "events_duplicate", "events_late", "events_applied",
                     "samples_emitted"):
            self._counter(name)

    def process_element(self, value: str, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        key, partition, offset, raw = parse_user_input(value)
        parsed = try_parse(raw, self._types)
        event = parsed.event
        if event is None or event.user_id != key:
            reason = parsed.reason or "user_id: the JVM read another key from this record"
            yield Row(DLQ, "", self._bad(raw, partition, offset, reason), "")
            return
        packed = self.state.value()
        state = unpack_user(packed) if packed is not None else UserState()
        outcome = update_user(state, event, self.params)
        counts = self._counts
        if outcome.duplicate:
            counts["events_duplicate"] += 1
            return
        counts["events_applied"] += 1
        if self._watermark is not None and event.ts_ms <= self._watermark:
            counts["events_late"] += 1  # late against the watermark of the last flush
        self.state.update(pack_user(state))
        self.pending[key] = state
        if outcome.sample is not None:
            counts["samples_emitted"] += 1
            update = item_update(event.item_id, event.event_type, event.ts_ms)
            yield Row(SAMPLE, event.item_id, outcome.sample.to_json(), update)
        if self._schedule(ctx, len(self.pending)):
            yield from self.flush()

    def _bad(self, raw: str, partition: int, offset: int, reason: str) -> str:
        self._counts["events_bad"] += 1
        log.warning("bad event at %s/%s@%s: %s", self._topic, partition, offset, reason)
        return dlq_record(reason, "features.parse", self._topic, partition, offset, raw).decode()

    def _on_flush_timer(self, ctx: KeyedProcessFunction.OnTimerContext) -> None:
        self._watermark = ctx.timer_service().current_watermark()

    def flush(self) -> Iterator[Any]:
        if self.pending:
            pending, self.pending = self.pending, {}
            params = self.params
            # user_features, encoded from its parts (no UserFeatures/HistoryEntry objects)
            self.store.write_encoded(users=[
                (uid, s.as_of_ms, s.seq,
                 encode_user_values(user_history(s), user_counts(s, params), s.last_seen_ms))
                for uid, s in pending.items()
            ])
        self._publish_metrics()
        yield from ()


class ItemStage(_Buffered):
    """Keyed by item_id: decayed score and counts; each flush forwards its batch of
    ``(item_id, score, as_of)`` to the trending stage as one record."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self._setup(runtime_context, "item", self._ttl("item_ttl_s"))
        self.pending: dict[str, ItemState] = {}

    def process_element(self, value: str, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        item_id, event_type, ts_ms = parse_item_update(value)
        packed = self.state.value()
        state = unpack_item(packed) if packed is not None else ItemState()
        if not update_item(state, Event("", "", item_id, event_type, ts_ms), self.params):
            return
        self.state.update(pack_item(state))
        self.pending[item_id] = state
        if self._schedule(ctx, len(self.pending)):
            yield from self.flush()

    def flush(self) -> Iterator[Any]:
        if not self.pending:
            return
        pending, self.pending = self.pending, {}
        items = [item_features(s, iid, self.params) for iid, s in pending.items()]
        self.store.write_batch(items=items, item_seqs=[s.seq for s in pending.values()])
        yield [(f.item_id, f.score, f.as_of_ms) for f in items]


class TrendingStage(_Buffered):
    """One key (parallelism 1): the global top-N by decayed score, fed batches of items."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self._setup(runtime_context, "trending")
        self.pending_state: TrendingState | None = None

    def process_element(self, batch: Any, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        state: TrendingState = self.state.value() or TrendingState()
        for item_id, score, as_of in batch:
            update_trending(state, item_id, score, as_of, self.params)
        self.state.update(state)
        self.pending_state = state
        if self._schedule(ctx, 1 if self._batch_size > 1 else 2):
            yield from self.flush()

    def flush(self) -> Iterator[Any]:
        if self.pending_state is not None:
            state, self.pending_state = self.pending_state, None
            self.store.write_batch(trending=trending(state, self.params), trending_seq=state.seq)
        yield from ()
