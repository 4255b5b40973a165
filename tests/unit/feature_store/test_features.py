"""Feature functions against hand-computed expectations."""

from __future__ import annotations

import math

import pytest

from feature_store.features import (
    DAY_MS,
    HOUR_MS,
    Event,
    FeatureParams,
    ItemState,
    TrendingState,
    UserState,
    is_late,
    item_features,
    make_sample,
    trending,
    update_item,
    update_trending,
    update_user,
    user_features,
)
from feature_store.store import HistoryEntry
from streamrec.settings import DEFAULT_EVENT_WEIGHTS, FeatureSettings

T0 = 1_700_000_040_000  # a whole minute (divisible by 60_000)
MIN = 60_000


def params(**kw: object) -> FeatureParams:
    base: dict[str, object] = {"event_weights": DEFAULT_EVENT_WEIGHTS, "history_len": 3}
    base.update(kw)
    return FeatureParams(**base)  # type: ignore[arg-type]


def ev(eid: str, item: str, etype: str, ts: int, user: str = "u1") -> Event:
    return Event(event_id=eid, user_id=user, item_id=item, event_type=etype, ts_ms=ts)


def apply_all(events: list[Event], p: FeatureParams) -> tuple[UserState, list[object]]:
    state = UserState()
    outcomes = [update_user(state, e, p) for e in events]
    return state, outcomes


def test_params_from_settings() -> None:
    p = FeatureParams.from_settings(FeatureSettings(), bucket_ms=1)
    assert p.history_len == 50 and p.bucket_ms == 1 and p.weight("purchase") == 5.0
    assert p.weight("unknown") == 0.0
    assert p.history_types == frozenset({"rating"})


def test_history_keeps_interactions_of_history_types_whatever_their_weight() -> None:
    # a MovieLens replay: ratings below the like threshold are "rating" events of weight 0
    weights = {"like": 2.0, "rating": 0.0, "impression": 0.0}
    p = params(event_weights=weights, history_types=frozenset({"rating"}))
    events = [
        ev("e1", "a", "like", T0),
        ev("e2", "b", "rating", T0 + 1),  # weight 0 but an interaction: in the history
        ev("e3", "c", "impression", T0 + 2),  # weight 0, not a history type: counted only
        ev("e4", "d", "like", T0 + 3),
    ]
    state, outcomes = apply_all(events, p)
    assert [h.item_id for h in user_features(state, "u1", p).history] == ["d", "b", "a"]
    samples = [o.sample for o in outcomes]  # type: ignore[attr-defined]
    assert samples[1] is None and samples[2] is None  # not positives: no sample
    assert samples[3] is not None and samples[3].history == ("b", "a")
    # without the history type the rating is only counted
    state, outcomes = apply_all(events, params(event_weights=weights))
    assert [h.item_id for h in user_features(state, "u1", params()).history] == ["d", "a"]


def test_history_most_recent_first_positives_only_capped() -> None:
    p = params()
    events = [
        ev("e1", "a", "click", T0),
        ev("e2", "b", "impression", T0 + 1),  # weight 0: counted, not in history
        ev("e3", "c", "like", T0 + 2),
        ev("e4", "d", "purchase", T0 + 3),
        ev("e5", "e", "click", T0 + 4),
    ]
    state, _ = apply_all(events, p)
    f = user_features(state, "u1", p)
    assert f.history == (
        HistoryEntry("e", "click", T0 + 4),
        HistoryEntry("d", "purchase", T0 + 3),
        HistoryEntry("c", "like", T0 + 2),
    )
    assert f.last_seen_ms == T0 + 4 and f.as_of_ms == T0 + 4
    assert f.counts["1h"] == {"click": 2, "impression": 1, "like": 1, "purchase": 1}


def test_window_boundaries_exact_buckets() -> None:
    p = params(bucket_ms=1)
    now = T0 + 10 * DAY_MS
    events = [
        ev("old", "a", "click", now - 7 * DAY_MS),  # exactly 7d before: outside (as_of - W, as_of]
        ev("d7", "a", "click", now - 7 * DAY_MS + 1),  # inside 7d only
        ev("h24", "a", "click", now - DAY_MS),  # outside 24h, inside 7d
        ev("in24", "a", "click", now - DAY_MS + 1),  # inside 24h
        ev("h1", "a", "like", now - HOUR_MS),  # outside 1h
        ev("in1", "a", "like", now - HOUR_MS + 1),  # inside 1h
        ev("now", "b", "purchase", now),
    ]
    state, _ = apply_all(events, p)
    f = user_features(state, "u1", p)
    assert f.counts["7d"] == {"click": 3, "like": 2, "purchase": 1}
    assert f.counts["24h"] == {"click": 1, "like": 2, "purchase": 1}
    assert f.counts["1h"] == {"like": 1, "purchase": 1}


