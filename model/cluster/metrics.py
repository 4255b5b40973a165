"""Per-role metrics of the trainer cluster, exported by the chief (names in
``streamrec.metric_names``; every series has a ``role`` and an ``index`` label).

The parameter servers and workers are bare ``tf.distribute.Server`` processes with no Python
of ours per step, so the chief represents them: the step books what each role does in small
TF variables on the parameter servers (``model.cluster.stats``), and a
:class:`ClusterSampler` thread of the chief reads those and the shard sizes every few seconds
into a :class:`ClusterSnapshot`, never on the step path. The series are listed in
``docs/cluster.md`` and docs/internals.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from model.cluster.spec import CHIEF, PS, WORKER, ClusterLayout
from streamrec import metric_names as names

log = logging.getLogger(__name__)

#: Upper bounds (seconds) of the worker step-time histogram (+Inf is added).
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: The chief's waits on the coordinator (``wait`` label).
WAITS = ("fetch", "join")
TABLES = ("user", "item")


@dataclass(frozen=True)
class PsFigures:
    """One parameter server: rows of its shards and the step payload it received / sent."""

    user_rows: int
    item_rows: int
    received_bytes: int
    sent_bytes: int


@dataclass(frozen=True)
class WorkerFigures:
    """One worker: steps it ran, their summed time, per-bucket counts (``STEP_BUCKETS`` then
    +Inf, not cumulative) and the payload it exchanged."""

    steps: int
    seconds: float
    buckets: tuple[int, ...]
    to_ps_bytes: int
    from_ps_bytes: int
    from_chief_bytes: int

    @property
    def sent_bytes(self) -> int:
        return self.to_ps_bytes

    @property
    def received_bytes(self) -> int:
        return self.from_ps_bytes + self.from_chief_bytes


@dataclass(frozen=True)
class ClusterSnapshot:
    """The figures of every PS and worker and the chief's admission, read at ``sampled_at``."""

    ps: tuple[PsFigures, ...]
    workers: tuple[WorkerFigures, ...]
    admitted: dict[str, int]
    scheduled: int
    sampled_at: float

    @property
    def in_flight(self) -> int:
        return max(self.scheduled - sum(w.steps for w in self.workers), 0)


def cumulative(buckets: tuple[int, ...]) -> list[tuple[str, float]]:
    """Prometheus ``le`` buckets of per-bucket counts (``STEP_BUCKETS`` then +Inf)."""
    bounds = [*(f"{b:g}" for b in STEP_BUCKETS), "+Inf"]
    out, total = [], 0
    for bound, count in zip(bounds, buckets, strict=True):
        total += count
        out.append((bound, float(total)))
    return out


