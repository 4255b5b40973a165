"""The updates topic's consumer on a real broker, through both clients: records in order
with their offsets (a large one too), seeks by time and offset, and the end."""

from __future__ import annotations

import time

import pytest

from stream.kafka_client import (
    ensure_updates_topic,
    seek_to_time,
    updates_consumer,
    updates_producer,
)
from streamrec.settings import Settings


def _drain(consumer: object, want: int, deadline_s: float = 30.0) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    end = time.monotonic() + deadline_s
    while len(got) < want and time.monotonic() < end:
        for records in consumer.poll(timeout_ms=200).values():  # type: ignore[attr-defined]
            got.extend((r.offset, r.value) for r in records)
    return got


@pytest.mark.parametrize("backend", ["confluent", "kafka-python"])
def test_updates_consumer_reads_in_order_and_seeks_by_time_and_offset(
    settings: Settings, backend: str
) -> None:
    pytest.importorskip("confluent_kafka")
    from kafka import TopicPartition

    topic = settings.kafka.updates_topic
    ensure_updates_topic(settings.kafka)
    now = int(time.time() * 1000)
    values = [b"a" * 10, b"b" * (3 << 20), b"c" * 10]  # the middle one past 1 MB defaults
    producer = updates_producer(settings.kafka)
    for i, value in enumerate(values):
        producer.send(topic, value=value, timestamp_ms=now - 3000 + 1000 * i)
    producer.flush()
    producer.close()

    consumer = updates_consumer(settings.kafka, backend)
    try:
        seek_to_time(consumer, topic, now - 10_000)
        assert _drain(consumer, 3) == list(enumerate(values))
        seek_to_time(consumer, topic, now - 1500)  # the third record's time is after it
        assert _drain(consumer, 1) == [(2, values[2])]
        consumer.seek(TopicPartition(topic, 0), 1)
        assert [o for o, _ in _drain(consumer, 2)] == [1, 2]
        seek_to_time(consumer, topic, now + 60_000)  # nothing at or after: the end
        assert consumer.poll(timeout_ms=300) == {}
        producer = updates_producer(settings.kafka)
        producer.send(topic, value=b"d")
        producer.flush()
        producer.close()
        assert _drain(consumer, 1) == [(3, b"d")]
    finally:
        consumer.close()
