"""The feature job's Python stages with in-memory fakes of Flink state, timers and the store.

The stages are thin adapters; what is checked here is the adapter logic: one state read and
write per event (packed), DLQ routing (including a key the JVM extracted differently from the
parser), duplicates, samples and the rows sent on to the item stage, batched store writes,
metrics published on flush, and the trending stage fed by batches.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("pyflink")

from feature_store.features import (  # noqa: E402
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
from feature_store.redis_store import decode_user  # noqa: E402
from feature_store.settings import DEFAULT_EVENT_WEIGHTS, load_settings  # noqa: E402
from stream.cli_features import settings_json  # noqa: E402
from stream.flink_functions import (  # noqa: E402
    DLQ,
    SAMPLE,
    ItemStage,
    TrendingStage,
    UserStage,
    item_update,
    parse_item_update,
    parse_user_input,
    user_input,
)

T0 = 1_700_000_040_000


class FakeState:
    def __init__(self) -> None:
        self.by_key: dict[str, Any] = {}
        self.key = ""
        self.reads = 0
        self.writes = 0

    def value(self) -> Any:
        self.reads += 1
        return self.by_key.get(self.key)

    def update(self, value: Any) -> None:
        self.writes += 1
        self.by_key[self.key] = value


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

    def write_encoded(self, users: Any = ()) -> None:
        """Recorded as the equivalent ``write_batch``: payloads decoded with the reader's
        ``decode_user``, so a test compares them with ``user_features`` exactly."""
        users = list(users)
        self.batches.append({
            "users": [decode_user(u, str(as_of), v) for u, as_of, _, v in users],
            "user_seqs": [seq for _, _, seq, _ in users],
        })

    def close(self) -> None:
        pass


def wire(e: Event) -> str:
    return json.dumps({"event_id": e.event_id, "user_id": e.user_id, "item_id": e.item_id,
                       "event_type": e.event_type, "ts": e.ts_ms, "value": None,
                       "context": None})


def setup(stage: Any, params: FeatureParams) -> FakeState:
    """What ``open`` does, with fakes."""
    state = FakeState()
    stage.params = params
    stage.store = FakeStore()
    stage.state = state
    stage._counters, stage._counts, stage._timer_at = {}, {}, None
    return state


def user_stage(batch_size: int = 100) -> tuple[UserStage, FakeState, FeatureParams]:
    params = FeatureParams(event_weights=DEFAULT_EVENT_WEIGHTS, history_len=3)
    stage = UserStage(settings_json(load_settings()), 50, batch_size, 60_000, "ev")
    state = setup(stage, params)
    stage._types = frozenset(params.event_weights)
    stage.pending = {}
    stage._watermark = None
    for name in ("events_bad", "events_duplicate", "events_late", "events_applied",
                 "samples_emitted"):
        stage._counters[name] = FakeCounter()
        stage._counts[name] = 0
    return stage, state, params


def feed(stage: UserStage, state: FakeState, ctx: FakeCtx, key: str, raw: str,
         offset: int = 0) -> list[tuple[str, str, str, str]]:
    state.key = key
    value = user_input(key, 0, offset, raw)
    return [tuple(r) for r in stage.process_element(value, ctx)]  # type: ignore[arg-type]


def of_kind(outputs: list[tuple[str, str, str, str]], kind: str) -> list[tuple[str, str, str, str]]:
    return [o for o in outputs if o[0] == kind]


def test_user_stage_matches_the_feature_functions() -> None:
    stage, state, params = user_stage()
    ctx = FakeCtx()
    events = [
        Event("e1", "u1", "a", "click", T0),
        Event("e2", "u1", "b", "impression", T0 + 1),
        Event("e3", "u2", "a", "purchase", T0 + 2),
        Event("e4", "u1", "c", "like", T0 + 3),
    ]
    outputs = [feed(stage, state, ctx, e.user_id, wire(e)) for e in events]

    ref: dict[str, UserState] = {}
    want_samples = []
    for e in events:
        out = update_user(ref.setdefault(e.user_id, UserState()), e, params)
        if out.sample is not None:
            want_samples.append(out.sample.to_json())
    got_samples = [v for out in outputs for _, _, v, _ in of_kind(out, SAMPLE)]
    assert got_samples == want_samples
    # the impression (weight 0) emits nothing; a positive ONE row: its sample (v) and the
    # item stage's update (k = item_id, u)
    assert [len(out) for out in outputs] == [1, 0, 1, 1]
    assert [(k, u) for out in outputs for _, k, _, u in out] == [
        (e.item_id, item_update(e.item_id, e.event_type, e.ts_ms)) for e in events
        if e.event_type != "impression"
    ]
    assert parse_item_update(outputs[0][0][3]) == ("a", "click", T0)
    # one read and one write per event; the state is the packed form of the reference
    assert state.reads == 4 and state.writes == 4
    assert {k: unpack_user(v) for k, v in state.by_key.items()} == ref
    assert ctx.timers.registered == [1_050]  # one flush timer for the whole buffer

    list(stage.flush())
    (batch,) = stage.store.batches
    assert batch["users"] == [user_features(ref[u], u, params) for u in ("u1", "u2")]
    assert batch["user_seqs"] == [3, 1]
    assert stage._counters["events_applied"].count == 4
    assert stage._counters["samples_emitted"].count == 3


def test_user_stage_routes_bad_records_and_drops_duplicates() -> None:
    stage, state, _ = user_stage()
    ctx = FakeCtx()
    e = Event("e1", "u1", "a", "click", T0)
    assert len(feed(stage, state, ctx, "u1", wire(e))) == 1
    assert feed(stage, state, ctx, "u1", wire(e)) == []  # duplicate event_id
    bad = feed(stage, state, ctx, "", "not json", offset=7)
    # the JVM keyed this record by another user id than the parser reads: never applied
    other = feed(stage, state, ctx, "u9", wire(Event("e5", "u1", "b", "click", T0 + 5)), 8)
    assert [kind for kind, _, _, _ in bad + other] == [DLQ, DLQ]
    records = [json.loads(v) for _, _, v, _ in bad + other]
    assert records[0]["reason"].startswith("not JSON") and records[0]["offset"] == 7
    assert records[1]["reason"].startswith("user_id") and records[1]["offset"] == 8
    assert state.by_key.get("u9") is None and state.by_key.get("") is None
    list(stage.flush())
    assert stage._counters["events_duplicate"].count == 1
    assert stage._counters["events_bad"].count == 2


def test_user_stage_counts_late_events_against_the_last_flush_watermark() -> None:
    stage, state, _ = user_stage()
    ctx = FakeCtx()
    ctx.timers.watermark = T0 + 10
    stage._on_flush_timer(ctx)  # type: ignore[arg-type]
    feed(stage, state, ctx, "u1", wire(Event("e1", "u1", "a", "click", T0)))
    feed(stage, state, ctx, "u1", wire(Event("e2", "u1", "a", "click", T0 + 11)))
    list(stage.flush())
    assert stage._counters["events_late"].count == 1


def test_user_stage_flushes_when_the_batch_is_full() -> None:
    stage, state, _ = user_stage(batch_size=2)
    ctx = FakeCtx()
    for n in range(3):
        feed(stage, state, ctx, f"u{n}", wire(Event(f"e{n}", f"u{n}", "a", "click", T0)))
    assert [len(b["users"]) for b in stage.store.batches] == [2]
    assert list(stage.pending) == ["u2"]


def test_item_stage_and_trending_batches() -> None:
    params = FeatureParams(event_weights=DEFAULT_EVENT_WEIGHTS, trending_n=2)
    items = ItemStage(settings_json(load_settings()), 50, 100, 60_000)
    state = setup(items, params)
    items.pending = {}
    ctx = FakeCtx()
    rows = [("a", "click", T0), ("b", "purchase", T0 + 1), ("a", "like", T0 + 2)]
    for row in rows:
        state.key = row[0]
        assert list(items.process_element(item_update(*row), ctx)) == []  # type: ignore[arg-type]
    (batch,) = list(items.flush())
    ref: dict[str, ItemState] = {}
    for item, etype, ts in rows:
        update_item(ref.setdefault(item, ItemState()), Event("", "", item, etype, ts), params)
    want = {i: item_features(s, i, params) for i, s in ref.items()}
    assert batch == [(i, f.score, f.as_of_ms) for i, f in want.items()]
    assert {k: unpack_item(v) for k, v in state.by_key.items()} == ref

    tr = TrendingStage(settings_json(load_settings()), 50, 100, 60_000)
    setup(tr, params)
    tr.pending_state = None
    list(tr.process_element(batch, ctx))  # type: ignore[arg-type]
    list(tr.flush())
    (written,) = tr.store.batches
    assert [i for i, _ in written["trending"].items] == ["b", "a"]
    assert written["trending_seq"] == 2


def test_wire_values_between_the_stages_round_trip() -> None:
    raw = '{"a": "x:y\\u0000"}'
    assert parse_user_input(user_input("u:1\t", 3, 99, raw)) == ("u:1\t", 3, 99, raw)
    assert parse_user_input(user_input("", 0, 0, "")) == ("", 0, 0, "")
    assert parse_item_update(item_update("i\t1:x", "click", 5)) == ("i\t1:x", "click", 5)


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
