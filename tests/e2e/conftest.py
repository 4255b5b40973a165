"""The whole pipeline on the test stack: ingest API, Flink feature job, trainer and serving
started as real processes (the same commands `streamrec up` runs) on their own topics and
Redis key prefix."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from feature_store.settings import Settings, to_env

SERVICES = ["ingest-api", "features", "trainer", "serving"]


@pytest.fixture(scope="session")
def pipeline(stack: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from deploy.stack import Stack
    from stream.kafka_io import ensure_topics

    uid = f"e{uuid.uuid4().hex[:8]}"
    root: Path = tmp_path_factory.mktemp("pipeline")
    s = stack.model_copy(update={
        "kafka": stack.kafka.model_copy(update={
            "events_topic": f"{uid}.events", "dlq_topic": f"{uid}.events.dlq",
            "samples_topic": f"{uid}.samples"}),
        "redis": stack.redis.model_copy(update={"key_prefix": f"{uid}:"}),
        "trainer": stack.trainer.model_copy(update={
            "group_id": f"{uid}-trainer", "registry_dir": root / "models",
            "checkpoint_dir": root / "trainer", "export_every_s": 5.0}),
        "serving": stack.serving.model_copy(update={"poll_interval_s": 1.0}),
        "stack": stack.stack.model_copy(update={"ready_timeout_s": 240.0}),
    })
    ensure_topics(s.kafka, [s.kafka.events_topic, s.kafka.dlq_topic, s.kafka.samples_topic])
    saved = dict(os.environ)
    os.environ.update(to_env(s))
    runner = Stack(s, available_commands={"ingest-api", "features", "train", "serve"})
    try:
        runner.up(SERVICES)
        yield s
    finally:
        try:
            runner.down(SERVICES)
            _cancel_feature_job(s)
        finally:
            os.environ.clear()
            os.environ.update(saved)


def _cancel_feature_job(s: Settings) -> None:
    from stream.flink_submit import cancel_job, list_jobs

    for job in list_jobs(s):
        if job.get("state") == "RUNNING" and str(job.get("name", "")).endswith(s.kafka.events_topic):
            cancel_job(s, str(job["jid"]))
