"""Every Prometheus metric the serving API exports (names in ``streamrec.metric_names``).

Metrics live on a per-app ``CollectorRegistry`` (no process-global state); lifetime counters
only, windowed rates are PromQL's job. With several workers the values live in
``prometheus_client``'s multiprocess files under ``multiprocess_dir`` and
:attr:`ServingMetrics.exposition` merges every worker's, so ``/metrics`` and the dashboard of
any worker show the whole server (counters and histograms summed; the model gauges over the
live workers: the oldest version, the largest item count). Ages are computed at scrape time
from stored timestamps (``*_model_created_timestamp_seconds`` -> ``*_model_version_age_seconds``);
a worker without a model stores ``+Inf`` so it does not hide the others' age.
"""

from __future__ import annotations

import glob
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from streamrec import metric_names as names

REQUEST_SECONDS = names.SERVING_REQUEST_SECONDS
MODEL_VERSION_AGE = names.SERVING_MODEL_VERSION_AGE
MODEL_CREATED = names.SERVING_MODEL_CREATED
MODEL_TRAINED_THROUGH = names.SERVING_MODEL_TRAINED_THROUGH
MODEL_TRAINED_THROUGH_AGE = names.SERVING_MODEL_TRAINED_THROUGH_AGE
MODEL_SWAPS = names.SERVING_MODEL_SWAPS
MODEL_REFUSED = names.SERVING_MODEL_REFUSED
FALLBACKS = names.SERVING_FALLBACKS
MODEL_ITEMS = names.SERVING_MODEL_ITEMS
ANN_BUILDS = names.SERVING_ANN_BUILDS
ANN_EXACT_ROWS = names.SERVING_ANN_EXACT_ROWS
STORE_STATE = names.SERVING_STORE_STATE

#: Reasons counted by ``fallbacks``.
NO_MODEL = "no_model"
STORE_ERROR = "store_error"
STORE_REHYDRATING = "store_not_whole"
PADDED = "padded_with_trending"
MODEL_ERROR = "model_error"
INTERNAL_ERROR = "internal_error"

_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1,
            0.25, 0.5, 1.0)

#: Derived at scrape time: (stored timestamp gauge, age gauge, help of the age gauge).
_AGES = (
    (MODEL_CREATED, MODEL_VERSION_AGE,
     "Seconds since the served version was created (the oldest a live worker serves; NaN: no "
     "model)"),
    (MODEL_TRAINED_THROUGH, MODEL_TRAINED_THROUGH_AGE,
     "Seconds since the event time the served version is trained through (NaN: unknown)"),
)

_LIVE_FILE = re.compile(r"gauge_live\w+?_(\d+)\.db$")


