"""The alert rules on the real thing: Prometheus scraping the trainer and the pipeline
exporter, started by the stack runner, with samples flowing into Kafka. Stopping the trainer
(SIGSTOP) fires TrainerStalled within its ``for``; resuming it resolves the alert.

Test-only timing: 1 s scrape and evaluation intervals and ``for: 5s`` on TrainerStalled (a
copy of deploy/prometheus/rules.yml; the expression is the real one)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from deploy.components import PROMETHEUS_RULES
from deploy.process import read_pid
from deploy.stack import Stack
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.trainer.samples import encode_sample
from streamrec.settings import Settings
from tests.support import free_port, service_env, wait_until

pytestmark = pytest.mark.integration

ALERT = "TrainerStalled"


def fast_rules(target: Path, for_: str = "5s") -> Path:
    doc = yaml.safe_load(PROMETHEUS_RULES.read_text())
    found = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    assert len(found) == 1
    found[0]["for"] = for_
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


class SampleFeed(threading.Thread):
    """Produces training samples to the samples topic, a few every 0.2 s, until stopped."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(daemon=True)
        from stream.kafka_client import make_producer

        self.topic = settings.kafka.samples_topic
        self.producer = make_producer(settings.kafka, linger_ms=5)
        self.samples = iter(SyntheticStream(
            SyntheticConfig(users=200, items=100, history_len=20, seed=3)).take(200_000))
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for _ in range(20):
                s = next(self.samples)
                self.producer.send(self.topic, key=s.user_id.encode(), value=encode_sample(s))
                self.sent += 1
            self.producer.flush(timeout=30)

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=30)
        self.producer.close()


@pytest.fixture
def monitored(settings: Settings, tmp_path: Path) -> Iterator[tuple[Stack, Settings]]:
    # Ports of its own: the session's e2e pipeline keeps a trainer on the stack's port.
    s = settings.model_copy(update={
        "stack": settings.stack.model_copy(update={"run_dir": tmp_path / "run"}),
        "trainer": settings.trainer.model_copy(update={"export_every_s": 5.0,
                                                       "metrics_port": free_port()}),
        "prometheus": settings.prometheus.model_copy(update={
            "port": free_port(), "exporter_port": free_port(),
            "scrape_interval_s": 1.0, "evaluation_interval_s": 1.0,
            "rules_file": fast_rules(tmp_path / "rules.yml")}),
    })
    stack = Stack(s, available_commands={"train"})
    try:
        with service_env(s):
            stack.up(["trainer", "exporter", "prometheus"])
        yield stack, s
    finally:
        record = read_pid(stack.pid_path("trainer"))
        if record is not None:
            try:
                os.killpg(record.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        stack.down()


def query(s: Settings, promql: str) -> list[dict[str, Any]]:
    url = f"http://{s.stack.bind_host}:{s.prometheus.port}/api/v1/query"
    body = httpx.get(url, params={"query": promql}, timeout=5.0).json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def alert_state(s: Settings) -> str | None:
    """``pending``/``firing`` of the alert in Prometheus, ``None`` when inactive."""
    url = f"http://{s.stack.bind_host}:{s.prometheus.port}/api/v1/alerts"
    alerts = httpx.get(url, timeout=5.0).json()["data"]["alerts"]
    states = [a["state"] for a in alerts if a["labels"].get("alertname") == ALERT]
    return states[0] if states else None


def test_stopped_trainer_fires_the_stall_alert_and_resumed_resolves_it(monitored) -> None:
    stack, s = monitored
    feed = SampleFeed(s)
    feed.start()
    try:
        # Training while samples flow: the trainer is scraped and the alert is inactive.
        wait_until(lambda: query(s, "rate(streamrec_trainer_samples_total[10s]) > 0"), 180,
                   "Prometheus sees the trainer training")
        wait_until(lambda: alert_state(s) is None, 60, f"{ALERT} inactive while training")
        assert query(s, 'up{job="exporter"} == 1') and query(s, 'up{job="trainer"} == 1')

        record = read_pid(stack.pid_path("trainer"))
        assert record is not None
        os.killpg(record.pid, signal.SIGSTOP)
        wait_until(lambda: alert_state(s) == "pending", 30, f"{ALERT} pending")
        wait_until(lambda: alert_state(s) == "firing", 30, f"{ALERT} firing")
        assert query(s, 'up{job="trainer"} == 0')

        os.killpg(record.pid, signal.SIGCONT)
        wait_until(lambda: alert_state(s) is None, 60, f"{ALERT} resolved after resuming")
        wait_until(lambda: query(s, "rate(streamrec_trainer_samples_total[5s]) > 0"), 30,
                   "the resumed trainer training again")
        assert feed.sent > 0
    finally:
        feed.close()