def test_window_boundaries_minute_buckets() -> None:
    p = params()  # one-minute buckets
    now = T0 + 30_000  # half way into the minute starting at T0
    events = [
        # The 1h window is the minute of `now` plus the 59 before: [T0 - 59 min, now].
        ev("in", "a", "click", T0 - 59 * MIN),
        ev("out", "a", "click", T0 - 59 * MIN - 1),
        ev("now", "a", "click", now),
    ]
    state, _ = apply_all(events, p)
    f = user_features(state, "u1", p)
    assert f.counts["1h"] == {"click": 2}
    assert f.counts["24h"] == {"click": 3}


def test_windows_slide_and_old_buckets_are_dropped() -> None:
    p = params(bucket_ms=1)
    state, _ = apply_all([ev("a", "x", "click", T0), ev("b", "y", "click", T0 + 8 * DAY_MS)], p)
    f = user_features(state, "u1", p)
    assert f.counts == {"1h": {"click": 1}, "24h": {"click": 1}, "7d": {"click": 1}}
    assert all(b > T0 for b in state.buckets["click"])  # the old bucket is gone


def test_out_of_order_event_lands_in_place_and_keeps_as_of() -> None:
    p = params(bucket_ms=1)
    events = [
        ev("e1", "a", "click", T0 + 10),
        ev("e2", "b", "click", T0 + 30),
        ev("e3", "c", "like", T0 + 20),  # out of order
        ev("e4", "z", "click", T0 - 2 * HOUR_MS),  # late: older than a full... history not full yet
    ]
    state, _ = apply_all(events, p)
    f = user_features(state, "u1", p)
    assert [h.item_id for h in f.history] == ["b", "c", "a"]
    assert f.as_of_ms == T0 + 30 and f.last_seen_ms == T0 + 30
    assert f.counts["1h"] == {"click": 2, "like": 1}
    assert f.counts["24h"] == {"click": 3, "like": 1}


def test_event_behind_watermark_is_applied_and_flagged() -> None:
    p = params(bucket_ms=1)
    late = ev("late", "a", "click", T0)
    assert is_late(late, T0 + 5) and not is_late(late, T0 - 1) and not is_late(late, None)
    state, _ = apply_all([ev("x", "b", "click", T0 + 10_000), late], p)
    assert user_features(state, "u1", p).counts["1h"] == {"click": 2}


def test_late_event_older_than_full_history_is_not_inserted() -> None:
    p = params(bucket_ms=1)
    events = [ev(f"e{i}", f"i{i}", "click", T0 + i) for i in range(1, 4)]
    state, _ = apply_all([*events, ev("old", "old", "click", T0)], p)
    assert [h[0] for h in state.history] == ["i3", "i2", "i1"]
    assert user_features(state, "u1", p).counts["1h"] == {"click": 4}


def test_duplicate_event_ids_change_nothing() -> None:
    p = params(bucket_ms=1)
    state, outcomes = apply_all(
        [ev("e1", "a", "click", T0), ev("e2", "b", "like", T0 + 1), ev("e1", "a", "click", T0)], p
    )
    assert [o.duplicate for o in outcomes] == [False, False, True]  # type: ignore[attr-defined]
    assert outcomes[2].sample is None  # type: ignore[attr-defined]
    assert user_features(state, "u1", p).counts["1h"] == {"click": 1, "like": 1}
    assert state.seq == 2


def test_duplicate_beyond_seen_horizon_caught_by_history() -> None:
    p = params(bucket_ms=1, dedupe_horizon_ms=1)
    events = [ev(f"e{i}", f"i{i}", "click", T0 + i * 1000) for i in range(70)]
    state, _ = apply_all(events, p)
    assert "e69" in state.seen and "e0" not in state.seen  # pruned past the horizon
    before = user_features(state, "u1", p)
    out = update_user(state, ev("e69", "i69", "click", T0 + 69_000), p)
    assert out.duplicate and user_features(state, "u1", p) == before


