"""The ingest API's metrics (names defined once, in ``streamrec.metric_names``).

Each app gets its own :class:`prometheus_client.CollectorRegistry`, so two apps in one process
(tests) never share counters. All figures here are lifetime counters/histograms; rates are
left to the scraper.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from streamrec import metric_names as names

ACCEPTED = names.INGEST_ACCEPTED
REJECTED = names.INGEST_REJECTED
REQUESTS = names.INGEST_REQUESTS
PRODUCE_LATENCY = names.INGEST_PRODUCE_LATENCY
BATCH_SIZE = names.INGEST_BATCH_SIZE

#: Reasons used as the ``reason`` label of :data:`REJECTED` and the ``outcome`` of requests.
REASON_INVALID = "invalid"
REASON_TOO_LARGE = "too_large"
REASON_UNAVAILABLE = "kafka_unavailable"
REASON_UNAUTHORIZED = "unauthorized"
REASON_UNSUPPORTED = "unsupported_media_type"


class IngestMetrics:
    """The ingest API's metrics, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.accepted = Counter(
            ACCEPTED, "Events acknowledged by Kafka and answered 202.", registry=registry
        )
        self.rejected = Counter(
            REJECTED,
            "Events (or requests, when the body could not be read) refused, by reason.",
            ["reason"],
            registry=registry,
        )
        self.requests = Counter(
            REQUESTS, "POST /events requests by HTTP status.", ["status"], registry=registry
        )
        self.produce_latency = Histogram(
            PRODUCE_LATENCY,
            "Time from the first send to the last Kafka acknowledgement of one request.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.batch_size = Histogram(
            BATCH_SIZE,
            "Events per accepted request.",
            buckets=(1, 10, 100, 1000, 5000, 10000),
            registry=registry,
        )
