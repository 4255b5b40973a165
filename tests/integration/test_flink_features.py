"""The Flink feature job on the real stack: exact features in Redis, exact samples, recovery.

The job under test is submitted to the stack's standalone Flink cluster (``flink run``); the
crash test runs the same job file in its own process (an in-process MiniCluster) so that it
can be killed with SIGKILL without touching the shared cluster, and restarted from its last
retained checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feature_store.features import (
    Event,
    FeatureParams,
    ItemState,
    TrendingState,
    UserState,
    item_features,
    trending,
    update_item,
    update_trending,
    update_user,
    user_features,
)
from feature_store.redis_store import RedisOnlineStore, user_key_name
from stream.cli.features import job_args, job_file
from stream.flink.submit import submit_python_job
from stream.kafka_client import make_producer
from streamrec.settings import Settings
from tests.support import consume, wait_until

pytestmark = pytest.mark.integration

T0 = 1_700_000_040_000  # a whole minute
CLUSTER_PYTHON_MODE = os.environ.get("STREAMREC_TEST_FLINK_PYTHON_MODE", "thread")
TYPES = ["click", "impression", "like", "purchase", "add_to_cart"]


def make_events(tag: str, n: int, start: int = 0, users: int = 4, items: int = 6) -> list[Event]:
    """A deterministic stream with some out-of-order timestamps."""
    out = []
    for i in range(start, start + n):
        jitter = -4_000 if i % 7 == 3 else 0  # out of order by a few seconds
        out.append(
            Event(
                event_id=f"{tag}-{i}",
                user_id=f"u{i % users}",
                item_id=f"i{(i * 5) % items}",
                event_type=TYPES[i % len(TYPES)],
                ts_ms=T0 + i * 1_500 + jitter,
            )
        )
    return out


def wire(e: Event) -> bytes:
    return json.dumps(
        {
            "event_id": e.event_id,
            "user_id": e.user_id,
            "item_id": e.item_id,
            "event_type": e.event_type,
            "ts": e.ts_ms,
            "value": None,
            "context": None,
        }
    ).encode()


def produce(settings: Settings, events: list[Event], extra: list[bytes] = ()) -> None:  # type: ignore[assignment]
    producer = make_producer(settings.kafka)
    try:
        for e in events:
            producer.send(settings.kafka.events_topic, key=e.user_id.encode(), value=wire(e))
        for raw in extra:
            producer.send(settings.kafka.events_topic, key=b"bad", value=raw)
        producer.flush(timeout=30)
    finally:
        producer.close()


def produce_items(settings: Settings, records: list[dict[str, Any] | bytes]) -> None:
    """Item records (wire dicts, or raw bytes for bad ones) onto the items topic."""
    producer = make_producer(settings.kafka)
    try:
        for r in records:
            raw = r if isinstance(r, bytes) else json.dumps(r).encode()
            key = r["item_id"].encode() if isinstance(r, dict) else b"bad"
            producer.send(settings.kafka.items_topic, key=key, value=raw)
        producer.flush(timeout=30)
    finally:
        producer.close()


def catalogue_items(tag: str, n: int, ts: int = 0) -> list[dict[str, Any]]:
    return [
        {"item_id": f"{tag}{i}", "attributes": {"genres": [f"g{i % 3}"], "title": f"T {i}"},
         "ts": ts, "deleted": False}
        for i in range(n)
    ]  # fmt: skip


def catalogue_matches(store: RedisOnlineStore, expected: dict[str, dict[str, Any] | None]) -> bool:
    got = store.read_catalogue(list(expected))
    return [None if g is None else g.attributes for g in got] == list(expected.values())


class Expected:
    """The reference result: the (unit-tested) feature functions over the events in order."""

    def __init__(self, events: list[Event], params: FeatureParams) -> None:
        self.params = params
        users: dict[str, UserState] = {}
        items: dict[str, ItemState] = {}
        self.samples: dict[str, dict[str, Any]] = {}
        for e in events:
            st = users.setdefault(e.user_id, UserState())
            out = update_user(st, e, params)
            if out.duplicate:
                continue
            if out.sample is not None:
                self.samples[e.event_id] = out.sample.to_wire()
                update_item(items.setdefault(e.item_id, ItemState()), e, params)
        self.users = {u: user_features(s, u, params) for u, s in users.items()}
        self.items = {i: item_features(s, i, params) for i, s in items.items()}
        tr = TrendingState()
        for f in self.items.values():
            update_trending(tr, f.item_id, f.score, f.as_of_ms, params)
        self.trending = trending(tr, params)


def store_matches(store: RedisOnlineStore, exp: Expected) -> bool:
    users = store.read_users(list(exp.users))
    if users != list(exp.users.values()):
        return False
    items = store.read_items(list(exp.items))
    for got, want in zip(items, exp.items.values(), strict=True):
        if got is None or got.counts != want.counts or got.as_of_ms != want.as_of_ms:
            return False
        if got.score != pytest.approx(want.score):
            return False
    return True


def trending_matches(store: RedisOnlineStore, exp: Expected) -> bool:
    got = store.read_trending(exp.params.trending_n)
    if got is None or got.as_of_ms != exp.trending.as_of_ms:
        return False
    assert [i for i, _ in got.items] == [i for i, _ in exp.trending.items]
    assert [s for _, s in got.items] == pytest.approx([s for _, s in exp.trending.items])
    return True


def check_samples(records: list[Any], exp: Expected, events: list[Event]) -> None:
    by_id: dict[str, dict[str, Any]] = {}
    for r in records:
        sample = json.loads(r.value)
        previous = by_id.setdefault(sample["sample_id"], sample)
        assert previous == sample, "a repeated sample_id must carry the same sample"
    assert by_id == exp.samples  # exact: none missing, none extra
    ts_of = {}
    for e in events:
        ts_of.setdefault((e.user_id, e.item_id), []).append(e.ts_ms)
    for s in by_id.values():
        assert s["item_id"] not in s["history"]
        for item in s["history"]:  # every history item was interacted with strictly before
            assert min(ts_of[(s["user_id"], item)]) < s["ts"]


def job_namespace(settings: Settings, tmp_path: Path, **kw: Any) -> Namespace:
    base = {
        "local": False,
        "parallelism": 1,
        "group_id": f"{settings.redis.key_prefix}features",
        "job_name": f"features-{settings.redis.key_prefix.rstrip(':')}",
        "restore": None,
        "checkpoint_dir": None,
        "window_ms": 50,
        "flush_ms": 50,
        "bucket_ms": 60_000,
        "python_mode": "thread",
    }
    base.update(kw)
    return Namespace(**base)


def rest(settings: Settings, path: str, method: str = "GET") -> Any:
    url = f"http://{settings.stack.bind_host}:{settings.flink.rest_port}{path}"
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as resp:
        body = resp.read()
    return json.loads(body) if body else None


TERMINAL = {"CANCELED", "FAILED", "FINISHED"}


def job_id(
    settings: Settings, name: str, states: frozenset[str] = frozenset({"RUNNING"})
) -> str | None:
    """The id of the job called ``name`` in one of ``states`` (empty set: any live state)."""
    for job in rest(settings, "/jobs/overview")["jobs"]:
        live = job["state"] not in TERMINAL
        if job["name"] == name and (job["state"] in states if states else live):
            return str(job["jid"])
    return None


@pytest.fixture
def cluster_job(settings: Settings, tmp_path: Path) -> Iterator[Namespace]:
    """The feature job submitted to the stack's Flink cluster; cancelled afterwards."""
    # Thread mode needs flink-python on the cluster's own classpath (deploy/components.py).
    args = job_namespace(settings, tmp_path, python_mode=CLUSTER_PYTHON_MODE)
    submit_python_job(settings, job_file(), job_args(args, settings))
    try:
        jid = wait_until(lambda: job_id(settings, args.job_name), 60, "the job to run")
        yield args
    finally:
        jid = job_id(settings, args.job_name, frozenset())  # running, restarting, ...
        if jid:
            rest(settings, f"/jobs/{jid}?mode=cancel", method="PATCH")