def test_update_user_agrees_with_its_plain_definition_on_random_streams() -> None:
    """The duplicate rule and the sample's history against their plainest spelling (every
    history id checked; one loop over the history), on streams with repeats, ties, events far
    out of order and past the dedupe horizon, items recurring in the history."""
    import random

    def plain_sample(state: UserState, e: Event, p: FeatureParams) -> tuple[str, ...] | None:
        if p.weight(e.event_type) <= 0:
            return None
        hist: list[str] = []
        for item_id, _t, ts, _id in state.history:
            if ts < e.ts_ms and item_id != e.item_id:
                hist.append(item_id)
                if len(hist) >= p.history_len:
                    break
        return tuple(hist)

    rng = random.Random(5)
    for _ in range(60):
        p = params(history_len=rng.choice([1, 3, 8]), bucket_ms=rng.choice([1, 1_000]),
                   dedupe_horizon_ms=rng.choice([1, 5_000, 10**9]))
        state = UserState()
        ids: list[str] = []
        for n in range(150):
            eid = rng.choice(ids) if ids and rng.random() < 0.25 else f"e{n}"
            ids.append(eid)
            ts = T0 + n * 400 - (rng.choice([0, 0, 0, 700, 20_000]))
            e = ev(eid, f"i{rng.randrange(6)}", rng.choice(["click", "like", "impression"]), ts)
            dup = eid in state.seen or eid in [h[3] for h in state.history]
            want = None if dup else plain_sample(state, e, p)
            out = update_user(state, e, p)
            assert out.duplicate == dup
            assert (out.sample.history if out.sample else None) == want


def test_make_sample_point_in_time() -> None:
    p = params(history_len=2)
    state, outcomes = apply_all(
        [
            ev("e1", "a", "click", T0),
            ev("e2", "b", "like", T0 + 10),
            ev("e3", "c", "impression", T0 + 15),
            ev("e4", "d", "click", T0 + 20),
        ],
        p,
    )
    samples = [o.sample for o in outcomes]  # type: ignore[attr-defined]
    assert samples[0].history == ()
    assert samples[1].history == ("a",)
    assert samples[2] is None  # impression: weight 0, no sample
    assert samples[3].history == ("b", "a")
    assert samples[3].weight == 1.0 and samples[3].sample_id == "e4"
    assert samples[3].to_wire() == {
        "sample_id": "e4",
        "user_id": "u1",
        "item_id": "d",
        "event_type": "click",
        "weight": 1.0,
        "ts": T0 + 20,
        "history": ["b", "a"],
    }
    # Out-of-order event: only strictly earlier interactions, never its own item.
    late = make_sample(state, ev("e5", "a", "purchase", T0 + 10), p.event_weights, 5)
    assert late is not None and late.history == ()
    # The state holds history_len=2 entries (d, b): "a" fell off, so a late sample sees only b.
    mid = make_sample(state, ev("e6", "x", "purchase", T0 + 11), p.event_weights, 5)
    assert mid is not None and mid.history == ("b",)
    same_ts = make_sample(state, ev("e7", "x", "purchase", T0 + 20), p.event_weights, 5)
    assert same_ts is not None and same_ts.history == ("b",)
    after = make_sample(state, ev("e8", "x", "purchase", T0 + 21), p.event_weights, 5)
    assert after is not None and after.history == ("d", "b")


def test_item_decayed_score_and_counts() -> None:
    p = params(item_half_life_s=3600.0, bucket_ms=1)
    state = ItemState()
    assert update_item(state, ev("e1", "i", "click", T0), p)  # weight 1
    assert not update_item(state, ev("e2", "i", "impression", T0 + 1), p)
    assert update_item(state, ev("e3", "i", "purchase", T0 + HOUR_MS), p)  # weight 5
    f = item_features(state, "i", p)
    assert f.score == pytest.approx(1 * 0.5 + 5)
    assert f.as_of_ms == T0 + HOUR_MS
    assert f.counts == {"1h": 1, "24h": 2}
    # Out of order: a like (weight 2) one half-life before as_of adds 2 * 0.5.
    assert update_item(state, ev("e4", "i", "like", T0), p)
    assert item_features(state, "i", p).score == pytest.approx(0.5 + 5 + 1.0)
    assert item_features(state, "i", p).as_of_ms == T0 + HOUR_MS


