"""Every Prometheus metric the serving API exports, defined in this one module.

Metrics live on a per-app ``CollectorRegistry`` (no process-global state), so several apps
(tests) can coexist in one process. Lifetime counters only; windowed rates are PromQL's job.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "streamrec_serving"
REQUEST_SECONDS = f"{PREFIX}_request_seconds"
MODEL_VERSION_AGE = f"{PREFIX}_model_version_age_seconds"
MODEL_SWAPS = f"{PREFIX}_model_swaps"
MODEL_REFUSED = f"{PREFIX}_model_refused"
FALLBACKS = f"{PREFIX}_fallbacks"
MODEL_ITEMS = f"{PREFIX}_model_items"
STORE_STATE = f"{PREFIX}_store_state"

#: Reasons counted by ``fallbacks``.
NO_MODEL = "no_model"
UNKNOWN_USER = "unknown_user"
STORE_ERROR = "store_error"
STORE_REHYDRATING = "store_not_whole"
PADDED = "padded_with_trending"
MODEL_ERROR = "model_error"
INTERNAL_ERROR = "internal_error"

_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1,
            0.25, 0.5, 1.0)


class ServingMetrics:
    """The serving metrics, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.request_seconds = Histogram(
            REQUEST_SECONDS, "GET /recommend latency by answer source", ["source"],
            buckets=_BUCKETS, registry=r,
        )
        self.version_age = Gauge(
            MODEL_VERSION_AGE, "Seconds since the served version was created (NaN: no model)",
            registry=r,
        )
        self.swaps = Counter(MODEL_SWAPS, "Model versions swapped in", registry=r)
        self.refused = Counter(
            MODEL_REFUSED, "Model versions refused at load, by reason", ["reason"], registry=r
        )
        self.fallbacks = Counter(
            FALLBACKS, "Requests answered (partly) without the model, by reason", ["reason"],
            registry=r,
        )
        self.items = Gauge(MODEL_ITEMS, "Items in the served version", registry=r)
        self.store_state = Gauge(
            STORE_STATE, "1 for the online store's current state (serving.store_health): "
            "whole, rehydrating, lost or unknown", ["state"], registry=r,
        )

    def track_store_state(self, state: Callable[[], str]) -> None:
        """Read the store's state at scrape time."""
        from serving.store_health import STATES

        def is_state(name: str) -> Callable[[], float]:
            return lambda: float(state() == name)

        for name in STATES:
            self.store_state.labels(name).set_function(is_state(name))

    def track_version_age(self, age_s: Callable[[], float]) -> None:
        """Compute the version age at scrape time."""
        self.version_age.set_function(age_s)