@pytest.mark.timeout(600)
def test_events_to_exact_features_and_samples(
    settings: Settings, store: RedisOnlineStore, client: Any, cluster_job: Namespace
) -> None:
    params = FeatureParams.from_settings(settings.features, bucket_ms=cluster_job.bucket_ms)
    events = make_events("a", 60)
    dupes = [events[5], events[17], events[40]]  # same event_id again: dropped
    stream = [*events, *dupes]
    produce(settings, stream, extra=[b"not json", b'{"event_id": "x"}'])
    exp = Expected(stream, params)
    # The catalogue beside the events: upserts, an older upsert (ignored), a delete, a bad
    # record (to the DLQ with its reason).
    items = catalogue_items("c", 5, ts=T0)
    produce_items(settings, [
        *items,
        {**items[0], "attributes": {"title": "older"}, "ts": T0 - 1},
        {"item_id": "c1", "attributes": {}, "ts": T0 + 1, "deleted": True},
        b'{"item_id": "c9", "attributes": {"colour": "red"}, "ts": 0, "deleted": false}',
    ])
    want: dict[str, dict[str, Any] | None] = {i["item_id"]: i["attributes"] for i in items}
    want["c1"] = None

    wait_until(lambda: store_matches(store, exp), 120, "the exact features in Redis")
    wait_until(lambda: trending_matches(store, exp), 60, "the trending list")
    wait_until(lambda: catalogue_matches(store, want), 60, "the catalogue in Redis")
    # Hand-checked spot values: u1 has events 1, 5, 9, ... (15 events, types cycle by i % 5).
    (u1,) = store.read_users(["u1"])
    assert u1 is not None and u1.as_of_ms == T0 + 57 * 1_500
    assert sum(u1.counts["1h"].values()) == 15 and u1.counts["1h"]["impression"] == 3
    assert u1.history[0].item_id == f"i{(57 * 5) % 6}"

    positives = len(exp.samples)
    assert positives == 48  # 60 events, every 5th an impression (weight 0)
    records = consume(settings.kafka.bootstrap, settings.kafka.samples_topic, positives, 60)
    check_samples(records, exp, events)
    dlq = consume(settings.kafka.bootstrap, settings.kafka.dlq_topic, 3, 30)
    bad_items = [json.loads(r.value) for r in dlq if json.loads(r.value)["stage"] == "features.items"]
    assert len(bad_items) == 1 and bad_items[0]["topic"] == settings.kafka.items_topic
    assert bad_items[0]["reason"].startswith("attributes.colour: unknown attribute")
    bad = [json.loads(r.value) for r in dlq if json.loads(r.value)["stage"] != "features.items"]
    assert all(b["partition"] >= 0 and b["offset"] >= 0 for b in bad)
    assert sorted(b["raw"] for b in bad) == sorted(["not json", '{"event_id": "x"}'])
    reasons = sorted(b["reason"] for b in bad)
    assert len(reasons) == 2 and reasons[0].startswith("event_type") and "not JSON" in reasons[1]

    # Replaying the same events leaves the same store (a fresh sentinel marks "processed").
    snapshot = {
        k: client.hgetall(k)
        for k in client.keys(user_key_name(settings.redis.key_prefix, "*"))
    }
    sentinel = Event("sentinel", "sentinel-user", "i0", "click", T0)
    produce(settings, [*stream, sentinel])
    wait_until(lambda: store.read_users(["sentinel-user"])[0] is not None, 60, "the sentinel")
    snapshot.pop(user_key_name(settings.redis.key_prefix, "sentinel-user").encode(), None)
    after = {k: client.hgetall(k) for k in snapshot}
    assert after == snapshot


