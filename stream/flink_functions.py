"""PyFlink operator functions of the feature job: thin adapters around ``feature_store.features``.

Each keyed function keeps one state object per key (pickled in a Flink ``ValueState``, so it
is part of every checkpoint), applies the pure feature function to it, and buffers the
resulting feature records. A buffer is written to Redis in one pipelined batch when it holds
``batch_size`` keys or ``flush_ms`` after its first record (a processing-time timer), and when
the function closes; a Redis error fails the task so Flink restarts it from the last
checkpoint. Records are full snapshots written "only if newer (as_of, seq)"
(``feature_store/FORMAT.md``), so the records re-emitted after a restart rewrite identical
values and nothing is counted twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from pyflink.common.time import Time
from pyflink.common.typeinfo import Types
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import KeyedProcessFunction, OutputTag, ProcessFunction, RuntimeContext
from pyflink.datastream.state import StateTtlConfig, ValueStateDescriptor

from feature_store.features import (
    Event,
    FeatureParams,
    ItemState,
    TrendingState,
    UserState,
    is_late,
    item_features,
    trending,
    update_item,
    update_trending,
    update_user,
    user_features,
)
from feature_store.redis_store import RedisOnlineStore
from feature_store.settings import Settings
from stream.flink_parse import try_parse
from stream.kafka_io import dlq_record

log = logging.getLogger(__name__)

#: Side output of the user function: ``samples`` records (JSON strings).
SAMPLES_TAG = OutputTag("samples", Types.STRING())
#: Side output of the parser: ``events.dlq`` records (JSON strings).
DLQ_TAG = OutputTag("dlq", Types.STRING())


class EventTimestamps(TimestampAssigner):
    """Event time of a parsed :class:`Event`."""

    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return int(value.ts_ms)


class ParseEvents(ProcessFunction):
    """``Row(value, partition, offset)`` -> :class:`Event`; a bad record goes to the DLQ side
    output with its reason, partition and offset."""

    def __init__(self, event_types: list[str], topic: str) -> None:
        self._types = frozenset(event_types)
        self._topic = topic

    def open(self, runtime_context: RuntimeContext) -> None:
        self._bad = runtime_context.get_metrics_group().counter("events_bad")

    def process_element(self, row: Any, ctx: ProcessFunction.Context) -> Iterator[Any]:
        value, partition, offset = row[0], row[1], row[2]
        parsed = try_parse(value if value is not None else "", self._types)
        if parsed.event is not None:
            yield parsed.event
            return
        self._bad.inc()
        log.warning(
            "bad event at %s/%s@%s: %s", self._topic, partition, offset, parsed.reason
        )
        record = dlq_record(
            str(parsed.reason), "features.parse", self._topic, int(partition), int(offset), value
        )
        yield DLQ_TAG, record.decode()


class _Buffered(KeyedProcessFunction):
    """Shared batching of store writes (see the module docstring)."""

    def __init__(self, settings_json: str, flush_ms: int, batch_size: int, bucket_ms: int) -> None:
        self._settings_json = settings_json
        self._flush_ms = flush_ms
        self._batch_size = batch_size
        self._bucket_ms = bucket_ms
        self._timer_at: int | None = None

    def _setup(self, runtime_context: RuntimeContext, name: str, ttl_s: int = 0) -> None:
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
        self._timer_at = None

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
        yield from self.flush()

    def flush(self) -> Iterator[Any]:  # pragma: no cover - overridden
        yield from ()

    def close(self) -> None:
        for _ in self.flush():
            pass  # outputs cannot be emitted while closing; state is in the last checkpoint
        self.store.close()


class UserFeaturesFn(_Buffered):
    """Keyed by user_id: dedupe, user features, training samples; forwards positives to items."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self._setup(runtime_context, "user", self._ttl("user_ttl_s"))
        self.pending: dict[str, UserState] = {}
        self._dups = self.metrics.counter("events_duplicate")
        self._late = self.metrics.counter("events_late")
        self._applied = self.metrics.counter("events_applied")
        self._samples = self.metrics.counter("samples_emitted")

    def process_element(self, event: Event, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        state: UserState = self.state.value() or UserState()
        outcome = update_user(state, event, self.params)
        if outcome.duplicate:
            self._dups.inc()
            return
        self._applied.inc()
        if is_late(event, ctx.timer_service().current_watermark()):
            self._late.inc()
        self.state.update(state)
        self.pending[event.user_id] = state
        if outcome.sample is not None:
            self._samples.inc()
            yield SAMPLES_TAG, outcome.sample.to_json()
            yield event
        if self._schedule(ctx, len(self.pending)):
            yield from self.flush()

    def flush(self) -> Iterator[Any]:
        if self.pending:
            users = [user_features(s, uid, self.params) for uid, s in self.pending.items()]
            seqs = [s.seq for s in self.pending.values()]
            self.store.write_batch(users=users, user_seqs=seqs)
            self.pending = {}
        yield from ()


class ItemFeaturesFn(_Buffered):
    """Keyed by item_id: decayed score and counts; on flush forwards (item, score, as_of)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self._setup(runtime_context, "item", self._ttl("item_ttl_s"))
        self.pending: dict[str, ItemState] = {}

    def process_element(self, event: Event, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        state: ItemState = self.state.value() or ItemState()
        if not update_item(state, event, self.params):
            return
        self.state.update(state)
        self.pending[event.item_id] = state
        if self._schedule(ctx, len(self.pending)):
            yield from self.flush()

    def flush(self) -> Iterator[Any]:
        if not self.pending:
            return
        pending, self.pending = self.pending, {}
        items = [item_features(s, iid, self.params) for iid, s in pending.items()]
        self.store.write_batch(items=items, item_seqs=[s.seq for s in pending.values()])
        for f in items:
            yield (f.item_id, f.score, f.as_of_ms)


class TrendingFn(_Buffered):
    """One key (parallelism 1): the global top-N by decayed score."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self._setup(runtime_context, "trending")
        self.pending_state: TrendingState | None = None

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        item_id, score, as_of = value
        state: TrendingState = self.state.value() or TrendingState()
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
