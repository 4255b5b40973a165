"""The pipeline exporter (stream/monitor.py) on the real Kafka and Redis: topic write counts,
the feature job's committed lag, Kafka and Redis up, the feature store's freshness."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from feature_store.store import Trending, open_store
from stream.monitor import PipelineCollector
from streamrec.settings import Settings
from tests.support import free_port

pytestmark = pytest.mark.integration

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def scrape(collector: PipelineCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in collector.collect() for s in family.samples}


def produce(settings: Settings, counts: dict[str, int]) -> None:
    from stream.kafka_client import make_producer

    producer = make_producer(settings.kafka)
    try:
        for topic, n in counts.items():
            for i in range(n):
                producer.send(topic, key=f"u{i}".encode(), value=b"{}")
        producer.flush(timeout=30)
    finally:
        producer.close()


def commit(settings: Settings, group: str, offsets: dict[int, int]) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, group_id=group,
                             enable_auto_commit=False)
    try:
        tps = {TopicPartition(settings.kafka.events_topic, p): o for p, o in offsets.items()}
        consumer.assign(list(tps))
        consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in tps.items()})
    finally:
        consumer.close()


def test_exporter_reads_kafka_and_redis(settings: Settings) -> None:
    from stream.kafka_client import topic_end_offsets

    k = settings.kafka
    produce(settings, {k.events_topic: 9, k.dlq_topic: 2, k.samples_topic: 4})
    ends = topic_end_offsets(k, k.events_topic, timeout_s=5.0)
    group = f"{k.events_topic}-features"
    committed = {p: end // 2 for p, end in ends.items()}
    commit(settings, group, committed)
    store = open_store(settings)
    store.write_batch(trending=Trending((("i1", 1.0),), int(NOW.timestamp() * 1000) - 30_000))
    store.close()

    collector = PipelineCollector(settings, lambda: NOW, features_group=group)
    try:
        got = scrape(collector)
    finally:
        collector.close()
    assert got[("streamrec_kafka_up", ())] == 1.0
    assert got[("streamrec_redis_up", ())] == 1.0
    for stream, topic, n in (("events", k.events_topic, 9), ("dlq", k.dlq_topic, 2),
                             ("samples", k.samples_topic, 4)):
        key = ("streamrec_kafka_topic_records_total", (("stream", stream), ("topic", topic)))
        assert got[key] == n
    lag = got[("streamrec_kafka_consumer_lag_records", (("consumer", "features"),
                                                         ("stream", "events")))]
    assert lag == 9 - sum(committed.values())
    assert got[("streamrec_feature_store_freshness_seconds", ())] == pytest.approx(30.0)


def test_exporter_reports_kafka_and_redis_down(settings: Settings) -> None:
    nowhere = settings.model_copy(update={
        "kafka": settings.kafka.model_copy(update={"port": free_port()}),
        "redis": settings.redis.model_copy(update={"port": free_port()}),
    })
    collector = PipelineCollector(nowhere, lambda: NOW, timeout_s=1.0)
    try:
        got = scrape(collector)
    finally:
        collector.close()
    assert got[("streamrec_kafka_up", ())] == 0.0
    assert got[("streamrec_redis_up", ())] == 0.0
    assert not any(name == "streamrec_kafka_topic_records_total" for name, _ in got)