def test_item_score_is_order_independent() -> None:
    p = params(item_half_life_s=600.0)
    events = [ev(f"e{i}", "i", "click", T0 + i * 97_000) for i in range(10)]
    a, b = ItemState(), ItemState()
    for e in events:
        update_item(a, e, p)
    for e in reversed(events):
        update_item(b, e, p)
    assert a.score == pytest.approx(b.score) and a.as_of_ms == b.as_of_ms
    expected = sum(math.pow(2, -(9 - i) * 97 / 600) for i in range(10))
    assert a.score == pytest.approx(expected)


def test_trending_top_n_decayed_to_common_instant() -> None:
    p = params(trending_n=2, item_half_life_s=3600.0)
    state = TrendingState()
    update_trending(state, "a", 4.0, T0, p)  # at T0 + 1h: 2.0
    update_trending(state, "b", 3.0, T0 + HOUR_MS, p)
    update_trending(state, "c", 1.0, T0 + HOUR_MS, p)
    update_trending(state, "d", 2.5, T0 + HOUR_MS, p)
    update_trending(state, "e", 0.5, T0 + HOUR_MS, p)  # 5 > 2n: prune to 2
    top = trending(state, p)
    assert top.as_of_ms == T0 + HOUR_MS
    assert [i for i, _ in top.items] == ["b", "d"]
    assert top.items[1][1] == pytest.approx(2.5)
    # A stale update (older as_of) is ignored; a newer one replaces the item's entry.
    update_trending(state, "b", 0.1, T0, p)
    update_trending(state, "a", 10.0, T0 + HOUR_MS, p)
    assert [i for i, _ in trending(state, p).items] == ["a", "b"]


# --- the feature job's parser of `events` records (stream/flink/parse.py) --------------------

GOOD = {
    "event_id": "e1",
    "user_id": "u1",
    "item_id": "i1",
    "event_type": "rating",
    "ts": T0,
    "value": 4.5,
    "context": {"page": "home"},
}


def test_parse_event_accepts_the_wire_format() -> None:
    import json

    from stream.flink.parse import parse_event

    e = parse_event(json.dumps(GOOD).encode(), DEFAULT_EVENT_WEIGHTS)
    assert e == Event("e1", "u1", "i1", "rating", T0, 4.5, {"page": "home"})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"ts": "2024-01-01"}, "ts:"),
        ({"ts": True}, "ts:"),
        ({"event_type": "view"}, "event_type:"),
        ({"user_id": ""}, "user_id:"),
        ({"item_id": "x" * 129}, "item_id:"),
        ({"value": "high"}, "value:"),
        ({"extra": 1}, "unknown field: extra"),
    ],
)
def test_parse_event_names_the_problem(change: dict[str, object], reason: str) -> None:
    import json

    from stream.flink.parse import try_parse

    parsed = try_parse(json.dumps({**GOOD, **change}), DEFAULT_EVENT_WEIGHTS)
    assert parsed.event is None and parsed.reason is not None
    assert parsed.reason.startswith(reason)


def test_parse_event_rejects_non_objects() -> None:
    from stream.flink.parse import try_parse

    assert try_parse(b"\xff", DEFAULT_EVENT_WEIGHTS).reason is not None
    assert try_parse("[1, 2]", DEFAULT_EVENT_WEIGHTS).reason == "not a JSON object"


def test_parse_event_reads_what_json_reads_beyond_strict_json() -> None:
    """The parser decides on the document ``json`` reads, by ingest's rules: NaN, infinity,
    integers over 64 bits (a faster parser such as orjson reads those as floats) and lone
    surrogates are read and then fail their field's rule, never "not JSON"; UTF-16 bytes are
    read; the DLQ reason of broken JSON is ``json``'s message."""
    import json

    from stream.flink.parse import parse_event, try_parse

    def reason(**change: object) -> str:
        raw = json.dumps({**GOOD, **change})
        return str(try_parse(raw, DEFAULT_EVENT_WEIGHTS, now_ms=T0).reason)

    assert reason(value=float("nan")).startswith("value:")
    assert reason(value=1e308 * 10).startswith("value:")
    assert reason(ts=2**70).startswith("ts:")
    assert reason(item_id="\ud800").startswith("item_id:")
    assert reason(context={"n": 2**64}).startswith("context:")
    # 19 digits take the json path, which keeps a 64-bit integer exact (also from bytes)
    big = json.dumps({**GOOD, "context": {"n": 2**63 - 1, "m": -(2**63)}})
    e = parse_event(big.encode(), DEFAULT_EVENT_WEIGHTS)
    assert e.context == {"n": 2**63 - 1, "m": -(2**63)}
    utf16 = json.dumps({**GOOD, "item_id": "caf\u00e9"}).encode("utf-16")
    assert parse_event(utf16, DEFAULT_EVENT_WEIGHTS).item_id == "caf\u00e9"
    assert parse_event(json.dumps(GOOD).encode(), DEFAULT_EVENT_WEIGHTS) == parse_event(
        json.dumps(GOOD), DEFAULT_EVENT_WEIGHTS
    )
    broken = try_parse('{"event_id": ', DEFAULT_EVENT_WEIGHTS).reason
    try:
        json.loads('{"event_id": ')
    except ValueError as exc:
        assert broken == f"not JSON: {exc}"


