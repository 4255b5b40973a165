"""Helpers shared by the test suites and the benchmarks (``bench/`` imports them): bounded
waits, free ports, HTTP probes, child processes and their environment, Kafka reads, paths."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# the helpers the benchmarks share live in bench.harness (nothing of ours imports tests)
from bench.harness import (  # noqa: E402,F401
    free_port,
    http_ok,
    service_env,
    stop_process,
    wait_until,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


def repo_root() -> Path:
    return REPO_ROOT


def shared_data() -> Path:
    """The shared data folder that sits beside the clone (``../shared/data``)."""
    return REPO_ROOT.parent / "shared" / "data"


def consume(bootstrap: str, topic: str, n: int, timeout_s: float = 30.0) -> list[Any]:
    """Read ``topic`` from the beginning until ``n`` records arrived or the deadline passes.

    Returns what it read (possibly more than ``n`` if more were there); the caller asserts.
    """
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        consumer_timeout_ms=1000,
    )
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(records) < n:
            batch = consumer.poll(timeout_ms=500, max_records=10_000)
            for part in batch.values():
                records.extend(part)
        # One more short poll so that "more than expected" can be seen by the caller.
        for part in consumer.poll(timeout_ms=300).values():
            records.extend(part)
    finally:
        consumer.close()
    return records


def produce(settings: Any, topic: str, records: Iterable[tuple[str, bytes]]) -> None:
    """Send (key, value) records to ``topic`` and wait until Kafka acknowledged them all."""
    from stream.kafka_client import make_producer

    producer = make_producer(settings.kafka, linger_ms=20, batch_size=256 * 1024)
    try:
        for key, value in records:
            producer.send(topic, key=key.encode(), value=value)
        producer.flush(timeout=60)
    finally:
        producer.close()


def produce_samples(settings: Any, samples: Iterable[Any]) -> None:
    """Training samples (``model.trainer.samples.Sample``) onto the samples topic, keyed by user."""
    from model.trainer.samples import encode_sample

    produce(settings, settings.kafka.samples_topic,
            ((s.user_id, encode_sample(s)) for s in samples))


def isolated_settings(stack: Any, root: Path, prefix: str = "t") -> Any:
    """Settings derived from the test stack's with their own topics (created here), Redis key
    prefix, trainer consumer group, model registry and checkpoints under ``root``."""
    import uuid

    from stream.kafka_client import ensure_topics

    uid = f"{prefix}{uuid.uuid4().hex[:10]}"
    s = stack.model_copy(update={
        "kafka": stack.kafka.model_copy(update={
            "events_topic": f"{uid}.events",
            "dlq_topic": f"{uid}.events.dlq",
            "samples_topic": f"{uid}.samples",
            "updates_topic": f"{uid}.updates",
            "items_topic": f"{uid}.items",
        }),
        "redis": stack.redis.model_copy(update={"key_prefix": f"{uid}:"}),
        "trainer": stack.trainer.model_copy(update={
            "group_id": f"{uid}-trainer",
            "registry_dir": root / "models",
            "checkpoint_dir": root / "trainer",
        }),
    })
    ensure_topics(s.kafka, [s.kafka.events_topic, s.kafka.dlq_topic, s.kafka.samples_topic,
                     s.kafka.items_topic])
    return s


