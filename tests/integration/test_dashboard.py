"""The live dashboard in headless Chromium against real processes on the real stack.

``streamrec ingest-api``, ``streamrec train``, ``streamrec serve`` and the stack's one
``streamrec dashboard-collector`` run as subprocesses on this test's topics, key prefix and
registry; events go through the ingest API, training
samples are produced to the ``samples`` topic (the feature job's output topic), recommendation
requests hit the serving API. Chromium loads ``/dashboard`` and the DOM must show data points
in every chart, every component up, and the user box filled; a screenshot is kept in the test's
tmp dir (and copied to $STREAMREC_SCREENSHOT_TO when set). Then the trainer is stopped: the
page must mark it down with the reason and keep drawing the other series. The trainer
cluster's panel stays hidden for this one-process trainer; the second test draws it from a
cluster's per-role metrics served over HTTP by the trainer's own metrics server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from feature_store.store import HistoryEntry, UserFeatures, open_store
from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.trainer.samples import encode_sample
from streamrec.settings import Settings, to_env
from tests.support import free_port, repo_root, wait_until

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium")
CHARTS = ("ingest", "samples", "trainer", "quality", "latency", "answers", "freshness")
USER = "u1"
VOID = {"input", "meta", "br", "img", "link", "hr", "col", "area", "base", "source", "wbr"}


class Dom(HTMLParser):
    """Attributes of every element with an id, its text, and table rows of ``#recs``/``#history``."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.attrs: dict[str, dict[str, str | None]] = {}
        self.text: dict[str, str] = defaultdict(str)
        self.rows: dict[str, int] = defaultdict(int)
        self._stack: list[tuple[str, str | None]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        ident = found.get("id")
        if ident:
            self.attrs[ident] = found
        if tag == "tr":
            for _, outer in self._stack:
                if outer in ("recs", "history"):
                    self.rows[outer] += 1
        if tag not in VOID:
            self._stack.append((tag, ident))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == tag:
                del self._stack[i:]
                return

    def handle_data(self, data: str) -> None:
        for _, ident in self._stack:
            if ident:
                self.text[ident] += data


def chromium(tmp_path: Path, url: str, *extra: str, budget_ms: int = 6000) -> str:
    profile = tmp_path / f"chromium-{time.monotonic_ns()}"
    cmd = [CHROMIUM or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
           "--window-size=1440,1250", "--hide-scrollbars",
           f"--virtual-time-budget={budget_ms}", *extra, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Traffic(threading.Thread):
    """Events to the ingest API, samples to Kafka and requests to serving, until stopped."""

    def __init__(self, settings: Settings, ingest_url: str, serve_url: str) -> None:
        super().__init__(daemon=True)
        self.settings, self.ingest_url, self.serve_url = settings, ingest_url, serve_url
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.stream = SyntheticStream(SyntheticConfig(users=300, items=200, history_len=20, seed=3))

    def run(self) -> None:
        from stream.kafka_client import make_producer

        producer = make_producer(self.settings.kafka, linger_ms=20)
        n = 0
        try:
            with httpx.Client(timeout=5.0) as http:
                while not self.stop.is_set():
                    n += 1
                    for s in self.stream.take(100):
                        producer.send(self.settings.kafka.samples_topic, key=s.user_id.encode(),
                                      value=encode_sample(s))
                    batch = [{"user_id": f"u{(n * 7 + i) % 300}", "item_id": f"i{(n + i) % 200}",
                              "event_type": "click"} for i in range(20)]
                    self._call(lambda b=batch: http.post(self.ingest_url + "/events", json=b))
                    for user in (USER, USER, f"stranger{n}"):
                        self._call(lambda u=user: http.get(self.serve_url + "/recommend",
                                                            params={"user_id": u, "k": 10}))
                    self.stop.wait(0.25)  # pacing of the load, not a wait for a condition
        finally:
            producer.flush(timeout=30)
            producer.close()

    def _call(self, request: Any) -> None:
        try:
            resp = request()
            if resp.status_code >= 400:
                self.errors.append(f"{resp.request.url}: HTTP {resp.status_code}")
        except httpx.HTTPError as exc:
            self.errors.append(repr(exc))


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[dict[str, subprocess.Popen]]:
    procs: dict[str, subprocess.Popen] = {}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    for proc in procs.values():
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def start(procs: dict[str, subprocess.Popen], name: str, settings: Settings, tmp_path: Path,
          *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMREC_")}
    env.update(to_env(settings))
    log = (tmp_path / f"{name}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", *args], cwd=repo_root(), env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    procs[name] = proc
    return proc


def healthy(proc: subprocess.Popen, url: str) -> bool:
    assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
    return httpx.get(url, timeout=2.0).status_code == 200


@pytest.mark.skipif(CHROMIUM is None, reason="Debian package `chromium` is not installed")
def test_dashboard_draws_the_live_pipeline_and_survives_a_trainer_stop(
    settings: Settings, processes: dict[str, subprocess.Popen], tmp_path: Path
) -> None:
    s = settings.model_copy(update={
        "ingest": settings.ingest.model_copy(update={"port": free_port()}),
        "trainer": settings.trainer.model_copy(update={"metrics_port": free_port()}),
        "serving": settings.serving.model_copy(update={"port": free_port()}),
        "features": settings.features.model_copy(update={"history_len": 20}),
    })
    ingest_url = f"http://127.0.0.1:{s.ingest.port}"
    serve_url = f"http://127.0.0.1:{s.serving.port}"
    trainer_url = f"http://127.0.0.1:{s.trainer.metrics_port}"
    store = open_store(s)
    history = tuple(HistoryEntry(f"i{j}", "click", 1_767_225_600_000 - j) for j in range(8))
    store.write_batch(users=[UserFeatures(USER, history, {}, 1_767_225_600_000,
                                          1_767_225_600_000)])
    store.close()

    ingest = start(processes, "ingest", s, tmp_path, "ingest-api")
    trainer = start(processes, "trainer", s, tmp_path, "train", "--batch-size", "256",
                    "--export-every-s", "4", "--eval-rows", "64")
    serve = start(processes, "serve", s, tmp_path, "serve")
    collector = start(processes, "dashboard-collector", s, tmp_path, "dashboard-collector")
    wait_until(lambda: healthy(ingest, ingest_url + "/health"), 60, "ingest /health")
    wait_until(lambda: healthy(serve, serve_url + "/stats"), 60, "serving /stats")

    traffic = Traffic(s, ingest_url, serve_url)
    traffic.start()
    try:
        def stats() -> dict[str, Any]:
            return httpx.get(serve_url + "/stats", timeout=3.0).json()

        seen: list[dict[str, Any]] = []

        def everything_drawn() -> dict[str, Any] | None:
            assert trainer.poll() is None, "trainer exited"
            assert collector.poll() is None, "the dashboard collector exited"
            snap = stats()
            seen[:] = [snap]
            latest = snap["latest"] or {}
            wanted = ("ingest_eps", "samples_ps", "trainer_eps", "recall", "recall_baseline",
                      "p50_ms", "p99_ms", "share_popular", "model_age_s")
            ok = all(latest.get(k) is not None for k in wanted) and latest["trainer_eps"] > 0
            # a model is served: answers come from it (a stranger too: its cold start)
            ok = ok and latest["share_popular"] < 1
            return snap if ok and all(c["up"] for c in snap["components"].values()) else None

        try:
            snap = wait_until(everything_drawn, 240, "every series of /stats", interval_s=1.0)
        except AssertionError as exc:
            last = seen[0] if seen else {}
            raise AssertionError(f"{exc}; last /stats: latest={last.get('latest')}, "
                                 f"components={last.get('components')}") from None
        assert snap["latest"]["ingest_eps"] > 0 and snap["latest"]["samples_ps"] > 0
        assert snap["model"]["version"] is not None

        page = f"{serve_url}/dashboard?user={USER}"
        dom = Dom(chromium(tmp_path, page, "--dump-dom"))
        for chart in CHARTS:
            assert int(dom.attrs[f"chart-{chart}"]["data-points"] or 0) > 0, chart
        for comp in ("serving", "ingest", "kafka", "trainer"):
            assert dom.attrs[f"comp-{comp}"]["data-up"] == "true", comp
        assert dom.text["model-version"].strip() not in ("", "—", "none yet")
        assert dom.attrs["banner"].get("class") != "show", dom.text["banner"]
        assert dom.rows["history"] == 1 + len(history)
        assert dom.rows["recs"] == 1 + 10
        assert dom.attrs["recs-meta"]["data-model-version"], dom.text["recs-meta"]
        assert "source model" in dom.text["recs-meta"]
        # one process: no cluster panel
        assert snap["cluster"] is None
        assert "hidden" in dom.attrs["cluster"] and dom.attrs["cluster"]["data-roles"] == "0"

        shot = tmp_path / "dashboard.png"
        chromium(tmp_path, page, f"--screenshot={shot}")
        assert shot.stat().st_size > 10_000
        if os.environ.get("STREAMREC_SCREENSHOT_TO"):
            shutil.copyfile(shot, os.environ["STREAMREC_SCREENSHOT_TO"])

        # Stop the trainer: the page marks it down with the reason and keeps drawing the rest.
        trainer.terminate()
        trainer.wait(60)
        stopped_ms = int(time.time() * 1000)
        with pytest.raises(httpx.ConnectError):
            httpx.get(trainer_url + "/metrics", timeout=2.0)
        wait_until(lambda: (c := stats()["components"]["trainer"])["up"] is False
                   and c["checked_ms"] > stopped_ms, 30, "trainer marked down")
        wait_until(lambda: (stats()["series"]["t_ms"] or [0])[-1] > stopped_ms + 4000, 30,
                   "scrapes after the stop")
        dom = Dom(chromium(tmp_path, page, "--dump-dom"))
        assert dom.attrs["comp-trainer"]["data-up"] == "false"
        assert "connection refused" in dom.text["comp-trainer"]
        for comp in ("serving", "ingest", "kafka"):
            assert dom.attrs[f"comp-{comp}"]["data-up"] == "true", comp
        for chart in ("ingest", "samples", "latency", "answers", "freshness"):
            last = int(dom.attrs[f"chart-{chart}"]["data-last-t"] or 0)
            assert last > stopped_ms, f"{chart} stopped updating"
        assert int(dom.attrs["updated"]["data-updated-ms"] or 0) > stopped_ms
        assert dom.attrs["banner"].get("class") != "show", dom.text["banner"]
        assert dom.rows["recs"] == 1 + 10
        chromium(tmp_path, page, f"--screenshot={tmp_path / 'dashboard-trainer-down.png'}")
    finally:
        traffic.stop.set()
        traffic.join(30)
    assert not traffic.errors, traffic.errors[:5]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian package `chromium` is not installed")
def test_dashboard_shows_each_role_of_a_trainer_cluster(tmp_path: Path) -> None:
    """The cluster panel from the trainer's ``/metrics`` (``ClusterMetrics`` in a
    ``TrainerMetrics`` registry behind the trainer's ``HealthServer``), through the serving
    stack's collector, its snapshot and serving's ``/stats``, drawn by the page in Chromium."""
    import asyncio
    from datetime import UTC, datetime, timedelta

    from model.cluster.metrics import (
        STEP_BUCKETS,
        ClusterMetrics,
        ClusterSnapshot,
        PsFigures,
        WorkerFigures,
    )
    from model.cluster.spec import ClusterLayout
    from model.trainer.metrics import HealthServer, TrainerMetrics
    from serving.dashboard import dashboard_router
    from serving.stats import StatsCollector
    from serving.stats_file import write_stats

    layout = ClusterLayout.from_ports(9100, [9101, 9102], [9103, 9104])
    trainer = TrainerMetrics()
    cluster = ClusterMetrics(trainer.registry, layout)

    def snapshot(steps: int) -> ClusterSnapshot:
        buckets = (0,) * 3 + (steps,) + (0,) * (len(STEP_BUCKETS) - 3)
        workers = tuple(WorkerFigures(steps, 0.04 * steps, buckets, 9000 * steps, 5000 * steps,
                                      300 * steps) for _ in range(2))
        ps = (PsFigures(150, 60, 9000 * steps, 5000 * steps),
              PsFigures(149, 61, 9000 * steps, 5000 * steps))
        return ClusterSnapshot(ps, workers, {"user": 298, "item": 120}, 2 * steps + 1,
                               1_767_225_600.0 + steps)

    now = [datetime(2026, 1, 1, tzinfo=UTC)]

    health = HealthServer("127.0.0.1", free_port(), trainer, lambda: {"status": "ok"}).start()
    collector = StatsCollector(
        clock=lambda: now[0], serving_url=None, model_url=None, ingest_url=None,
        trainer_url=f"http://127.0.0.1:{health.port}/metrics", samples_offsets=None,
        interval_s=0.5, rate_window_s=5.0,
    )
    stats_file = tmp_path / "stats.json"
    app = FastAPI()
    app.include_router(dashboard_router(stats_file, lambda: now[0]))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/stats", timeout=2.0).status_code == 200, 30,
                   "the dashboard app")

        async def scrapes() -> None:  # two ticks of the collector, 2 s apart on its clock
            for steps in (10, 20):
                cluster.update(snapshot(steps))
                trainer.samples.inc(256 * 10)
                for _ in range(10):
                    cluster.schedule_seconds.observe(0.004)
                    cluster.waits["fetch"].observe(0.03)
                await collector.scrape_once()
                now[0] += timedelta(seconds=2)
            write_stats(stats_file, collector.snapshot())
            await collector.aclose()

        asyncio.run(scrapes())
        view = httpx.get(url + "/stats", timeout=2.0).json()["cluster"]
        assert [r["id"] for r in view["roles"]] == ["chief-0", "ps-0", "ps-1", "worker-0", "worker-1"]
        ps0 = view["roles"][1]
        assert ps0["rows"] == {"user": 150, "item": 60} and ps0["sent_bytes"] == 100_000
        assert ps0["sent_bps"] == pytest.approx(50_000 / 2)  # 10 steps of 5000 B in 2 s
        assert view["roles"][3]["step_ms"] == pytest.approx(40.0)
        assert view["chief"]["in_flight"] == 1 and not view["stale"]

        dom = Dom(chromium(tmp_path, url + "/dashboard", "--dump-dom"))
        assert "hidden" not in dom.attrs["cluster"], dom.attrs["cluster"]
        assert dom.attrs["cluster"]["data-roles"] == "5"
        assert dom.attrs["cluster-ps-1"]["data-rows-user"] == "149"
        assert dom.attrs["cluster-ps-1"]["data-rows-item"] == "61"
        assert dom.attrs["cluster-worker-0"]["data-steps"] == "20"
        assert dom.attrs["cluster-worker-1"]["data-sent"] == "180000"
        assert dom.attrs["cluster-chief-0"]["data-rows-user"] == "298"
        assert "127.0.0.1:9102" in dom.text["cluster-ps-1"]
        assert "40.0" in dom.text["cluster-worker-0"]  # mean step ms
        chief = dom.text["cluster-chief"]
        assert "schedule 4.0 ms" in chief and "step result 30.0 ms (15.0% of the time)" in chief
        assert "steps in flight 1" in chief
        assert dom.attrs["banner"].get("class") != "show", dom.text["banner"]
        shot = tmp_path / "dashboard-cluster.png"
        chromium(tmp_path, url + "/dashboard", f"--screenshot={shot}")
        assert shot.stat().st_size > 10_000
    finally:
        server.should_exit = True
        serving.join(10)
        health.stop()