def latest_checkpoint(root: Path) -> Path | None:
    found = sorted(root.glob("*/chk-*/_metadata"), key=lambda p: int(p.parent.name.split("-")[1]))
    return found[-1].parent if found else None


def start_local(settings: Settings, args: Namespace, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "stream.flink.job", *job_args(args, settings)]
    return subprocess.Popen(
        cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
    )


def kill9(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the job's whole process group (the Python driver and its JVM)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.mark.timeout(900)
def test_kill9_and_restore_from_checkpoint(
    settings: Settings, store: RedisOnlineStore, tmp_path: Path
) -> None:
    settings = settings.model_copy(
        update={"flink": settings.flink.model_copy(update={"checkpoint_interval_ms": 3000})}
    )
    chk = tmp_path / "checkpoints"
    args = job_namespace(settings, tmp_path, local=True, checkpoint_dir=str(chk))
    params = FeatureParams.from_settings(settings.features, bucket_ms=args.bucket_ms)
    log = tmp_path / "job.log"
    a, b, c = make_events("r", 40), make_events("r", 30, 40), make_events("r", 30, 70)

    proc = start_local(settings, args, log)
    items = catalogue_items("k", 40)
    try:
        produce_items(settings, items[:20])
        produce(settings, a)
        exp_a = Expected(a, params)
        wait_until(lambda: store_matches(store, exp_a), 180, "batch A in Redis")
        first = wait_until(lambda: latest_checkpoint(chk), 60, "a completed checkpoint")
        # Wait for a checkpoint taken after A was fully processed, then process B and crash
        # right away: B is processed but (most likely) not yet checkpointed.
        wait_until(lambda: latest_checkpoint(chk) != first, 60, "a later checkpoint")
        produce(settings, b)
        exp_ab = Expected(a + b, params)
        wait_until(lambda: store_matches(store, exp_ab), 120, "batch B in Redis")
        b_visible = time.time()
        kill9(proc)
        produce(settings, c + a[:5])  # C while down, plus duplicates of old events
        produce_items(settings, items[10:])  # catalogue records while down (some again)
        restore = latest_checkpoint(chk)
        assert restore is not None
        # The restored checkpoint predates B: B is processed again after the restart.
        assert (restore / "_metadata").stat().st_mtime < b_visible
        proc = start_local(
            settings,
            job_namespace(
                settings, tmp_path, local=True, checkpoint_dir=str(chk), restore=str(restore)
            ),
            log,
        )
        exp = Expected(a + b + c + a[:5], params)
        wait_until(lambda: store_matches(store, exp), 180, "A+B+C exactly once in Redis")
        wait_until(
            lambda: catalogue_matches(store, {i["item_id"]: i["attributes"] for i in items}),
            60, "every catalogue item after the restart",
        )
        records = consume(
            settings.kafka.bootstrap, settings.kafka.samples_topic, len(exp.samples), 60
        )
        check_samples(records, exp, a + b + c)
    finally:
        kill9(proc)


def prefix_keys(client: Any, settings: Settings) -> list[bytes]:
    return list(client.scan_iter(match=f"{settings.redis.key_prefix}*", count=1000))


@pytest.mark.timeout(600)
def test_a_store_that_lost_its_data_is_rehydrated_from_the_job_state(
    settings: Settings, store: RedisOnlineStore, client: Any, cluster_job: Namespace
) -> None:
    """The store loses everything, then comes back from an older snapshot; no event is sent
    while it recovers, yet every record comes back exactly (stream/flink/rehydrate.py)."""
    from serving.store_health import StoreHealth

    params = FeatureParams.from_settings(settings.features, bucket_ms=cluster_job.bucket_ms)
    a, b = make_events("g", 40), make_events("g", 20, 40, users=7)
    produce(settings, a)
    exp_a = Expected(a, params)
    wait_until(lambda: store_matches(store, exp_a) and trending_matches(store, exp_a), 120,
               "batch A in Redis")
    gen = store.read_generation()
    assert gen.epoch is not None and not gen.rehydrating
    assert {p.split("/")[0] for p in gen.writes} == {"users", "items", "trending"}
    health = StoreHealth(store, ttl_s=0)
    health.status()  # this reader has seen the generation

    client.delete(*prefix_keys(client, settings))  # as a restart without persistence
    assert health.status().degraded  # lost, or re-written under a new epoch (grace)
    wait_until(lambda: store_matches(store, exp_a) and trending_matches(store, exp_a), 60,
               "every record re-written after the loss")
    wait_until(lambda: not store.read_generation().rehydrating, 30, "the rehydration to end")
    assert store.read_generation().epoch != gen.epoch

    snapshot = {k: client.dump(k) for k in prefix_keys(client, settings)}
    produce(settings, b)
    exp_ab = Expected(a + b, params)
    wait_until(lambda: store_matches(store, exp_ab) and trending_matches(store, exp_ab), 120,
               "batch B in Redis")
    client.delete(*prefix_keys(client, settings))  # as a restart from an older AOF/snapshot
    for k, v in snapshot.items():
        client.restore(k, 0, v)
    assert not store_matches(store, exp_ab)
    wait_until(lambda: store_matches(store, exp_ab) and trending_matches(store, exp_ab), 60,
               "the records written after the snapshot re-written")
    wait_until(lambda: not store.read_generation().rehydrating, 30, "the rehydration to end")
