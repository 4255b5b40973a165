"""The serving app with an in-memory store and a hand-made artifact (no services)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from feature_store.store import (
    CatalogueItem,
    HistoryEntry,
    ItemFeatures,
    OnlineStore,
    OnlineStoreError,
    Trending,
    UserFeatures,
)
from model.artifact.files import load_artifact, write_artifact
from model.artifact.registry import Registry
from serving.app import create_app
from serving.deps import ServingDeps
from streamrec.ids import item_keys, user_key
from streamrec.settings import load_settings

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOKEN = "s3cret-token"


class MemoryStore(OnlineStore):
    def __init__(self) -> None:
        self.users: dict[str, UserFeatures] = {}
        self.trending: Trending | None = None
        self.catalogue: dict[str, CatalogueItem] = {}
        self.down = False

    def write_batch(self, users: Sequence[UserFeatures] = (), items: Sequence[ItemFeatures] = (),
                    trending: Trending | None = None, **seqs: object) -> None:
        self.users.update({u.user_id: u for u in users})
        self.trending = trending or self.trending

    def _check(self) -> None:
        if self.down:
            raise OnlineStoreError("connection refused")

    def read_users(self, user_ids: Sequence[str]) -> list[UserFeatures | None]:
        self._check()
        return [self.users.get(u) for u in user_ids]

    def read_items(self, item_ids: Sequence[str]) -> list[ItemFeatures | None]:
        self._check()
        return [None for _ in item_ids]

    def read_trending(self, n: int) -> Trending | None:
        self._check()
        if self.trending is None:
            return None
        return Trending(self.trending.items[:n], self.trending.as_of_ms)

    def read_item_ids(self, keys: Sequence[int]) -> list[str | None]:
        self._check()
        return [None for _ in keys]

    def read_catalogue(self, item_ids: Sequence[str]) -> list[CatalogueItem | None]:
        self._check()
        return [self.catalogue.get(i) for i in item_ids]


def user(uid: str, items: list[str]) -> UserFeatures:
    hist = tuple(HistoryEntry(i, "click", 1000 - n) for n, i in enumerate(items))
    return UserFeatures(uid, hist, {}, 1000, 1000)


def publish(reg: Registry, version: str, n: int = 200, seed: int = 0,
            default_user_row: np.ndarray | None = None) -> None:
    rng = np.random.default_rng(seed)
    items = [f"i{i}" for i in range(n)]

    def write(d: Path) -> None:
        write_artifact(
            d, version=version, item_ids=items, item_vectors=rng.normal(size=(n, 8)),
            item_hist_keys=item_keys(items), item_hist_rows=rng.normal(size=(n, 8)),
            user_keys=np.array([user_key("model-user")]), user_rows=rng.normal(size=(1, 8)),
            default_user_row=np.zeros(8) if default_user_row is None else default_user_row,
            layers=[(rng.normal(size=(16, 8)), np.zeros(8), "linear")],
            normalize=False, manifest_extra={"trained_through_ms": 1_772_000_000_000},
            created_at=datetime(2026, 3, 1, 11, 0, tzinfo=UTC),
        )

    reg.publish(version, write)


@pytest.fixture
def env(tmp_path: Path):
    settings = load_settings(trainer={"registry_dir": tmp_path, "model_name": "tt"},
                             serving={"admin_token": TOKEN})
    store = MemoryStore()
    store.write_batch(users=[user("alice", ["i1", "i2", "i3"])],
                      trending=Trending(tuple((f"t{i}", 100.0 - i) for i in range(30)), 1000))
    reg = Registry(tmp_path, "tt")
    app = create_app(ServingDeps(settings, store, clock=lambda: NOW, registry=reg, watch=False))
    return app, store, reg


def get(client: TestClient, **params: object) -> dict:
    resp = client.get("/recommend", params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_no_model_answers_popular_and_is_ready(env) -> None:
    app, _, _ = env
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        body = get(client, user_id="alice", k=5)
        assert body["source"] == "popular" and body["model_version"] is None
        assert [i["item_id"] for i in body["items"]] == ["t0", "t1", "t2", "t3", "t4"]
        assert client.get("/model").json()["version"] is None


def test_not_ready_without_model_or_trending(env) -> None:
    app, store, _ = env
    store.down = True
    with TestClient(app) as client:
        assert client.get("/health").status_code == 503
        assert get(client, user_id="alice")["source"] == "degraded"


def test_a_long_quality_guard_hold_degrades_health_but_not_liveness(env) -> None:
    app, _, reg = env
    publish(reg, "v1")
    note = {"held": True, "action": "hold", "pinned": None}
    with TestClient(app) as client:
        assert client.get("/health").json()["degraded"] == []
        reg.write_guard({**note, "held_since": (NOW - timedelta(seconds=30)).isoformat()})
        body = client.get("/health").json()
        assert body["status"] == "ready" and body["degraded"] == []  # within the alarm
        since = NOW - timedelta(seconds=90)
        reg.write_guard({**note, "held_since": since.isoformat()})
        resp = client.get("/health")
        assert resp.status_code == 200  # the served model is still good: no restart
        assert resp.json()["status"] == "degraded"
        assert resp.json()["degraded"] == [
            f"model publication held by the quality guard since {since.isoformat()} (90 s)"]
        assert client.get("/model").json()["guard"]["held_since"] == since.isoformat()
        reg.write_guard({**note, "held": False, "action": "resume", "held_since": None})
        assert client.get("/health").json()["status"] == "ready"


def brute_force_top(reg: Registry, version: str, exclude_seen: bool, k: int = 10) -> list[str]:
    """Alice's top ``k`` by a brute-force product over ``version``'s items (her history
    i1, i2, i3 left out with ``exclude_seen``)."""
    art = load_artifact(reg.path(version))
    scores = art.item_vectors @ art.user_vectors(["alice"], [["i1", "i2", "i3"]])[0]
    seen = (1, 2, 3) if exclude_seen else ()
    return [f"i{i}" for i in np.argsort(-scores).tolist() if i not in seen][:k]


def test_model_ranking_matches_brute_force_without_seen(env) -> None:
    app, _, reg = env
    publish(reg, "v1")
    with TestClient(app) as client:
        body = get(client, user_id="alice", k=10)
        assert body["source"] == "model" and body["model_version"] == "v1"
        assert [i["item_id"] for i in body["items"]] == brute_force_top(reg, "v1", True)
        with_seen = get(client, user_id="alice", k=10, exclude_seen="false")
        assert [i["item_id"] for i in with_seen["items"]] == brute_force_top(reg, "v1", False)


def test_a_user_nobody_knows_gets_the_models_cold_answer(env) -> None:
    """No row in the model, nothing in the store: a user with no history, ranked by the model
    as evaluation measures it (its cold start), not by trending."""
    app, store, reg = env
    publish(reg, "v1", default_user_row=np.linspace(-1.0, 1.0, 8))
    art = load_artifact(reg.path("v1"))
    cold = [f"i{i}" for i in np.argsort(-art.scores(["nobody"], [[]])[:, 0])[:5].tolist()]
    with TestClient(app) as client:
        body = get(client, user_id="nobody", k=5)
        assert body["source"] == "model" and body["model_version"] == "v1"
        assert [i["item_id"] for i in body["items"]] == cold
        body = get(client, user_id="model-user", k=3)
        assert body["source"] == "model" and len(body["items"]) == 3
        store.down = True  # whether they have a history is unknown: trending, degraded
        body = get(client, user_id="nobody", k=5)
        assert body["source"] == "degraded" and body["items"][0]["item_id"] == "t0"


def test_store_down_is_degraded_not_500(env) -> None:
    app, store, reg = env
    publish(reg, "v1")
    with TestClient(app) as client:
        store.down = True
        known = get(client, user_id="model-user", k=4)
        assert known["source"] == "degraded" and known["model_version"] == "v1"
        other = get(client, user_id="alice", k=4)
        assert other["source"] == "degraded"
        assert [i["item_id"] for i in other["items"]] == ["t0", "t1", "t2", "t3"]
        metrics = client.get("/metrics").text
        assert 'streamrec_serving_fallbacks_total{reason="store_error"}' in metrics


def test_padding_with_trending(env) -> None:
    app, _, reg = env
    publish(reg, "v1", n=5)
    with TestClient(app) as client:
        body = get(client, user_id="alice", k=8)
        ids = [i["item_id"] for i in body["items"]]
        assert ids[:2] and set(ids[:2]) == {"i0", "i4"}
        assert ids[2:] == ["t0", "t1", "t2", "t3", "t4", "t5"]


@pytest.mark.parametrize("params", [{"user_id": "a", "k": 0}, {"user_id": "a", "k": 501},
                                    {"k": 5}, {"user_id": ""}, {"user_id": "a", "k": "x"}])
def test_bad_parameters_are_422(env, params: dict) -> None:
    app, _, _ = env
    with TestClient(app) as client:
        assert client.get("/recommend", params=params).status_code == 422


def test_k_bounds_accepted(env) -> None:
    app, _, reg = env
    publish(reg, "v1", n=600)
    with TestClient(app) as client:
        assert len(get(client, user_id="alice", k=500)["items"]) == 500
        assert len(get(client, user_id="alice", k=1)["items"]) == 1
        assert len(get(client, user_id="alice")["items"]) == 20


def test_swap_and_refused_version(env) -> None:
    app, _, reg = env
    publish(reg, "v1")
    with TestClient(app) as client:
        loader = app.state.serving.loader
        publish(reg, "v2", seed=2)
        loader.check()
        assert get(client, user_id="alice")["model_version"] == "v2"
        publish(reg, "v3", seed=3)
        vec = reg.path("v3") / "item_vectors.npy"
        vec.write_bytes(vec.read_bytes()[:-8] + b"\x00" * 8)
        loader.check()
        loader.check()  # not retried while unchanged
        assert get(client, user_id="alice")["model_version"] == "v2"
        info = client.get("/model").json()
        assert info["version"] == "v2" and "v3" in info["refused"]
        assert info["age_s"] == 3600.0 and info["trained_through_ms"] == 1_772_000_000_000
        metrics = client.get("/metrics").text
        assert 'streamrec_serving_model_refused_total{reason="artifact"} 1.0' in metrics
        assert "streamrec_serving_model_swaps_total 2.0" in metrics
        assert "streamrec_serving_model_version_age_seconds 3600.0" in metrics
        assert 'streamrec_serving_request_seconds_count{source="model"}' in metrics


def test_admin_pin_and_rollback(env) -> None:
    app, _, reg = env
    publish(reg, "v1")
    publish(reg, "v2", seed=2)
    with TestClient(app) as client:
        assert client.post("/model/pin", json={"version": "v1"}).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert client.post("/model/pin", json={"version": "v1"}, headers=bad).status_code == 403
        ok = {"Authorization": f"Bearer {TOKEN}"}
        assert client.post("/model/pin", json={"version": "v9"}, headers=ok).status_code == 404
        resp = client.post("/model/pin", json={"version": "v1"}, headers=ok)
        assert resp.status_code == 200 and resp.json()["pinned"] == "v1"
        assert get(client, user_id="alice")["model_version"] == "v1"
        assert client.delete("/model/pin", headers={"X-Admin-Token": TOKEN}).status_code == 200
        assert get(client, user_id="alice")["model_version"] == "v2"
        resp = client.post("/model/rollback", headers={"X-Admin-Token": TOKEN})
        assert resp.status_code == 200 and resp.json()["version"] == "v1"
        assert reg.current() == "v1" and reg.pinned() == "v1"


def test_admin_disabled_without_configured_token(tmp_path: Path) -> None:
    settings = load_settings(trainer={"registry_dir": tmp_path, "model_name": "tt"})
    app = create_app(ServingDeps(settings, MemoryStore(), clock=lambda: NOW,
                                 registry=Registry(tmp_path, "tt"), watch=False))
    with TestClient(app) as client:
        resp = client.post("/model/rollback", headers={"X-Admin-Token": "anything"})
        assert resp.status_code == 403


def test_feature_routes_are_mounted(env) -> None:
    app, _, _ = env
    with TestClient(app) as client:
        body = client.get("/users/alice/features").json()
        assert [h["item_id"] for h in body["history"]] == ["i1", "i2", "i3"]
        missing = client.get("/users/nobody/features")
        assert missing.status_code == 404  # through the app's one error handler
        assert missing.json() == {"error": "not_found", "detail": "unknown user_id 'nobody'"}


def test_catalogue_item_route(env) -> None:
    app, store, _ = env
    store.catalogue["m/1"] = CatalogueItem("m/1", {"genres": ["Comedy"], "title": "A"}, 1234)
    with TestClient(app) as client:
        resp = client.get("/items/m/1")
        assert resp.status_code == 200, resp.text
        assert resp.json() == {
            "item_id": "m/1", "attributes": {"genres": ["Comedy"], "title": "A"}, "ts": 1234
        }
        assert client.get("/items/m/1/features").status_code == 404  # the features route
        missing = client.get("/items/nope")
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        store.down = True
        assert client.get("/items/m/1").status_code == 503


def test_concurrent_requests_are_batched_with_equal_answers(env) -> None:
    import asyncio

    from serving.retrieval import Ask

    app, _, reg = env
    publish(reg, "v1", n=5000)
    with TestClient(app):
        rec = app.state.serving.recommender
        sizes: list[int] = []
        rank = rec.rank
        rec.rank = lambda asks: sizes.append(len(asks)) or rank(asks)
        asks = [Ask(u, k, ex) for u in ("alice", "model-user", "nobody") for k in (1, 7)
                for ex in (True, False)] * 3

        async def all_at_once() -> list:
            return await asyncio.gather(*(rec.submit(a) for a in asks))

        answers = asyncio.run(all_at_once())
        assert max(sizes) > 1 and sum(sizes) == len(asks)
        for ask, answer in zip(asks, answers, strict=True):
            alone = rank([ask])[0]
            assert (answer.source, answer.version) == (alone.source, alone.version)
            assert [s.item_id for s in answer.items] == [s.item_id for s in alone.items]
            np.testing.assert_allclose([s.score for s in answer.items],
                                       [s.score for s in alone.items], rtol=1e-5)
            assert len(answer.items) == ask.k


class FakePubSub:
    def __init__(self, messages: list) -> None:
        self.messages = messages
        self.channels: list[str] = []

    async def subscribe(self, channel: str) -> None:
        self.channels.append(channel)

    async def get_message(self, ignore_subscribe_messages: bool, timeout: float) -> dict | None:
        import asyncio

        if self.messages:
            return self.messages.pop(0)
        await asyncio.sleep(0.01)
        return None


class FakeAsyncRedis:
    def __init__(self, pubsub: FakePubSub) -> None:
        self._pubsub = pubsub
        self.closed = False

    def pubsub(self) -> FakePubSub:
        return self._pubsub

    async def aclose(self) -> None:
        self.closed = True


def test_watcher_swaps_on_message_and_on_periodic_check(tmp_path: Path) -> None:
    import asyncio

    from serving.loader import ModelLoader
    from serving.metrics import ServingMetrics

    reg = Registry(tmp_path, "tt", key_prefix="p:")
    publish(reg, "v1")
    pubsub = FakePubSub([])

    async def until(predicate: Callable[[], bool], timeout_s: float) -> None:
        """Poll ``predicate`` until it holds or ``timeout_s`` has passed (no error: the
        caller asserts on the state it finds)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not predicate() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    async def scenario(poll_s: float, announce: bool, wait_s: float = 30.0) -> str | None:
        loader = ModelLoader(reg, ServingMetrics(), lambda: NOW, poll_interval_s=poll_s)
        # The listener checks CURRENT once after subscribing (to catch what was published
        # while it was away): publish only once a check begun after the subscription is
        # done, so the new version can only arrive by the message or the periodic check.
        checks = {"started": 0, "done": 0, "subscribed_at": None}
        check = loader.check

        def counted() -> object:
            checks["started"] += 1
            try:
                return check()
            finally:
                checks["done"] += 1

        loader.check = counted  # type: ignore[method-assign]
        subscribe = pubsub.subscribe

        async def marked(channel: str) -> None:
            await subscribe(channel)
            checks["subscribed_at"] = checks["started"]

        pubsub.subscribe = marked  # type: ignore[method-assign]
        tasks = [asyncio.create_task(loader.watch()),
                 asyncio.create_task(loader.listen(lambda: FakeAsyncRedis(pubsub)))]
        try:
            await until(lambda: loader.current is not None and checks["subscribed_at"] is not None
                        and checks["done"] > checks["subscribed_at"], 30.0)
            pubsub.subscribe = subscribe  # type: ignore[method-assign]
            version = f"v{len(reg.versions()) + 1}"
            publish(reg, version)
            if announce:
                pubsub.messages.append({"type": "message", "data": version.encode()})
            await until(lambda: loader.current is not None and loader.current.version == version,
                        wait_s)
            return loader.current.version if loader.current else None
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    assert asyncio.run(scenario(poll_s=60.0, announce=True)) == "v2"
    assert pubsub.channels == ["p:model:tt:published"]
    assert asyncio.run(scenario(poll_s=0.05, announce=False)) == "v3"
    # without a message, v4 waits for the next periodic check (60 s away)
    assert asyncio.run(scenario(poll_s=60.0, announce=False, wait_s=0.5)) == "v3"


