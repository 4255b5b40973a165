"""Kafka helpers shared by ingest, replay, the trainer and the stack runner.

kafka-python is imported inside the functions so that modules importing this one stay light.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from feature_store.settings import KafkaSettings

log = logging.getLogger(__name__)

DLQ_RAW_LIMIT = 64 * 1024


class KafkaUnavailable(Exception):
    """The broker could not be reached (or did not answer) within the deadline."""


def make_producer(kafka: KafkaSettings, **overrides: Any) -> Any:
    """A producer that waits for all in-sync replicas (``acks=all``) and retries safely."""
    from kafka import KafkaProducer

    options: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap,
        "acks": "all",
        "linger_ms": 5,
        "retries": 5,
        "max_in_flight_requests_per_connection": 1,
        "request_timeout_ms": 10_000,
        "max_block_ms": 10_000,
    }
    options.update(overrides)
    return KafkaProducer(**options)


def ensure_topics(
    kafka: KafkaSettings,
    names: Iterable[str],
    partitions: int | None = None,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create the topics that do not exist yet; returns the names it created."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    wanted = list(dict.fromkeys(names))
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=kafka.bootstrap, request_timeout_ms=int(timeout_s * 1000)
        )
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot reach Kafka at {kafka.bootstrap}: {exc}") from exc
    try:
        existing = set(admin.list_topics())
        missing = [n for n in wanted if n not in existing]
        if missing:
            new = [
                NewTopic(
                    n,
                    num_partitions=partitions or kafka.partitions,
                    replication_factor=kafka.replication_factor,
                    topic_configs={"min.insync.replicas": str(kafka.min_insync_replicas)},
                )
                for n in missing
            ]
            try:
                admin.create_topics(new, timeout_ms=int(timeout_s * 1000))
            except TopicAlreadyExistsError:
                log.debug("topics created concurrently: %s", missing)
            log.info("created topics %s", ", ".join(missing))
        return missing
    finally:
        admin.close()


def dlq_record(
    reason: str, stage: str, topic: str, partition: int, offset: int, raw: bytes | str | None
) -> bytes:
    """The JSON value of an ``events.dlq`` record (format in DESIGN.md / README)."""
    if isinstance(raw, bytes):
        raw_text = raw[:DLQ_RAW_LIMIT].decode("utf-8", errors="replace")
    else:
        raw_text = (raw or "")[:DLQ_RAW_LIMIT]
    return json.dumps(
        {
            "reason": reason,
            "stage": stage,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "raw": raw_text,
        }
    ).encode()


def broker_ready(kafka: KafkaSettings, timeout_s: float = 3.0) -> bool:
    """True if the broker answers a metadata request within ``timeout_s``.

    A probe: "connection refused" is an expected answer here, so kafka-python's own error
    logging is silenced while it runs (``streamrec status`` with Kafka down prints a table,
    not a page of connection errors)."""
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    kafka_log = logging.getLogger("kafka")
    level = kafka_log.level
    kafka_log.setLevel(logging.CRITICAL)
    try:
        try:
            consumer = KafkaConsumer(
                bootstrap_servers=kafka.bootstrap,
                request_timeout_ms=int(timeout_s * 1000) + 1000,
                connections_max_idle_ms=int(timeout_s * 1000) + 5000,
                enable_auto_commit=False,
            )
        except KafkaError:
            return False
        try:
            return consumer.topics() is not None
        except KafkaError:
            return False
        finally:
            consumer.close()
    finally:
        kafka_log.setLevel(level)
