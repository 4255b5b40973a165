"""The item catalogue on the real stack: POST /items lands on the items topic field by field,
bad input is refused naming the field (nothing written), and through the feature job a posted
or replayed item is served by GET /items/{id}."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from feature_store.redis_store import RedisOnlineStore
from stream.ingest.api import create_app as create_ingest
from streamrec.settings import Settings
from tests.integration.test_flink_features import cluster_job  # noqa: F401 - a fixture
from tests.support import consume, wait_until

pytestmark = pytest.mark.integration

NOW_MS = int(datetime(2025, 6, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)
MOVIES = """movieId,title,genres
1,Toy Story (1995),Adventure|Animation|Children|Comedy|Fantasy
2,"American President, The (1995)",Comedy|Drama|Romance
3,Nothing Listed (2000),(no genres listed)
"""


@pytest.fixture
def ingest(settings: Settings) -> Iterator[TestClient]:
    small = settings.model_copy(
        update={"ingest": settings.ingest.model_copy(update={"max_item_batch": 3})}
    )
    with TestClient(create_ingest(small, clock_ms=lambda: NOW_MS)) as c:
        yield c


@pytest.fixture
def serving(settings: Settings, store: RedisOnlineStore) -> Iterator[TestClient]:
    from fastapi import FastAPI

    from serving.errors import install
    from serving.features_api import features_router

    app = FastAPI()
    install(app)
    app.include_router(features_router(store))
    with TestClient(app) as c:
        yield c


def test_posted_items_arrive_on_the_items_topic(settings: Settings, ingest: TestClient) -> None:
    resp = ingest.post("/items", json=[
        {"item_id": "a", "attributes": {"category": "shoes", "tags": ["x", "y", "x"]}},
        {"item_id": "b", "attributes": {"price": 19.5}, "ts": "2025-06-01T11:00:00Z"},
        {"item_id": "c", "deleted": True},
    ])
    assert resp.status_code == 202, resp.text
    assert resp.json() == {"accepted": 3, "item_ids": ["a", "b", "c"]}
    records = consume(settings.kafka.bootstrap, settings.kafka.items_topic, 3, timeout_s=30)
    got = {r.key: json.loads(r.value) for r in records}
    assert got == {
        b"a": {"item_id": "a", "attributes": {"category": "shoes", "tags": ["x", "y"]},
               "ts": NOW_MS, "deleted": False},
        b"b": {"item_id": "b", "attributes": {"price": 19.5}, "ts": NOW_MS - 3_600_000,
               "deleted": False},
        b"c": {"item_id": "c", "attributes": {}, "ts": NOW_MS, "deleted": True},
    }  # fmt: skip
    assert list(json.loads(records[0].value)) == ["item_id", "attributes", "ts", "deleted"]


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"item_id": "a", "attributes": {"colour": "red"}}, "attributes.colour"),
        ({"item_id": "a", "attributes": {"genres": ["ok", 7]}}, "attributes.genres[1]"),
        ({"item_id": "a", "attributes": {"price": "cheap"}}, "attributes.price"),
        ({"item_id": "a", "attributes": {"title": "t" * 5000}}, "attributes.title"),
    ],
)
def test_bad_items_are_refused_naming_the_field(
    settings: Settings, ingest: TestClient, item: dict[str, Any], field: str
) -> None:
    resp = ingest.post("/items", json=[{"item_id": "fine"}, item])
    assert resp.status_code == 422, resp.text
    assert resp.json()["errors"][0]["field"] == field and resp.json()["errors"][0]["index"] == 1


def test_a_batch_over_the_limit_is_413_and_nothing_is_written(
    settings: Settings, ingest: TestClient
) -> None:
    resp = ingest.post("/items", json=[{"item_id": f"i{n}"} for n in range(4)])
    assert resp.status_code == 413, resp.text
    # nothing of the refused requests reached the topic: the next record is the first one
    assert ingest.post("/items", json={"item_id": "only"}).status_code == 202
    [record] = consume(settings.kafka.bootstrap, settings.kafka.items_topic, 1, timeout_s=30)
    assert record.key == b"only" and record.offset == 0


def same_partition_id(key: bytes, partitions: int) -> str:
    """An item id that Kafka's default keyed partitioner (murmur2) puts beside ``key``."""
    from kafka.partitioner.default import murmur2

    def part(k: bytes) -> int:
        return (murmur2(k) & 0x7FFFFFFF) % partitions

    return next(f"s{n}" for n in range(1000) if part(f"s{n}".encode()) == part(key))