def test_internal_failure_still_answers(env) -> None:
    app, _, reg = env
    publish(reg, "v1")
    with TestClient(app) as client:
        def broken(asks: object) -> list:
            raise RuntimeError("bug")

        app.state.serving.recommender.rank = broken
        body = get(client, user_id="alice", k=3)
        assert body["source"] == "degraded" and body["model_version"] is None
        assert [i["item_id"] for i in body["items"]] == ["t0", "t1", "t2"]
        assert 'reason="internal_error"' in client.get("/metrics").text


def test_pinning_a_broken_version_is_refused_and_moves_nothing(env) -> None:
    app, _, reg = env
    publish(reg, "v1")
    publish(reg, "v2", seed=2)
    (reg.path("v1") / "user_rows.npy").write_bytes(b"\x93NUMPY broken")
    with TestClient(app) as client:
        resp = client.post("/model/pin", json={"version": "v1"}, headers={"X-Admin-Token": TOKEN})
        assert resp.status_code == 422 and resp.json()["error"] == "version_refused"
        assert reg.pinned() is None and reg.current() == "v2"
        assert get(client, user_id="alice")["model_version"] == "v2"
        assert client.post("/model/rollback", headers={"X-Admin-Token": TOKEN}).status_code == 422
        assert reg.current() == "v2"


