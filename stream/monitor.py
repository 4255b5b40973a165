"""The pipeline exporter: what no single process can report about itself, as Prometheus
metrics (names in ``streamrec.metric_names``).

Read at every scrape, each under its own deadline: the records ever written to ``events``,
``events.dlq`` and ``samples`` (their end offsets; ``rate()`` gives the write rate), the
feature job's consumer lag on ``events`` (against the offsets it committed at its last
checkpoint), whether Kafka and Redis answer, and the feature store's freshness (seconds since
the trending list's ``as_of``). The trainer commits no offsets: its lag is a recording rule in
``deploy/prometheus/rules.yml`` over its own ``streamrec_trainer_consumed_offsets``. Served
by ``streamrec exporter`` (port ``monitor.port``).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stream.http_routes import routes_server
from streamrec import metric_names as names
from streamrec.settings import Settings

log = logging.getLogger(__name__)

TOPIC_RECORDS = names.KAFKA_TOPIC_RECORDS  # a counter: exposed with ``_total``
CONSUMER_LAG = names.KAFKA_CONSUMER_LAG
KAFKA_UP = names.KAFKA_UP
REDIS_UP = names.REDIS_UP
FEATURE_FRESHNESS = names.FEATURE_FRESHNESS

#: The consumer group of the Flink feature job (``streamrec features --group-id``).
FEATURES_GROUP = "streamrec-features"


class PipelineCollector(Collector):
    """A custom collector; every figure is read when Prometheus scrapes."""

    def __init__(self, settings: Settings, clock: Callable[[], datetime],
                 timeout_s: float = 2.0, features_group: str = FEATURES_GROUP) -> None:
        self.settings = settings
        self.clock = clock
        self.timeout_s = timeout_s
        self.features_group = features_group
        self._lock = threading.Lock()
        self._consumer: Any = None
        self._admin: Any = None
        self._store: Any = None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._kafka()
            yield from self._redis()

    def _kafka(self) -> Iterator[Metric]:
        from kafka.errors import KafkaError

        from stream.kafka_client import end_offsets, offsets_consumer

        k = self.settings.kafka
        up = GaugeMetricFamily(KAFKA_UP, "Whether the exporter can read Kafka's offsets")
        records = CounterMetricFamily(
            TOPIC_RECORDS, "Records ever written to the topic (its end offsets summed)",
            labels=["stream", "topic"])
        lag = GaugeMetricFamily(
            CONSUMER_LAG, "Records not yet consumed (end minus committed offsets)",
            labels=["consumer", "stream"])
        try:
            if self._consumer is None:
                self._consumer = offsets_consumer(k.bootstrap, self.timeout_s)
            ends = {}
            for stream, topic in (("events", k.events_topic), ("dlq", k.dlq_topic),
                                  ("samples", k.samples_topic)):
                ends[stream] = end_offsets(self._consumer, topic, self.timeout_s)
                if ends[stream]:
                    records.add_metric([stream, topic], float(sum(ends[stream].values())))
            committed = self._committed(k.events_topic)
            if committed:
                behind = sum(max(0, end - committed.get(p, 0))
                             for p, end in ends["events"].items())
                lag.add_metric(["features", "events"], float(behind))
            up.add_metric([], 1.0)
        except KafkaError as exc:
            log.warning("kafka offsets unavailable: %s", exc)
            self._drop_kafka()
            up.add_metric([], 0.0)
        yield up
        yield records
        yield lag

    def _committed(self, topic: str) -> dict[int, int]:
        from kafka import KafkaAdminClient

        if self._admin is None:
            self._admin = KafkaAdminClient(
                bootstrap_servers=self.settings.kafka.bootstrap,
                request_timeout_ms=int(self.timeout_s * 1000) + 1000)
        from kafka.errors import KafkaError

        try:
            groups = self._admin.list_group_offsets({self.features_group: None})
        except KafkaError as exc:  # e.g. no such group yet: no lag figure, Kafka still up
            log.debug("offsets of group %s unavailable: %r", self.features_group, exc)
            return {}
        offsets = groups.get(self.features_group, {})
        return {tp.partition: int(meta.offset) for tp, meta in offsets.items()
                if tp.topic == topic and meta.offset >= 0}

    def _drop_kafka(self) -> None:
        for client in (self._consumer, self._admin):
            if client is not None:
                try:
                    client.close()
                except Exception as exc:  # noqa: BLE001 - closing a broken client; log, drop
                    log.debug("closing a Kafka client failed: %r", exc)
        self._consumer = self._admin = None

    def _redis(self) -> Iterator[Metric]:
        from feature_store.store import open_store

        up = GaugeMetricFamily(REDIS_UP, "Whether the feature store's Redis answers")
        fresh = GaugeMetricFamily(
            FEATURE_FRESHNESS,
            "Seconds since the event time the feature store's trending list is current to")
        try:
            if self._store is None:
                self._store = open_store(self.settings, timeout_s=self.timeout_s)
            trending = self._store.read_trending(1)
            up.add_metric([], 1.0)
            if trending is not None:
                age = self.clock().timestamp() - trending.as_of_ms / 1000.0
                fresh.add_metric([], age if math.isfinite(age) else math.nan)
        except Exception as exc:  # noqa: BLE001 - any store failure means "Redis is down"
            log.warning("feature store unavailable: %r", exc)
            store, self._store = self._store, None
            if store is not None:
                store.close()
            up.add_metric([], 0.0)
        yield up
        yield fresh

    def close(self) -> None:
        with self._lock:
            self._drop_kafka()
            if self._store is not None:
                self._store.close()
                self._store = None


class ExporterServer:
    """``GET /metrics`` (the collector) and ``GET /health`` on a background thread."""

    def __init__(self, host: str, port: int, collector: PipelineCollector) -> None:
        registry = CollectorRegistry()
        registry.register(collector)
        self.collector = collector

        self.httpd = routes_server(host, port, {
            "/metrics": lambda: (generate_latest(registry), CONTENT_TYPE_LATEST),
            "/health": lambda: (b'{"status":"ok"}', "application/json"),
        })

    def serve_forever(self) -> None:
        try:
            self.httpd.serve_forever()
        finally:
            self.httpd.server_close()
            self.collector.close()