class ServingMetrics:
    """The serving metrics, registered on ``registry``; read them through :attr:`exposition`.

    ``clock`` turns the stored timestamps into ages at scrape time; ``multiprocess_dir``
    (only when ``PROMETHEUS_MULTIPROC_DIR`` was set before ``prometheus_client`` was first
    imported) makes :attr:`exposition` merge every worker's files there.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], datetime] | None = None,
        multiprocess_dir: str | Path | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.multiprocess_dir = str(multiprocess_dir) if multiprocess_dir else None
        r = self.registry
        self.request_seconds = Histogram(
            REQUEST_SECONDS, "GET /recommend latency by answer source", ["source"],
            buckets=_BUCKETS, registry=r,
        )
        self.created = Gauge(
            MODEL_CREATED,
            "Creation time of the served version, the oldest one a live worker serves "
            "(+Inf: no model)",
            registry=r, multiprocess_mode="livemin",
        )
        self.trained_through = Gauge(
            MODEL_TRAINED_THROUGH,
            "Event time the served version is trained through, the oldest over live workers "
            "(+Inf: unknown)",
            registry=r, multiprocess_mode="livemin",
        )
        self.created.set(math.inf)
        self.trained_through.set(math.inf)
        self.swaps = Counter(MODEL_SWAPS, "Model versions swapped in", registry=r)
        self.refused = Counter(
            MODEL_REFUSED, "Model versions refused at load, by reason", ["reason"], registry=r
        )
        self.fallbacks = Counter(
            FALLBACKS, "Requests answered (partly) without the model, by reason", ["reason"],
            registry=r,
        )
        self.items = Gauge(MODEL_ITEMS, "Items in the served version (largest over live "
                           "workers)", registry=r, multiprocess_mode="livemax")
        self.ann_builds = Counter(ANN_BUILDS, "ANN indexes built (model.scoring.ann): one per "
                                  "version of a large catalogue, and when deltas changed too "
                                  "much of it", registry=r)
        self.ann_exact_rows = Gauge(
            ANN_EXACT_ROWS, "Rows every request scores exactly beside the ANN index's candidates "
            "(changed since the index was built, the prior's top; largest over live workers; "
            "0: exact search or none)", registry=r, multiprocess_mode="livemax")
        self.store_state = Gauge(
            STORE_STATE, "1 for the online store's current state (serving.store_health): "
            "whole, rehydrating, lost or unknown (the most recent reading of live workers)",
            ["state"], registry=r, multiprocess_mode="livemostrecent",
        )
        self._store_state: Callable[[], str] | None = None
        source: Collector
        if self.multiprocess_dir is not None:
            source = _LiveWorkers(self.multiprocess_dir)
        else:
            source = _RegistrySource(self.registry)
        self.exposition = CollectorRegistry()
        """What ``/metrics`` and the dashboard read: every worker's values, ages derived."""
        self.exposition.register(_WithAges(source, clock))

    def track_store_state(self, state: Callable[[], str]) -> None:
        """Where the store's state is read: at each scrape (:meth:`refresh_store_state`)."""
        self._store_state = state
        self.refresh_store_state()

    def refresh_store_state(self) -> None:
        """Record the store's state now (a value per state, 1 for the current one: a worker
        writes values, as every worker's metrics are files in multiprocess mode)."""
        if self._store_state is None:
            return
        from serving.store_health import STATES

        now = self._store_state()
        for name in STATES:
            self.store_state.labels(name).set(float(now == name))

    def served(self, created: datetime | None, trained_through_ms: int | None) -> None:
        """Record the version this worker now serves (``None``: unknown)."""
        self.created.set(created.timestamp() if created else math.inf)
        self.trained_through.set(trained_through_ms / 1000.0 if trained_through_ms else math.inf)

    def worker_exited(self) -> None:
        """Drop this worker's live gauges (call when the worker process stops)."""
        if self.multiprocess_dir is not None:
            mark_process_dead(os.getpid(), self.multiprocess_dir)


class _RegistrySource(Collector):
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return self.registry.collect()


class _LiveWorkers(Collector):
    """The merged multiprocess files, after dropping the live gauges of workers that died
    without saying so (SIGKILL; uvicorn starts a replacement under a new pid)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.merged = MultiProcessCollector(None, path=path)

    def collect(self) -> Iterable[Metric]:
        for name in glob.glob(os.path.join(self.path, "gauge_live*.db")):
            match = _LIVE_FILE.search(name)
            if match and not _alive(int(match.group(1))):
                mark_process_dead(int(match.group(1)), self.path)
        return self.merged.collect()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _WithAges(Collector):
    """Everything ``source`` yields, with the stored timestamps also shown as ages."""

    def __init__(self, source: Collector, clock: Callable[[], datetime] | None) -> None:
        self.source = source
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        ages = {stamp: (age, text) for stamp, age, text in _AGES}
        for family in self.source.collect():
            yield family
            if family.name in ages and self.clock is not None:
                name, text = ages[family.name]
                stamp = family.samples[0].value if family.samples else math.inf
                now = self.clock().timestamp()
                yield GaugeMetricFamily(
                    name, text, value=now - stamp if math.isfinite(stamp) else math.nan)