class ClusterMetrics(Collector):
    """The cluster's series in the trainer's registry: the chief's histograms, and a
    collector rendering the newest :class:`ClusterSnapshot` with the chief's byte counts."""

    def __init__(self, registry: CollectorRegistry, layout: ClusterLayout) -> None:
        self.layout = layout
        self._lock = threading.Lock()
        self._snapshot: ClusterSnapshot | None = None
        self._chief_sent = 0
        self._chief_received = 0
        self.schedule_seconds = Histogram(
            names.CLUSTER_SCHEDULE_SECONDS, "Chief's part of a step and handing it to the "
            "coordinator", ["role", "index"], registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        ).labels(CHIEF, "0")
        waits = Histogram(
            names.CLUSTER_WAIT_SECONDS, "Chief blocked on the coordinator: a step's result "
            "(fetch) or every step in flight (join)", ["role", "index", "wait"], registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0),
        )
        self.waits = {w: waits.labels(CHIEF, "0", w) for w in WAITS}
        registry.register(self)

    # -- updates (the training thread, the sampler) -----------------------------------------
    def chief_sent(self, nbytes: int) -> None:
        with self._lock:
            self._chief_sent += nbytes

    def chief_received(self, nbytes: int) -> None:
        with self._lock:
            self._chief_received += nbytes

    def update(self, snapshot: ClusterSnapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    @property
    def snapshot(self) -> ClusterSnapshot | None:
        return self._snapshot

    # -- exposition ----------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snap, chief_sent, chief_received = self._snapshot, self._chief_sent, self._chief_received
        roles = GaugeMetricFamily(names.CLUSTER_ROLE, "Roles of the trainer cluster (1 each)",
                                  labels=["role", "index", "address"])
        roles.add_metric([CHIEF, "0", self.layout.chief], 1.0)
        for job, i in self.layout.roles():
            roles.add_metric([job, str(i), self.layout.address(job, i)], 1.0)
        rows = GaugeMetricFamily(names.CLUSTER_SHARD_ROWS, "Rows a parameter server's shard "
                                 "holds", labels=["role", "index", "table"])
        admitted = GaugeMetricFamily(names.CLUSTER_ADMITTED_ROWS, "Rows the chief admitted "
                                     "(the shards hold them plus a default row once the steps "
                                     "in flight ran)", labels=["role", "index", "table"])
        sent = CounterMetricFamily(names.CLUSTER_SENT_BYTES, "Step payload bytes sent",
                                   labels=["role", "index"])
        received = CounterMetricFamily(names.CLUSTER_RECEIVED_BYTES, "Step payload bytes "
                                       "received", labels=["role", "index"])
        steps = HistogramMetricFamily(names.CLUSTER_STEP_SECONDS, "A step's time on the worker",
                                      labels=["role", "index"])
        in_flight = GaugeMetricFamily(names.CLUSTER_STEPS_IN_FLIGHT, "Steps scheduled and not "
                                      "finished on a worker", labels=["role", "index"])
        sampled = GaugeMetricFamily(names.CLUSTER_SAMPLED, "When the PS and worker figures "
                                    "were read", labels=["role", "index"])
        sent.add_metric([CHIEF, "0"], float(chief_sent))
        received.add_metric([CHIEF, "0"], float(chief_received))
        if snap is not None:
            for i, p in enumerate(snap.ps):
                rows.add_metric([PS, str(i), "user"], float(p.user_rows))
                rows.add_metric([PS, str(i), "item"], float(p.item_rows))
                sent.add_metric([PS, str(i)], float(p.sent_bytes))
                received.add_metric([PS, str(i)], float(p.received_bytes))
            for i, w in enumerate(snap.workers):
                sent.add_metric([WORKER, str(i)], float(w.sent_bytes))
                received.add_metric([WORKER, str(i)], float(w.received_bytes))
                steps.add_metric([WORKER, str(i)], cumulative(w.buckets), w.seconds)
            for table in TABLES:
                admitted.add_metric([CHIEF, "0", table], float(snap.admitted.get(table, 0)))
            in_flight.add_metric([CHIEF, "0"], float(snap.in_flight))
            sampled.add_metric([CHIEF, "0"], snap.sampled_at)
        yield from (roles, rows, admitted, sent, received, steps, in_flight, sampled)


class ClusterSampler:
    """A daemon thread of the chief: ``read()`` (a :class:`ClusterSnapshot`; round trips to
    the parameter servers) every ``every_s`` into ``metrics``. A failed read is logged and
    retried at the next tick (a lost server ends the chief through its watchdog)."""

    def __init__(self, read: Callable[[], ClusterSnapshot], metrics: ClusterMetrics,
                 every_s: float = 5.0) -> None:
        self.read = read
        self.metrics = metrics
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cluster-metrics", daemon=True)

    def sample(self) -> ClusterSnapshot | None:
        try:
            snap = self.read()
        except Exception as exc:  # noqa: BLE001 - metrics must not end the chief; logged
            log.warning("cluster metrics not read: %s", exc)
            return None
        self.metrics.update(snap)
        return snap

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def start(self) -> ClusterSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
