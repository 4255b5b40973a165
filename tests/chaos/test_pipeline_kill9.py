"""The whole pipeline on a private stack (Kafka, Redis with AOF, a Flink cluster, ingest API,
feature job, trainer, serving) under steady load; kill -9 of the Flink TaskManager (the job
restarts from its last checkpoint) and of the trainer (it restores its last checkpoint).

Checked once the load stops and the pipeline drained:

* every acknowledged event is in ``events`` (duplicates only from client retries);
* every acknowledged positive event has its sample (by ``sample_id``) and nothing else does;
* the trainer trained every record of ``samples`` exactly once (none skipped) and consumed
  the topic to its end; a sample re-emitted by the restarted job (same ``sample_id``) is
  dropped by the trainer, never trained twice;
* every user's features in Redis equal those of a clean run: the pure feature functions
  folded over the acknowledged events, deduplicated, in event-time order;
* serving answered every request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from feature_store.features import Event, FeatureParams, UserState, update_user, user_features
from feature_store.store import open_store
from tests.chaos.conftest import (
    USERS,
    EventLoad,
    RecommendLoad,
    ids_in,
    private_settings,
    private_stack,
    progress,
    read_topic,
)

pytestmark = pytest.mark.chaos

COMPONENTS = ["kafka", "redis", "flink-jobmanager", "flink-taskmanager", "ingest-api",
              "features", "trainer", "serving"]
BUCKET_MS = 60_000  # `streamrec features` default --bucket-ms


def trainer_status(url: str) -> dict[str, Any]:
    return httpx.get(url + "/health", timeout=5.0).json()


def trained(url: str) -> int:
    try:
        return int(trainer_status(url).get("samples_trained", 0))
    except (httpx.HTTPError, ValueError):
        return 0


def clean_run_features(events: list[dict[str, Any]], params: FeatureParams) -> dict[str, Any]:
    """User features computed from scratch: each distinct event once, in event-time order."""
    states: dict[str, UserState] = {}
    for e in sorted(events, key=lambda e: (e["ts"], e["event_id"])):
        state = states.setdefault(e["user_id"], UserState())
        update_user(state, Event(e["event_id"], e["user_id"], e["item_id"], e["event_type"],
                                 e["ts"], e.get("value"), e.get("context")), params)
    return {u: user_features(st, u, params) for u, st in states.items()}


def test_kill9_flink_taskmanager_and_trainer_under_load(tmp_path: Path) -> None:
    s = private_settings(tmp_path, flink=True, appendonly=True)
    with private_stack(s, COMPONENTS) as chaos:
        trainer_url = chaos.url("trainer")
        events = EventLoad(chaos.url("ingest-api"), batch=5, pause_s=0.05)
        recs = RecommendLoad(chaos.url("serving"), pause_s=0.05)
        events.start()
        recs.start()
        try:
            progress(lambda: trained(trainer_url) >= 100, "the trainer to train 100 samples", 420)
            for name in ("flink-taskmanager", "trainer"):
                before = trained(trainer_url)
                acked = events.acked_count()
                chaos.kill_and_restart(name, down_s=3.0)
                progress(lambda b=before, a=acked: trained(trainer_url) > b + 100
                         and events.acked_count() > a + 100,
                         f"samples to be trained again after killing {name}", 360)
        finally:
            events.finish()
            recs.finish()

        positives = events.positives

        def drained() -> bool:
            samples = read_topic(s, s.kafka.samples_topic)
            status = trainer_status(trainer_url)
            consumed = sum(int(v) for v in status.get("offsets", {}).values())
            return set(ids_in(samples, "sample_id")) >= positives and consumed == len(samples)

        progress(drained, "Flink and the trainer to drain the load", 300)
        event_records = read_topic(s, s.kafka.events_topic)
        sample_records = read_topic(s, s.kafka.samples_topic)
        status = trainer_status(trainer_url)
        store = open_store(s)
        users = [f"u{i}" for i in range(USERS)]
        stored = dict(zip(users, store.read_users(users), strict=True))
        store.close()

    counts = ids_in(event_records, "event_id")
    acked = set(events.acked)
    sample_counts = ids_in(sample_records, "sample_id")
    repeated_samples = {i: c for i, c in sample_counts.items() if c > 1}
    print(f"\nchaos pipeline: acked={len(acked)} event_records={len(event_records)} "
          f"positives={len(positives)} sample_records={len(sample_records)} "
          f"distinct_samples={len(sample_counts)} repeated_samples={len(repeated_samples)} "
          f"trained={status.get('samples_trained')} dlq={status.get('dlq_records')} "
          f"client_failures={dict(events.failures)} "
          f"recommend_failures={sum(1 for _, st, _ in recs.answers if st != 200)}")

    assert not acked - set(counts), "acknowledged events missing from the events topic"
    assert {i for i, c in counts.items() if c > 1} <= events.retried
    assert set(sample_counts) == positives, "samples do not match the positive events"
    assert recs.failures_outside([]) == [], "serving failed while it was up"
    unique_events = [json.loads(r.value) for r in event_records]
    first_by_id = {e["event_id"]: e for e in unique_events}
    expected = clean_run_features(list(first_by_id.values()),
                                  FeatureParams.from_settings(s.features, bucket_ms=BUCKET_MS))
    diverged = [u for u in users if stored[u] != expected.get(u)]
    assert not diverged, f"features differ from a clean run for {diverged[:5]}"
    # The samples sink is at-least-once: a restarted job re-emits, with the same sample_id,
    # the samples of events after its last checkpoint. The trainer drops those repeats.
    assert int(status["samples_trained"]) == len(sample_counts), "trained != distinct samples"
    assert int(status["duplicates_dropped"]) == len(sample_records) - len(sample_counts)
