"""``serving.cluster_stats``: the dashboard's cluster panel from trainer scrapes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from model.cluster.metrics import (
    STEP_BUCKETS,
    ClusterMetrics,
    ClusterSnapshot,
    PsFigures,
    WorkerFigures,
)
from model.cluster.spec import ClusterLayout
from serving.cluster_stats import cluster_figures, cluster_view
from serving.stats import parse_metrics


def _scrape(steps: int, schedule_s: float = 0.0) -> dict:
    registry = CollectorRegistry()
    m = ClusterMetrics(registry, ClusterLayout("h:1", ("h:2",), ("h:3",)))
    buckets = (steps,) + (0,) * len(STEP_BUCKETS)
    m.update(ClusterSnapshot((PsFigures(5, 6, 100 * steps, 50 * steps),),
                             (WorkerFigures(steps, 0.01 * steps, buckets, 100 * steps, 50 * steps, 7 * steps),),
                             {"user": 4, "item": 6}, steps, 0.0))
    m.chief_sent(7 * steps)
    if schedule_s:
        m.schedule_seconds.observe(schedule_s)
    return parse_metrics(generate_latest(registry).decode())


def test_a_one_process_trainer_has_no_cluster_figures() -> None:
    assert cluster_figures({("streamrec_trainer_samples_total", ()): 5.0}) is None


def test_view_has_each_role_rates_and_window_means() -> None:
    old, new = cluster_figures(_scrape(10)), cluster_figures(_scrape(30, schedule_s=0.002))
    assert old is not None and new is not None
    view = cluster_view(new, old, 4.0)
    roles = {r["id"]: r for r in view["roles"]}
    assert list(roles) == ["chief-0", "ps-0", "worker-0"]
    assert roles["ps-0"]["rows"] == {"user": 5, "item": 6}
    assert roles["chief-0"]["rows"] == {"user": 4, "item": 6}  # admitted
    assert roles["ps-0"]["received_bps"] == pytest.approx(2000 / 4)
    assert roles["worker-0"]["received_bytes"] == 30 * 57
    assert roles["worker-0"]["step_ms"] == pytest.approx(10.0)
    assert roles["chief-0"]["sent_bps"] == pytest.approx(140 / 4)
    assert view["chief"]["schedule_ms"] == pytest.approx(2.0)
    assert view["chief"]["schedule_share"] == pytest.approx(0.002 / 4)


def test_a_restarted_chief_gives_no_rates_but_its_lifetime_means() -> None:
    old, new = cluster_figures(_scrape(30)), cluster_figures(_scrape(10))
    assert old is not None and new is not None
    view = cluster_view(new, old, 4.0)
    worker = view["roles"][2]
    assert worker["sent_bps"] is None  # a counter that went back: no rate
    assert worker["step_ms"] == pytest.approx(10.0)
    assert cluster_view(new, None, 0.0)["roles"][1]["sent_bps"] is None
