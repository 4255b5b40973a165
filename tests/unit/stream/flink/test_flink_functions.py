"""The feature job's Python stages with in-memory fakes of Flink state, timers and the store.

The stages are thin adapters; what is checked here is the adapter logic: a batch applied in
Kafka order, each user's state read once per batch and the touched states written back with
one ``put_all`` (packed), the state cache in front of the ``MapState``, DLQ routing (including
a key the JVM extracted differently from the parser), duplicates, samples and the item rows
sent on, one store write per batch, metrics published per batch, and the trending stage fed
by the item batches.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("pyflink")

from feature_store.features import (
    Event,
    FeatureParams,
    ItemState,
    UserState,
    item_features,
    pack_item,
    pack_user,
    unpack_item,
    unpack_user,
    update_item,
    update_user,
    user_features,
    window_count,
    window_counts,
)
from feature_store.redis_store import decode_user, encode_user_values
from stream.cli.features import settings_json
from stream.flink.functions import (
    KAFKA_ORDER,
    ItemBatchStage,
    StateCache,
    TrendingStage,
    UserBatchStage,
    item_bucket,
    item_row,
    parse_item_row,
    parse_user_input,
    user_input,
)
from streamrec.settings import DEFAULT_EVENT_WEIGHTS, load_settings

T0 = 1_700_000_040_000


class FakeState:
    """A ``ValueState`` (the trending stage's)."""

    def __init__(self) -> None:
        self.value_: Any = None
        self.writes = 0

    def value(self) -> Any:
        return self.value_

    def update(self, value: Any) -> None:
        self.writes += 1
        self.value_ = value


class FakeMapState:
    """A keyed ``MapState``: entries of the current (bucket) key; counts the Java calls."""

    def __init__(self) -> None:
        self.by_key: dict[str, dict[str, Any]] = {}
        self.key = "0"
        self.gets = 0
        self.put_alls = 0

    def get(self, k: str) -> Any:
        self.gets += 1
        return self.by_key.get(self.key, {}).get(k)

    def put_all(self, entries: dict[str, Any]) -> None:
        self.put_alls += 1
        self.by_key.setdefault(self.key, {}).update(entries)

    def all(self) -> dict[str, Any]:
        return {k: v for entries in self.by_key.values() for k, v in entries.items()}


class FakeCounter:
    def __init__(self) -> None:
        self.count = 0

    def inc(self, n: int = 1) -> None:
        self.count += n


class FakeTimers:
    def __init__(self) -> None:
        self.registered: list[int] = []
        self.watermark = -1

    def current_processing_time(self) -> int:
        return 1_000

    def register_processing_time_timer(self, at: int) -> None:
        self.registered.append(at)

    def current_watermark(self) -> int:
        return self.watermark


class FakeCtx:
    def __init__(self) -> None:
        self.timers = FakeTimers()

    def timer_service(self) -> FakeTimers:
        return self.timers


class FakeStore:
    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []

    def write_batch(self, **kw: Any) -> None:
        self.batches.append(kw)

    def write_user_rows(self, rows: Any, mark: Any = None) -> None:
        """Recorded as the equivalent ``write_batch``: each row encoded and decoded as the
        Redis backend does, so a test compares them with ``user_features`` exactly."""
        rows = list(rows)
        self.batches.append({
            "users": [decode_user(u, str(as_of), encode_user_values(h, c, ls))
                      for u, as_of, _, h, c, ls in rows],
            "user_seqs": [seq for _, _, seq, *_ in rows],
        })

    def close(self) -> None:
        pass


def wire(e: Event) -> str:
    return json.dumps({"event_id": e.event_id, "user_id": e.user_id, "item_id": e.item_id,
                       "event_type": e.event_type, "ts": e.ts_ms, "value": None,
                       "context": None})


def setup(stage: Any, params: FeatureParams) -> None:
    """What ``open`` does, with fakes."""
    stage.params = params
    stage.store = FakeStore()
    stage._counters, stage._counts = {}, {}


def user_stage(cache_size: int = 100) -> tuple[UserBatchStage, FakeMapState, FeatureParams]:
    params = FeatureParams(event_weights=DEFAULT_EVENT_WEIGHTS, history_len=3)
    stage = UserBatchStage(settings_json(load_settings()), 60_000, "ev", cache_size)
    setup(stage, params)
    stage.states = FakeMapState()
    stage.cache = StateCache(cache_size, 0)
    stage._unpack, stage._new = unpack_user, UserState
    stage._types = frozenset(params.event_weights)
    for name in ("events_bad", "events_duplicate", "events_late", "events_applied",
                 "samples_emitted"):
        stage._counters[name] = FakeCounter()
        stage._counts[name] = 0
    return stage, stage.states, params


def feed(stage: UserBatchStage, ctx: FakeCtx, records: list[tuple[str, str, int]],
         partition: int = 0) -> tuple[list[str], list[str], list[str]]:
    """One batch of ``(jvm_key, raw, offset)``: the (samples, dlq, items) it returns."""
    values = [user_input(key, partition, offset, raw) for key, raw, offset in records]
    rows = [tuple(r) for r in stage.process_element(values, ctx)]  # type: ignore[arg-type]
    assert len(rows) <= 1  # at most one output row per batch
    return rows[0] if rows else ([], [], [])  # type: ignore[return-value]


def test_user_stage_matches_the_feature_functions() -> None:
    stage, state, params = user_stage()
    ctx = FakeCtx()
    events = [
        Event("e1", "u1", "a", "click", T0),
        Event("e2", "u1", "b", "impression", T0 + 1),
        Event("e3", "u2", "a", "purchase", T0 + 2),
        Event("e4", "u1", "c", "like", T0 + 3),
    ]
    # The batch arrives out of Kafka order: it is applied in (partition, offset) order.
    records = [(e.user_id, wire(e), n) for n, e in enumerate(events)]
    samples, dlq, items = feed(stage, ctx, [records[2], records[0], records[3], records[1]])

    ref: dict[str, UserState] = {}
    want_samples = []
    for e in events:
        out = update_user(ref.setdefault(e.user_id, UserState()), e, params)
        if out.sample is not None:
            want_samples.append(out.sample.to_json())
    assert samples == want_samples and dlq == []
    # the impression (weight 0) emits nothing; each positive one item row
    assert items == [item_row(e.item_id, e.event_type, e.ts_ms) for e in events
                     if e.event_type != "impression"]
    assert parse_item_row(items[0]) == ("a", "click", T0)
    assert items[0][0] == item_bucket("a")
    # each user's state read once, all written back with one put_all, packed
    assert state.gets == 2 and state.put_alls == 1
    assert {k: unpack_user(v) for k, v in state.all().items()} == ref
    # one store write per batch, current to the batch's end
    (batch,) = stage.store.batches
    assert batch["users"] == [user_features(ref[u], u, params) for u in ("u1", "u2")]
    assert batch["user_seqs"] == [3, 1]
    assert stage._counters["events_applied"].count == 4
    assert stage._counters["samples_emitted"].count == 3


def test_user_stage_reads_state_once_per_subtask_through_the_cache() -> None:
    stage, state, params = user_stage()
    ctx = FakeCtx()
    feed(stage, ctx, [("u1", wire(Event("e1", "u1", "a", "click", T0)), 0)])
    feed(stage, ctx, [("u1", wire(Event("e2", "u1", "b", "click", T0 + 1)), 1)])
    assert state.gets == 1 and state.put_alls == 2  # the second batch hit the cache
    # A new instance (a restart) reads the written state back: nothing is lost.
    again, _, _ = user_stage()
    again.states = state
    feed(again, ctx, [("u1", wire(Event("e3", "u1", "c", "click", T0 + 2)), 2)])
    assert state.gets == 2
    ref = UserState()
    for n, item in enumerate("abc"):
        update_user(ref, Event(f"e{n + 1}", "u1", item, "click", T0 + n), params)
    assert unpack_user(state.all()["u1"]) == ref


def test_user_stage_routes_bad_records_and_drops_duplicates() -> None:
    stage, state, _ = user_stage()
    ctx = FakeCtx()
    e = Event("e1", "u1", "a", "click", T0)
    assert len(feed(stage, ctx, [("u1", wire(e), 0)])[0]) == 1
    # a duplicate event_id (in a later batch and within one), a broken record, and a record
    # the JVM keyed by another user id than the parser reads: never applied
    other = wire(Event("e5", "u1", "b", "click", T0 + 5))
    samples, dlq, items = feed(
        stage, ctx, [("u1", wire(e), 1), ("", "not json", 7), ("u9", other, 8), ("u1", wire(e), 9)]
    )
    assert samples == [] and items == []
    records = [json.loads(v) for v in dlq]
    assert records[0]["reason"].startswith("not JSON") and records[0]["offset"] == 7
    assert records[1]["reason"].startswith("user_id") and records[1]["offset"] == 8
    assert set(state.all()) == {"u1"}
    assert stage._counters["events_duplicate"].count == 2
    assert stage._counters["events_bad"].count == 2


def test_user_stage_counts_late_events_against_the_batch_watermark() -> None:
    stage, _, _ = user_stage()
    ctx = FakeCtx()
    ctx.timers.watermark = T0 + 10
    feed(stage, ctx, [("u1", wire(Event("e1", "u1", "a", "click", T0)), 0),
                      ("u1", wire(Event("e2", "u1", "a", "click", T0 + 11)), 1)])
    assert stage._counters["events_late"].count == 1


def test_item_stage_and_trending_batches() -> None:
    params = FeatureParams(event_weights=DEFAULT_EVENT_WEIGHTS, trending_n=2)
    items = ItemBatchStage(settings_json(load_settings()), 60_000, 100)
    setup(items, params)
    items.states = state = FakeMapState()
    items.cache = StateCache(100, 0)
    items._unpack, items._new = unpack_item, ItemState
    ctx = FakeCtx()
    rows = [("a", "click", T0), ("b", "purchase", T0 + 1), ("a", "like", T0 + 2)]
    ((key, batch),) = [tuple(r) for r in items.process_element(  # type: ignore[arg-type]
        [item_row(*row) for row in rows], ctx)]
    ref: dict[str, ItemState] = {}
    for item, etype, ts in rows:
        update_item(ref.setdefault(item, ItemState()), Event("", "", item, etype, ts), params)
    want = {i: item_features(s, i, params) for i, s in ref.items()}
    assert key == "0"
    assert batch == [(i, f.score, f.as_of_ms) for i, f in want.items()]
    assert {k: unpack_item(v) for k, v in state.all().items()} == ref
    assert state.gets == 2 and state.put_alls == 1
    (written,) = items.store.batches
    assert written["items"] == list(want.values())
    # an impression is no positive: nothing changes, nothing is written or sent on
    assert list(items.process_element([item_row("a", "impression", T0 + 3)], ctx)) == []

    tr = TrendingStage(settings_json(load_settings()), 60_000, 50)
    setup(tr, params)
    tr.state, tr.pending_state, tr._timer_at = FakeState(), None, None
    list(tr.process_element(batch, ctx))  # type: ignore[arg-type]
    assert ctx.timers.registered == [1_050] and tr.store.batches == []
    list(tr.on_timer(1_050, ctx))  # type: ignore[arg-type]
    (written,) = tr.store.batches
    assert [i for i, _ in written["trending"].items] == ["b", "a"]
    assert written["trending_seq"] == 2


def test_state_cache_is_bounded_and_honours_the_ttl() -> None:
    cache = StateCache(capacity=4, ttl_s=10)
    cache.put_all({f"k{n}": n for n in range(4)}, now_s=100.0)
    assert cache.get("k0", 105.0) == 0  # k0 is now the most recently used
    cache.put_all({"k4": 4}, now_s=106.0)  # over capacity: the least recently used half goes
    assert len(cache) == 2 and cache.get("k1", 106.0) is None
    assert cache.get("k0", 106.0) == 0 and cache.get("k4", 106.0) == 4
    assert cache.get("k4", 116.5) is None  # written at 106, TTL 10 s: expired in Flink too
    with pytest.raises(ValueError):
        StateCache(0, 0)


def test_wire_values_between_the_stages_round_trip() -> None:
    raw = '{"a": "x:y\\u0000"}'
    assert parse_user_input(user_input("u:1\t", 3, 99, raw)) == ("u:1\t", 3, 99, raw)
    assert parse_user_input(user_input("", 0, 0, "")) == ("", 0, 0, "")
    assert KAFKA_ORDER(parse_user_input(user_input("u:1", 3, 99, raw))) == (3, 99)
    assert parse_item_row(item_row("i\t1:x", "click", 5)) == ("i\t1:x", "click", 5)
    assert {item_bucket(f"i{n}") for n in range(200)} == set("0123456789abcdef")


def test_packed_states_round_trip() -> None:
    params = FeatureParams(event_weights=DEFAULT_EVENT_WEIGHTS, bucket_ms=1_000)
    user, item = UserState(), ItemState()
    for n in range(80):
        e = Event(f"e{n}", "u", f"i{n % 7}", ("click", "impression", "like")[n % 3],
                  T0 + n * 997 - (3_000 if n % 5 == 0 else 0))
        update_user(user, e, params)
        update_item(item, e, params)
    assert unpack_user(pack_user(user)) == user
    assert unpack_item(pack_item(item)) == item
    with pytest.raises(ValueError):
        unpack_user(pack_item(item))


def test_window_counts_equals_window_count_per_window() -> None:
    buckets = {b: b % 5 + 1 for b in range(-10, 200, 3)}
    windows = (1, 7, 60, 1_000)
    for as_of in (0, 50_000, 120_000, 400_000):
        want = [window_count(buckets, as_of, w * 1_000, 1_000) for w in windows]
        got = window_counts(buckets, as_of, [w * 1_000 for w in windows], 1_000)
        assert got == want
