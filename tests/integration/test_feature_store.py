"""RedisOnlineStore on the real Redis: round trips, the only-if-newer rule, TTLs, replays."""

from __future__ import annotations

from typing import Any

import pytest

from feature_store.features import (
    Event,
    FeatureParams,
    UserState,
    update_user,
    user_counts,
    user_features,
    user_history,
)
from feature_store.redis_store import RedisOnlineStore, item_key_name, user_key_name
from feature_store.store import HistoryEntry, ItemFeatures, Trending, UserFeatures
from streamrec.ids import item_key
from streamrec.settings import FeatureSettings, Settings

pytestmark = pytest.mark.integration


def user(uid: str, as_of: int, items: tuple[str, ...] = ("a",)) -> UserFeatures:
    return UserFeatures(
        user_id=uid,
        history=tuple(HistoryEntry(i, "click", as_of - n) for n, i in enumerate(items)),
        counts={"1h": {"click": len(items)}, "24h": {"click": len(items)}, "7d": {}},
        last_seen_ms=as_of,
        as_of_ms=as_of,
    )


def test_round_trip_and_unknown_ids(store: RedisOnlineStore) -> None:
    u = user("u1", 1000, ("b", "a"))
    it = ItemFeatures(item_id="a", score=1.25, counts={"1h": 1, "24h": 2}, as_of_ms=900)
    tr = Trending(items=(("a", 1.25), ("b", 0.5)), as_of_ms=1000)
    store.write_batch(users=[u], items=[it], trending=tr)
    assert store.read_users(["u1", "nobody"]) == [u, None]
    assert store.read_items(["a", "zz"]) == [it, None]
    assert store.read_trending(1) == Trending(items=(("a", 1.25),), as_of_ms=1000)
    assert store.read_item_ids([item_key("a"), item_key("zz")]) == ["a", None]


def test_older_write_never_overwrites_newer(store: RedisOnlineStore) -> None:
    store.write_batch(users=[user("u1", 2000, ("new",))], user_seqs=[5])
    store.write_batch(users=[user("u1", 1000, ("old",))], user_seqs=[9])  # older as_of
    store.write_batch(users=[user("u1", 2000, ("same-ts-older-seq",))], user_seqs=[4])
    (got,) = store.read_users(["u1"])
    assert got is not None and got.history[0].item_id == "new"
    store.write_batch(users=[user("u1", 2000, ("same-ts-newer-seq",))], user_seqs=[6])
    (got,) = store.read_users(["u1"])
    assert got is not None and got.history[0].item_id == "same-ts-newer-seq"
    store.write_batch(users=[user("u1", 3000, ("newer",))], user_seqs=[1])
    (got,) = store.read_users(["u1"])
    assert got is not None and got.as_of_ms == 3000 and got.history[0].item_id == "newer"


def test_user_rows_write_what_the_records_write(store: RedisOnlineStore) -> None:
    """The feature job's hot path (users as parts) stores exactly the user_features record."""
    params = FeatureParams(event_weights={"click": 1.0}, history_len=5)
    st = UserState()
    for n in range(4):
        update_user(st, Event(f"e{n}", "u1", f"i{n}", "click", 5_000 + n), params)
    store.write_user_rows(
        [("u1", st.as_of_ms, st.seq, user_history(st), user_counts(st, params), st.last_seen_ms)])
    assert store.read_users(["u1"]) == [user_features(st, "u1", params)]
    older = ("u1", st.as_of_ms, st.seq - 1, [], {}, st.last_seen_ms)
    store.write_user_rows([older])  # an older seq at the same as_of is ignored
    assert store.read_users(["u1"]) == [user_features(st, "u1", params)]


def test_write_survives_a_flushed_script_cache(store: RedisOnlineStore, client: Any) -> None:
    """Writes call the script by its SHA; a server that lost its scripts (restart, SCRIPT
    FLUSH) answers NOSCRIPT, and the store loads the script and writes again."""
    store.write_batch(users=[user("u1", 1000, ("a",))], user_seqs=[1])
    client.script_flush()
    store.write_batch(users=[user("u1", 2000, ("b",))], user_seqs=[2])
    (got,) = store.read_users(["u1"])
    assert got is not None and got.as_of_ms == 2000 and got.history[0].item_id == "b"


def test_ttls_from_settings(settings: Settings, client: Any) -> None:
    features = FeatureSettings(user_ttl_s=120, item_ttl_s=0)
    s = RedisOnlineStore(settings.redis, features, client=client)
    try:
        s.write_batch(
            users=[user("u1", 1)], items=[ItemFeatures("a", 1.0, {"1h": 1, "24h": 1}, 1)]
        )
        prefix = settings.redis.key_prefix
        assert 0 < client.ttl(user_key_name(prefix, "u1")) <= 120
        assert client.ttl(item_key_name(prefix, "a")) == -1  # 0 = no TTL
    finally:
        client.delete(user_key_name(prefix, "u1"), item_key_name(prefix, "a"))
        s.close()


