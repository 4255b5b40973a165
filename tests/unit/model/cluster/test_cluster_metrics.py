"""``model.cluster.metrics`` (the chief's per-role exposition) and ``model.cluster.stats``
(the step's byte and time booking) in one process; on the real cluster:
tests/integration/test_cluster.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from model.cluster.metrics import (
    STEP_BUCKETS,
    ClusterMetrics,
    ClusterSampler,
    ClusterSnapshot,
    PsFigures,
    WorkerFigures,
    cumulative,
)
from model.cluster.spec import ClusterLayout
from serving.stats import parse_metrics

LAYOUT = ClusterLayout("h:1", ("h:2", "h:3"), ("h:4",))


def _worker(steps: int, bucket: int) -> WorkerFigures:
    buckets = [0] * (len(STEP_BUCKETS) + 1)
    buckets[bucket] = steps
    return WorkerFigures(steps, 0.03 * steps, tuple(buckets), 1000, 700, 50)


def _snapshot() -> ClusterSnapshot:
    return ClusterSnapshot(
        ps=(PsFigures(10, 4, 600, 300), PsFigures(11, 5, 400, 400)),
        workers=(_worker(7, 3),), admitted={"user": 21, "item": 8}, scheduled=9, sampled_at=1.5e9,
    )


def test_cumulative_buckets_end_at_the_count() -> None:
    counts = tuple(range(len(STEP_BUCKETS) + 1))
    out = cumulative(counts)
    assert out[0] == ("0.005", 0.0) and out[-1] == ("+Inf", float(sum(counts)))
    assert [c for _, c in out] == sorted(c for _, c in out)
    with pytest.raises(ValueError):
        cumulative((1, 2))


def test_every_role_is_labelled_and_figures_come_from_the_newest_snapshot() -> None:
    registry = CollectorRegistry()
    m = ClusterMetrics(registry, LAYOUT)
    before = parse_metrics(generate_latest(registry).decode())
    roles = {dict(lab)["role"] + dict(lab)["index"]
             for (name, lab) in before if name == "streamrec_cluster_role"}
    assert roles == {"chief0", "ps0", "ps1", "worker0"}
    assert not any(name == "streamrec_cluster_shard_rows" for name, _ in before)  # not sampled

    m.chief_sent(123)
    m.chief_sent(7)
    m.chief_received(40)
    m.schedule_seconds.observe(0.002)
    m.waits["fetch"].observe(0.02)
    m.update(_snapshot())
    got = parse_metrics(generate_latest(registry).decode())

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert value("streamrec_cluster_shard_rows", role="ps", index="1", table="user") == 11
    assert value("streamrec_cluster_shard_rows", role="ps", index="0", table="item") == 4
    assert value("streamrec_cluster_admitted_rows", role="chief", index="0", table="user") == 21
    assert value("streamrec_cluster_sent_bytes_total", role="chief", index="0") == 130
    assert value("streamrec_cluster_received_bytes_total", role="chief", index="0") == 40
    assert value("streamrec_cluster_received_bytes_total", role="ps", index="0") == 600
    assert value("streamrec_cluster_sent_bytes_total", role="worker", index="0") == 1000
    assert value("streamrec_cluster_received_bytes_total", role="worker", index="0") == 750
    assert value("streamrec_cluster_step_seconds_count", role="worker", index="0") == 7
    assert value("streamrec_cluster_step_seconds_sum", role="worker", index="0") == pytest.approx(0.21)
    assert value("streamrec_cluster_step_seconds_bucket", role="worker", index="0", le="0.025") == 0
    assert value("streamrec_cluster_step_seconds_bucket", role="worker", index="0", le="0.05") == 7
    assert value("streamrec_cluster_steps_in_flight", role="chief", index="0") == 2
    assert value("streamrec_cluster_schedule_seconds_count", role="chief", index="0") == 1
    assert value("streamrec_cluster_wait_seconds_count", role="chief", index="0", wait="fetch") == 1
    assert value("streamrec_cluster_wait_seconds_count", role="chief", index="0", wait="join") == 0


def test_in_flight_never_goes_negative() -> None:
    snap = ClusterSnapshot((), (_worker(5, 0),), {}, scheduled=4, sampled_at=0.0)
    assert snap.in_flight == 0


def test_a_failed_read_keeps_the_last_snapshot(caplog: pytest.LogCaptureFixture) -> None:
    m = ClusterMetrics(CollectorRegistry(), LAYOUT)
    reads = iter([_snapshot()])

    def read() -> ClusterSnapshot:
        try:
            return next(reads)
        except StopIteration:
            raise RuntimeError("ps:1 is gone") from None

    sampler = ClusterSampler(read, m, every_s=60)
    assert sampler.sample() is not None
    with caplog.at_level(logging.WARNING):
        assert sampler.sample() is None
    assert "ps:1 is gone" in caplog.text
    assert m.snapshot == _snapshot()


def test_the_ledger_books_both_sides_of_each_exchange_alike() -> None:
    """One shard on the local CPU: what the PS counter received is what the worker's row
    says it sent, and the figures are the tensors' sizes."""
    from model.cluster.sparse import ShardedTable
    from model.cluster.stats import (
        FROM_CHIEF,
        FROM_PS,
        SECONDS,
        STEPS,
        TO_PS,
        StepStats,
        WireLedger,
    )
    from model.towers.tf_env import tf

    device = "/job:localhost/replica:0/task:0/device:CPU:0"
    table = ShardedTable("unit_ledger", 4, [device], adagrad_initial=0.1, wire_dtype="bfloat16")
    stats = StepStats([device], num_workers=2)
    keys = tf.constant([3, 5, 8], tf.int64)

    ledger = WireLedger([device])
    table.read(keys, ledger)
    table.adagrad(keys, tf.ones([3, 4]), 0.1, ledger=ledger)
    ledger.dense(device, 64)
    for op in ledger.book(stats, tf.constant(0.03, tf.float64), tf.constant(99, tf.int64), index=1):
        del op  # eager: applied already
    (received, sent), = stats.read()[0]
    row = stats.workers.numpy()
    rows_b = 3 * 4 * 2  # 3 rows of 4 bfloat16
    assert received == 3 * 8 + (3 * 8 + rows_b) + 64  # keys of the read, keys + grads, dense grad
    assert sent == rows_b + 64  # the rows read and the dense weights
    assert row[1, TO_PS] == received and row[1, FROM_PS] == sent
    assert row[1, STEPS] == 1 and row[1, SECONDS] == pytest.approx(0.03)
    assert row[1, FROM_CHIEF] == 99
    assert np.flatnonzero(row[1, 5:]).tolist() == [STEP_BUCKETS.index(0.05)]  # 0.025 < 0.03 <= 0.05
    assert not row[0].any()  # worker 0 ran nothing


def test_a_step_on_one_route_books_its_keys_once() -> None:
    """The trainer's step reads and writes a table on one route: the keys reach the PS
    once (TF sends a tensor once to each device), and the ledger counts them once."""
    from model.cluster.sparse import ShardedTable
    from model.cluster.stats import StepStats, WireLedger
    from model.towers.tf_env import tf

    device = "/job:localhost/replica:0/task:0/device:CPU:0"
    table = ShardedTable("unit_route", 4, [device], adagrad_initial=0.1)
    stats = StepStats([device], num_workers=1)
    ledger = WireLedger([device])
    route = table.route(tf.constant([3, 5, 8], tf.int64))
    assert table.route(route) is route
    table.read(route, ledger)
    table.adagrad(route, tf.ones([3, 4]), 0.1, ledger=ledger)
    for op in ledger.book(stats, tf.constant(0.01, tf.float64), tf.constant(0, tf.int64), index=0):
        del op  # eager: applied already
    (received, sent), = stats.read()[0]
    rows_b = 3 * 4 * 4  # 3 rows of 4 float32
    assert received == 3 * 8 + rows_b  # the keys once, then the gradients
    assert sent == rows_b
