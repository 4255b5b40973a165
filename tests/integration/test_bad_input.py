"""Schemathesis against both OpenAPI documents, in process (ASGI), on the real Kafka/Redis:
whatever it generates, conforming to the schema or not, no answer is a 5xx. And a hostile log
on the backfill path (replay -> Kafka -> the Flink feature job): truncated lines, another
encoding, missing fields, times in the future and before 1990, a duplicate row, a binary blob.

The only 5xx either API may give by design is 503 (ingest: Kafka unavailable; serving: the
feature store unreachable, health while starting) — with the real stack up it must not occur
either, so every status >= 500 fails. Examples are bounded so the module stays under a minute.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from schemathesis import GenerationMode

from feature_store.store import HistoryEntry, Trending, UserFeatures, open_store
from model.artifact.files import write_artifact
from model.artifact.registry import Registry
from streamrec.ids import item_keys, user_key
from streamrec.settings import Settings
from tests.integration.test_flink_features import cluster_job  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration

ADMIN = "fuzz-admin-token"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BOUNDED = settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _drop_ts(body: Any) -> None:
    """Remove ``ts`` from generated events: the schema cannot state its time window, so
    without this almost no generated event is in range and none would reach Kafka."""
    for event in body if isinstance(body, list) else [body]:
        if isinstance(event, dict):
            event.pop("ts", None)


def _no_5xx(schema: Any, mode: GenerationMode, extra_headers: st.SearchStrategy[dict[str, str]],
            seen: Counter[str]) -> None:
    @BOUNDED
    @given(case=schema.as_strategy(mode), headers=extra_headers, drop_ts=st.booleans())
    def run(case: Any, headers: dict[str, str], drop_ts: bool) -> None:
        if drop_ts and mode is GenerationMode.POSITIVE and case.path == "/events":
            _drop_ts(case.body)
        response = case.call(headers=headers or None)
        seen[f"{case.method} {case.path} {response.status_code}"] += 1
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} answered {response.status_code}: "
            f"{response.text[:300]}\nreproduce: {case.as_curl_command()}"
        )

    run()


# --------------------------------------------------------------------------- ingest


@pytest.fixture
def ingest_schema(settings: Settings) -> Iterator[Any]:
    from stream.ingest.api import create_app

    s = settings.model_copy(update={"ingest": settings.ingest.model_copy(
        update={"max_body_bytes": 64 * 1024, "max_batch": 50})})
    app = create_app(s)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_ingest_api_never_answers_5xx(ingest_schema: Any, mode: GenerationMode) -> None:
    seen: Counter[str] = Counter()
    _no_5xx(ingest_schema, mode, st.just({}), seen)
    posted = {k: v for k, v in seen.items() if k.startswith("POST /events")}
    assert posted, seen  # the generator reached the route that matters
    if mode is GenerationMode.POSITIVE:
        assert any(k.endswith(" 202") for k in posted), posted
    else:
        assert any(k.endswith((" 422", " 415", " 413")) for k in posted), posted


# --------------------------------------------------------------------------- serving


def _publish(reg: Registry, version: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    items = [f"m{i}" for i in range(300)]

    def write(d: Path) -> None:
        write_artifact(
            d, version=version, item_ids=items, item_vectors=rng.normal(size=(300, 8)),
            item_hist_keys=item_keys(items), item_hist_rows=rng.normal(size=(300, 8)),
            user_keys=np.array([user_key("alice")]), user_rows=rng.normal(size=(1, 8)),
            default_user_row=np.zeros(8),
            layers=[(rng.normal(size=(16, 8)), np.zeros(8), "relu")],
            manifest_extra={"trained_through_ms": 1_772_000_000_000},
        )

    reg.publish(version, write)


@pytest.fixture
def serving_schema(settings: Settings) -> Iterator[Any]:
    from serving.app import create_app
    from serving.deps import ServingDeps

    s = settings.model_copy(update={
        "serving": settings.serving.model_copy(update={"admin_token": SecretStr(ADMIN)})})
    store = open_store(s)
    store.write_batch(
        users=[UserFeatures("alice", (HistoryEntry("m1", "click", 5000),), {}, 5000, 5000)],
        trending=Trending(tuple((f"m{i}", 50.0 - i) for i in range(40)), 5000),
    )
    client = redis.Redis(host=s.redis.host, port=s.redis.port)
    reg = Registry(s.trainer.registry_dir, s.trainer.model_name, redis_client=client,
                   key_prefix=s.redis.key_prefix)
    _publish(reg, "v1", 1)
    _publish(reg, "v2", 2)
    app = create_app(ServingDeps(s, store, clock=lambda: NOW, registry=reg, watch=False))
    try:
        yield schemathesis.openapi.from_asgi("/openapi.json", app)
    finally:
        store.close()
        client.close()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_serving_api_never_answers_5xx(serving_schema: Any, mode: GenerationMode) -> None:
    seen: Counter[str] = Counter()
    # Half the cases carry the real admin token, so pin/rollback get past authentication.
    admin = st.sampled_from([{}, {"X-Admin-Token": ADMIN}])
    _no_5xx(serving_schema, mode, admin, seen)
    routes = {k.rsplit(" ", 1)[0] for k in seen}
    assert any(r.startswith("GET /recommend") for r in routes), seen


# --------------------------------------------------------------------------- backfill


T_GOOD = 1_700_000_040_000  # event time of the first good row (2023-11-14)


def hostile_log(path: Path, good: int) -> tuple[list[dict[str, Any]], dict[str, int], list[bytes]]:
    """An NDJSON log of ``good`` valid rows with every kind of bad row mixed in.

    Returns the good events, the rejection count expected per reason, and the bad lines a
    producer other than replay could still put on the topic (for the DLQ)."""
    events = [{"event_id": f"ok-{i}", "user_id": f"u{i % 9}", "item_id": f"i{i % 23}",
               "event_type": "click" if i % 4 else "impression", "ts": T_GOOD + i * 1_000}
              for i in range(good)]
    rng = np.random.default_rng(11)
    blob = bytes(b for b in rng.integers(0, 256, 3_000, dtype=np.uint8).tolist() if b != 10)
    bad = {
        "truncated": json.dumps(events[3])[:29].encode(),
        "latin-1": b'{"event_id": "enc", "user_id": "caf\xe9", "item_id": "i1", '
                   b'"event_type": "click", "ts": 1700000040000}',
        "no item": json.dumps({**events[4], "event_id": "noitem", "item_id": None}).encode(),
        "future": json.dumps({**events[5], "event_id": "fut", "ts": 4_102_444_800_000}).encode(),
        "1985": json.dumps({**events[6], "event_id": "old", "ts": 489_024_000_000}).encode(),
        "duplicate": json.dumps(events[7]).encode(),
        "blob": blob,
    }
    lines = [json.dumps(e).encode() for e in events]
    for n, line in enumerate(bad.values()):
        lines.insert(40 + 30 * n, line)  # in the middle of the log
    path.write_bytes(b"\n".join(lines) + b"\n")
    expected = {"parse:json": 1, "parse:encoding": 1, "invalid:item_id": 1, "invalid:ts": 2,
                "duplicate": 1, "parse:binary": 1}
    return events, expected, [bad[k] for k in ("truncated", "latin-1", "no item", "blob")]


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("cluster_job")
def test_a_hostile_log_on_the_backfill_path(settings: Settings, tmp_path: Path) -> None:
    """Every bad row is counted by reason, every good row reaches the features exactly, and
    the bad records that reach Kafka by another way land in the DLQ with their reason."""
    from feature_store.features import Event, FeatureParams
    from stream.kafka_client import make_producer
    from stream.replay.runner import ReplayOptions, ReplaySource, run_replay
    from tests.integration.test_flink_features import Expected, store_matches
    from tests.support import consume, wait_until

    events, expected, raw_bad = hostile_log(tmp_path / "hostile.ndjson", 300)
    report = run_replay(settings, [ReplaySource.of(tmp_path / "hostile.ndjson")],
                        ReplayOptions(), ledger_dir=tmp_path / "ledger")
    assert report.rejected == expected, report.malformed
    assert report.sent == len(events) and report.planned == len(events)

    producer = make_producer(settings.kafka)  # a client that skips validation
    for raw in raw_bad:
        producer.send(settings.kafka.events_topic, key=b"u1", value=raw)
    producer.flush(timeout=30)
    producer.close()

    store = open_store(settings)
    try:
        exp = Expected([Event(e["event_id"], e["user_id"], e["item_id"], e["event_type"],
                              e["ts"]) for e in events],
                       FeatureParams.from_settings(settings.features, bucket_ms=60_000))
        wait_until(lambda: store_matches(store, exp), 180, "every good row in the features")
    finally:
        store.close()
    dlq = [json.loads(r.value) for r in
           consume(settings.kafka.bootstrap, settings.kafka.dlq_topic, len(raw_bad), 60)]
    assert len(dlq) == len(raw_bad)
    assert all(d["reason"] and d["offset"] >= 0 for d in dlq)
    samples = consume(settings.kafka.bootstrap, settings.kafka.samples_topic, len(exp.samples), 60)
    assert {json.loads(r.value)["sample_id"] for r in samples} == set(exp.samples)
