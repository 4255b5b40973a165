"""The trainer's metrics (names in ``streamrec.metric_names``) and its tiny /health +
/metrics HTTP server.

Rolling (windowed) figures are gauges named ``*_rolling``; lifetime figures are counters or
``*_lifetime`` gauges, kept apart (CONVENTIONS.md 10).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from stream.http_routes import routes_server
from streamrec import metric_names as names

log = logging.getLogger(__name__)



class TrainerMetrics:
    """Prometheus collectors of one trainer, in their own registry (no global state)."""

    def __init__(self, k: int = 10) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.samples = Counter(names.TRAINER_SAMPLES, "Samples trained (this process)", registry=r)
        self.samples_total = Gauge(
            names.TRAINER_SAMPLES_LIFETIME, "Samples trained, restored across restarts", registry=r
        )
        self.dlq = Counter(names.TRAINER_DLQ, "Samples sent to the dead-letter topic", registry=r)
        self.catalogue_items = Counter(
            names.TRAINER_CATALOGUE_ITEMS,
            "Catalogue records (upserts and deletes) the trainer applied to its attribute slots",
            registry=r,
        )
        self.duplicates = Counter(
            names.TRAINER_DUPLICATES, "Samples skipped: their sample_id was trained already",
            registry=r,
        )
        self.batches = Counter(names.TRAINER_BATCHES, "Training steps", registry=r)
        self.exports = Counter(names.TRAINER_EXPORTS, "Versions published", registry=r)
        self.loss = Gauge(names.TRAINER_LOSS, "Loss of the last batch", registry=r)
        self.step_seconds = Histogram(
            names.TRAINER_STEP_SECONDS, "Wall time of evaluate+train per batch", registry=r,
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0),
        )
        self.export_seconds = Histogram(
            names.TRAINER_EXPORT_SECONDS, "Wall time of checkpoint+export", registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.deltas = Counter(names.TRAINER_DELTAS, "Deltas published", registry=r)
        self.delta_rows = Histogram(
            names.TRAINER_DELTA_ROWS, "User and item rows per delta", registry=r,
            buckets=(10, 100, 1000, 5000, 20_000, 100_000, 1_000_000),
        )
        self.delta_seconds = Histogram(
            names.TRAINER_DELTA_SECONDS, "Wall time of building and sending a delta", registry=r,
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        self.guard_held = Gauge(
            names.TRAINER_GUARD_HELD, "1 while the quality guard holds publication", registry=r
        )
        self.guard_held_seconds = Gauge(
            names.TRAINER_GUARD_HELD_SECONDS,
            "Seconds the quality guard's current hold has lasted (0: not holding)", registry=r,
        )
        self.guard_recall = Gauge(
            names.TRAINER_GUARD_RECALL, "The quality guard's Recall@K figures (current, healthy)",
            ["figure"], registry=r,
        )
        self.guard_holds = Counter(names.TRAINER_GUARD_HOLDS, "Holds of the quality guard", registry=r)
        self.guard_rollbacks = Counter(
            names.TRAINER_GUARD_ROLLBACKS, "Rollbacks of serving to a healthy version", registry=r
        )
        self.quality = Gauge(
            names.TRAINER_QUALITY, "Test-then-train figures over the rolling window",
            ["metric"], registry=r,
        )
        self.quality_lifetime = Gauge(
            names.TRAINER_QUALITY_LIFETIME, "Test-then-train figures since start", ["metric"], registry=r
        )
        self.table_rows = Gauge(names.TRAINER_TABLE_ROWS, "Rows per embedding table", ["table"], registry=r)
        self.trained_through = Gauge(
            names.TRAINER_TRAINED_THROUGH, "Event time of the newest trained sample",
            registry=r
        )
        self.consumed_offsets = Gauge(
            names.TRAINER_CONSUMED_OFFSETS,
            "Next samples-topic offset to train, summed over partitions (the topic's end "
            "offsets minus this is the trainer's lag in records)", registry=r,
        )
        self.fetch_wait = Histogram(
            names.TRAINER_FETCH_WAIT_SECONDS, "Training loop waiting on the samples queue for "
            "a chunk (up to its 0.1 s poll while idle)", registry=r,
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
        )
        self.k = k

    def set_quality(self, summary: dict[str, float]) -> None:
        for name, value in summary.items():
            if name.startswith("lifetime_"):
                self.quality_lifetime.labels(name[len("lifetime_"):]).set(value)
            elif name != "evaluated_samples":
                self.quality.labels(name).set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HealthServer:
    """``GET /health`` (JSON from ``status()``) and ``GET /metrics`` on a background thread."""

    def __init__(
        self, host: str, port: int, metrics: TrainerMetrics, status: Callable[[], dict[str, Any]],
        json_routes: dict[str, Callable[[], Any]] | None = None,
    ) -> None:
        """``json_routes``: more ``GET`` paths answering the JSON of a callable."""
        self.metrics = metrics
        self.status = status
        extra = {
            path: (lambda fn=fn: (json.dumps(fn()).encode(), "application/json"))
            for path, fn in (json_routes or {}).items()
        }
        self.httpd = routes_server(host, port, {
            "/health": lambda: (json.dumps(self.status()).encode(), "application/json"),
            "/metrics": lambda: (self.metrics.render(), CONTENT_TYPE_LATEST),
            **extra,
        })
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="trainer-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        log.info("trainer health/metrics on port %d", self.port)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)