@pytest.mark.parametrize(
    ("item", "weight"),
    [("i1", 1.0), ("caf\u00e9", 2.0), ('q"\\\n\u2028', 5.0), ("i1", 1e-7), ("i1", 0.25),
     ("i1", 1.5e16), ("i1", 1e300), ("i1", float("inf"))],
)
def test_sample_json_is_the_compact_ascii_json_of_the_wire_dict(item: str, weight: float) -> None:
    import json

    sample = make_sample(UserState(), ev("e1", item, "click", T0), {"click": weight}, 3)
    assert sample is not None
    assert sample.to_json() == json.dumps(sample.to_wire(), separators=(",", ":"))


@pytest.mark.parametrize("bucket_ms", [1, MIN, HOUR_MS])
def test_user_counts_match_window_count_on_random_streams(bucket_ms: int) -> None:
    """Out-of-order, late and duplicate events over weeks: after every update the counts are
    ``window_count`` of each window, and no bucket older than the largest window is kept
    (pruning runs only when as_of enters a newer bucket)."""
    import random

    from feature_store.features import USER_WINDOWS, user_counts, window_count

    rng = random.Random(bucket_ms)
    p = params(bucket_ms=bucket_ms)
    state, ts, ids = UserState(), T0, ["e0"]
    for n in range(400):
        ts += rng.choice([0, 1, 30_000, MIN, HOUR_MS, DAY_MS, 3 * DAY_MS])
        at = ts - rng.choice([0, 0, 1, MIN, HOUR_MS + 1, DAY_MS, 8 * DAY_MS])
        eid = rng.choice(ids) if rng.random() < 0.1 else f"e{n}"
        ids.append(eid)
        update_user(state, ev(eid, f"i{n % 7}", rng.choice(["click", "like", "impression"]), at), p)
        counts = user_counts(state, p)
        for name, window_ms in USER_WINDOWS.items():
            want = {t: window_count(b, state.as_of_ms, window_ms, bucket_ms)
                    for t, b in sorted(state.buckets.items())}
            assert counts[name] == {t: c for t, c in want.items() if c}
        oldest = state.as_of_ms // bucket_ms - max(USER_WINDOWS.values()) // bucket_ms + 1
        assert all(b >= oldest for per_type in state.buckets.values() for b in per_type)
        assert all(state.buckets.values())
        assert user_features(state, "u1", p).counts == counts


@pytest.mark.parametrize("bucket_ms", [1, MIN, HOUR_MS])
def test_item_counts_match_window_count_on_random_streams(bucket_ms: int) -> None:
    """``item_features`` counts from the buckets ``update_item`` keeps (none newer than
    as_of, none older than the largest window): after every update of an out-of-order, late
    stream they are ``window_count`` of each window over the stored buckets."""
    import random

    from feature_store.features import ITEM_WINDOWS, window_count

    rng = random.Random(bucket_ms)
    p = params(bucket_ms=bucket_ms)
    state, ts, differ = ItemState(), T0, 0
    for n in range(600):
        ts += rng.choice([0, 1, 30_000, MIN, 20 * MIN, HOUR_MS, DAY_MS])
        at = ts - rng.choice([0, 0, 1, MIN, HOUR_MS - 1, HOUR_MS + 1, DAY_MS - MIN, 2 * DAY_MS])
        update_item(state, ev(f"e{n}", "i", rng.choice(["click", "like", "purchase"]), at), p)
        got = item_features(state, "i", p).counts
        assert got == {name: window_count(state.buckets, state.as_of_ms, w, bucket_ms)
                       for name, w in ITEM_WINDOWS.items()}
        differ += 0 < got["1h"] < got["24h"]
    assert differ > 50  # the windows were not all equal
