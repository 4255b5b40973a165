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

import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

from pyflink.common import Row
from pyflink.common.typeinfo import Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor

from feature_store.features import (
    Event,
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
from feature_store.store import Mark
from stream.flink.parse import try_parse
from stream.flink.rehydrate import PartGuard
from stream.flink.rows import (
    BATCH_INPUT,
    ITEM_BATCH_OUTPUT,
    ITEM_BUCKET_BITS,
    KAFKA_ORDER,
    USER_BATCH_OUTPUT,
    USER_BUCKET_SQL,
    USER_INPUT_SQL,
    item_bucket,
    item_row,
    parse_item_row,
    parse_user_input,
    user_input,
)
from stream.flink.stage import Stage, StateCache
from stream.kafka_client import dlq_record

__all__ = [
    "BATCH_INPUT",
    "ITEM_BATCH_OUTPUT",
    "ITEM_BUCKET_BITS",
    "KAFKA_ORDER",
    "USER_BATCH_OUTPUT",
    "USER_BUCKET_SQL",
    "USER_INPUT_SQL",
    "ItemBatchStage",
    "StateCache",
    "TrendingStage",
    "UserBatchStage",
    "item_bucket",
    "item_row",
    "parse_item_row",
    "parse_user_input",
    "user_input",
]

log = logging.getLogger(__name__)


class UserBatchStage(Stage):
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


class ItemBatchStage(Stage):
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


class TrendingStage(Stage):
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