def test_model_items_says_whether_the_served_catalog_holds_an_item(env) -> None:
    app, _, reg = env
    with TestClient(app) as client:
        assert client.get("/model/items/i3").json()["in_catalog"] is False  # no model yet
    publish(reg, "v1", n=20)
    with TestClient(app) as client:
        known = client.get("/model/items/i3").json()
        assert known == {"item_id": "i3", "in_catalog": True, "version": "v1", "delta_seq": None}
        assert client.get("/model/items/i20").json()["in_catalog"] is False
        assert "delta" in client.get("/model").json()  # deltas on by default (not followed here)


def test_a_catalogue_past_the_ann_threshold_ranks_through_the_index(tmp_path: Path) -> None:
    # every list probed: the two stages must answer what brute force does
    settings = load_settings(trainer={"registry_dir": tmp_path, "model_name": "tt"},
                             serving={"ann_min_items": 150, "ann_nprobe": 1_000,
                                      "ann_candidates": 20})
    store = MemoryStore()
    store.write_batch(users=[user("alice", ["i1", "i2", "i3"])])
    reg = Registry(tmp_path, "tt")
    app = create_app(ServingDeps(settings, store, clock=lambda: NOW, registry=reg, watch=False))
    publish(reg, "v1", n=400)
    with TestClient(app) as client:
        body = get(client, user_id="alice", k=10)
        assert body["source"] == "model" and body["model_version"] == "v1"
        assert [i["item_id"] for i in body["items"]] == brute_force_top(reg, "v1", True)
        retrieval = client.get("/model").json()["retrieval"]
        assert retrieval["kind"] == "ann" and retrieval["probed"] == retrieval["lists"]
        assert 'streamrec_serving_ann_builds_total 1.0' in client.get("/metrics").text
        publish(reg, "v2", n=100, seed=1)  # below the threshold: exact search
        app.state.serving.loader.check()
        assert get(client, user_id="alice")["model_version"] == "v2"
        assert client.get("/model").json()["retrieval"] == {"kind": "exact"}