def replay_items(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """``streamrec replay --items ...`` in a child process with this test's settings."""
    from tests.support import repo_root

    env = {
        **settings_env(settings),
        "PYTHONPATH": str(repo_root()),
    }
    code = "import sys; from deploy.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "replay", "--no-progress", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )


def settings_env(settings: Settings) -> dict[str, str]:
    import os

    return {
        **os.environ,
        "STREAMREC_KAFKA__HOST": settings.kafka.host,
        "STREAMREC_KAFKA__PORT": str(settings.kafka.port),
        "STREAMREC_KAFKA__ITEMS_TOPIC": settings.kafka.items_topic,
        "STREAMREC_STACK__RUN_DIR": str(settings.stack.run_dir),
    }


@pytest.mark.timeout(600)
def test_posted_and_replayed_items_are_served(
    settings: Settings,
    store: RedisOnlineStore,
    ingest: TestClient,
    serving: TestClient,
    cluster_job: Namespace,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    assert ingest.post("/items", json=[
        {"item_id": "p1", "attributes": {"brand": "acme", "title": "A red shoe"}},
        {"item_id": "p2", "attributes": {"genres": ["Drama"]}, "ts": NOW_MS - 10},
    ]).status_code == 202  # fmt: skip
    found = wait_until(
        lambda: (r := serving.get("/items/p1")).status_code == 200 and r.json(),
        90, "the posted item served",
    )
    assert found == {
        "item_id": "p1", "attributes": {"brand": "acme", "title": "A red shoe"}, "ts": NOW_MS
    }
    assert serving.get("/items/p2").json()["ts"] == NOW_MS - 10
    assert serving.get("/items/never-posted").status_code == 404

    movies = tmp_path / "movies.csv"
    movies.write_text(MOVIES)
    tags = tmp_path / "tags.csv"
    tags.write_text("userId,movieId,tag,timestamp\n7,2,politics,1139045764\n")
    done = replay_items(settings, "--items", str(movies), "--tags", str(tags))
    assert done.returncode == 0, done.stderr
    assert "replayed 3 items" in done.stdout
    wait_until(lambda: serving.get("/items/m3").status_code == 200, 90, "the replayed movies")
    assert serving.get("/items/m2").json() == {
        "item_id": "m2",
        "attributes": {
            "genres": ["Comedy", "Drama", "Romance"],
            "title": "American President, The (1995)",
            "tags": ["politics"],
        },
        "ts": 0,
    }
    # a delete posted later removes the item; the replayed file (ts 0) does not bring it back
    assert ingest.post("/items", json={"item_id": "m1", "deleted": True}).status_code == 202
    wait_until(lambda: serving.get("/items/m1").status_code == 404, 90, "the delete")
    assert replay_items(settings, "--items", str(movies)).returncode == 0
    # an item of m1's partition posted after the replay: once it is served, so is m1's record
    sentinel = same_partition_id(b"m1", settings.kafka.partitions)
    assert ingest.post("/items", json={"item_id": sentinel}).status_code == 202
    wait_until(lambda: serving.get(f"/items/{sentinel}").status_code == 200, 90, "the sentinel")
    assert serving.get("/items/m1").status_code == 404

    # a bad catalogue file fails the replay with a non-zero exit naming the line
    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"item_id": "x", "attributes": {"colour": "red"}}\n')
    failed = replay_items(settings, "--items", str(bad))
    assert failed.returncode == 1 and "bad.ndjson:1: attributes.colour" in failed.stderr
