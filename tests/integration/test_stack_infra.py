"""The foundation on real components: Kafka round trip, Redis, and a PyFlink job on the
standalone cluster reading and writing Kafka through the connector jar."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream.flink.submit import cancel_job, job_state, submit_python_job
from stream.kafka_client import ensure_topics, make_producer
from streamrec.settings import Settings
from tests.support import consume, wait_until

pytestmark = pytest.mark.integration


def test_kafka_round_trip(settings: Settings) -> None:
    producer = make_producer(settings.kafka)
    topic = settings.kafka.events_topic
    sent = [f"record-{i}".encode() for i in range(50)]
    for value in sent:
        producer.send(topic, key=b"u1", value=value)
    producer.flush(timeout=30)
    producer.close()
    got = consume(settings.kafka.bootstrap, topic, len(sent), timeout_s=30)
    # One key -> one partition -> order kept.
    assert [r.value for r in got] == sent


def test_redis_answers_ping(settings: Settings) -> None:
    import redis

    client = redis.Redis(host=settings.redis.host, port=settings.redis.port)
    assert client.ping() is True
    key = f"{settings.redis.key_prefix}probe"
    client.set(key, "1")
    assert client.get(key) == b"1"
    client.delete(key)


def test_pyflink_job_copies_a_topic_through_the_kafka_connector(settings: Settings) -> None:
    k = settings.kafka
    source, sink = k.events_topic, f"{k.events_topic}.copy"
    ensure_topics(k, [sink], partitions=1)
    producer = make_producer(k)
    sent = {f"hello-{i}".encode() for i in range(20)}
    for value in sent:
        producer.send(source, value=value)
    producer.flush(timeout=30)
    producer.close()

    job = Path(__file__).parent / "flink_jobs" / "copy_topic.py"
    job_id = submit_python_job(settings, job, [k.bootstrap, source, sink, f"{source}-copy"])
    try:
        wait_until(lambda: job_state(settings, job_id) == "RUNNING", 60, "the job to run")
        got = wait_until(
            lambda: (recs := consume(k.bootstrap, sink, len(sent), timeout_s=5))
            and len(recs) >= len(sent) and recs,
            120, "the copied records",
        )
        assert {r.value for r in got} == sent
    finally:
        cancel_job(settings, job_id)