def test_replaying_the_same_events_leaves_the_same_store(
    store: RedisOnlineStore, settings: Settings, client: Any
) -> None:
    pattern = user_key_name(settings.redis.key_prefix, "*")
    params = FeatureParams(event_weights={"click": 1.0, "impression": 0.0}, history_len=5)
    events = [
        Event(f"e{n}", f"u{n % 3}", f"i{n % 4}", "click" if n % 2 else "impression", 10_000 + n * 7)
        for n in range(30)
    ]

    def run() -> dict[bytes, dict[bytes, bytes]]:
        # A fresh job over the same events writes after every event (worst case for ordering).
        states: dict[str, UserState] = {}
        for e in events:
            st = states.setdefault(e.user_id, UserState())
            update_user(st, e, params)
            store.write_batch(users=[user_features(st, e.user_id, params)], user_seqs=[st.seq])
        return {k: client.hgetall(k) for k in sorted(client.keys(pattern))}

    first = run()
    assert len(first) == 3
    # Replay everything again, then an older prefix of it: nothing changes.
    assert run() == first
    events = events[:10]
    run()
    assert {k: client.hgetall(k) for k in first} == first


def test_read_api_serves_what_the_store_holds(store: RedisOnlineStore) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from serving import errors
    from serving.features_api import features_router

    app = FastAPI()
    app.include_router(features_router(store))
    errors.install(app)
    store.write_batch(
        users=[user("u 1", 5000, ("b", "a"))],
        items=[ItemFeatures("a/1", 0.75, {"1h": 1, "24h": 1}, 4000)],
    )
    with TestClient(app) as client:
        got = client.get("/users/u 1/features")
        assert got.status_code == 200
        body = got.json()
        assert body["as_of_ms"] == 5000 and body["last_seen_ms"] == 5000
        assert body["history"] == [
            {"item_id": "b", "event_type": "click", "ts_ms": 5000},
            {"item_id": "a", "event_type": "click", "ts_ms": 4999},
        ]
        item = client.get("/items/a%2F1/features")  # ids may contain "/"
        assert item.status_code == 200
        assert item.json() == {
            "item_id": "a/1",
            "score": 0.75,
            "counts": {"1h": 1, "24h": 1},
            "as_of_ms": 4000,
        }
        assert client.get("/users/nobody/features").status_code == 404
        assert client.get("/items/zz/features").status_code == 404


def test_read_api_503_when_redis_is_down(settings: Settings) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from feature_store.store import open_store
    from serving import errors
    from serving.features_api import features_router
    from streamrec.settings import RedisSettings
    from tests.support import free_port

    nowhere = settings.model_copy(update={"redis": RedisSettings(port=free_port())})
    dead = open_store(nowhere, timeout_s=0.5)
    app = FastAPI()
    app.include_router(features_router(dead))
    errors.install(app)
    with TestClient(app) as client:
        resp = client.get("/users/u1/features")
        assert resp.status_code == 503
        assert resp.json()["error"] == "store_unavailable"


def test_catalogue_only_if_newer_and_deletes(store: RedisOnlineStore) -> None:
    from feature_store.store import CatalogueItem

    a1 = CatalogueItem("a", {"genres": ["x"], "title": "A"}, 1000)
    b = CatalogueItem("b", {"price": 3.5}, 0)
    assert store.write_catalogue([a1, b]) == 2
    assert store.read_catalogue(["a", "b", "zz"]) == [a1, b, None]
    assert store.read_item_ids([item_key("a"), item_key("b")]) == ["a", "b"]
    # an older upsert is refused; an equal ts is written again (idempotent replays)
    assert store.write_catalogue([CatalogueItem("a", {"title": "old"}, 999)]) == 0
    assert store.write_catalogue([a1]) == 1
    assert store.read_catalogue(["a"]) == [a1]
    # a delete is a tombstone: older upserts stay out, a newer one brings the item back
    assert store.write_catalogue([CatalogueItem("a", {}, 1500, deleted=True)]) == 1
    assert store.read_catalogue(["a"]) == [None]
    assert store.write_catalogue([CatalogueItem("a", {"title": "late"}, 1200)]) == 0
    assert store.read_catalogue(["a"]) == [None]
    a2 = CatalogueItem("a", {"title": "back"}, 2000)
    store.write_catalogue([a2])
    assert store.read_catalogue(["a"]) == [a2]
    # many records: several script chunks in one round trip
    many = [CatalogueItem(f"m{n}", {"category": "c"}, 5) for n in range(1200)]
    assert store.write_catalogue(many) == 1200
    assert store.read_catalogue(["m0", "m1199"]) == [many[0], many[1199]]
