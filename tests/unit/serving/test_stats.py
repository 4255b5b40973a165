"""The dashboard's ``/stats`` against known metric values served over real local HTTP."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from serving.dashboard import dashboard_router
from serving.metrics import ServingMetrics
from serving.stats import (
    ModelStatus,
    ScrapeError,
    StatsCollector,
    histogram_quantile,
    parse_metrics,
)
from serving.stats_file import write_stats
from tests.support import free_port

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class MetricsServer:
    """A stdlib HTTP server answering ``GET /metrics`` with whatever ``body``/``status`` hold."""

    def __init__(self) -> None:
        self.body = ""
        self.status = 200
        self.delay_s = 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                if outer.delay_s:
                    time.sleep(outer.delay_s)  # the server is slow on purpose
                text, kind = outer.answer(self.path)
                data = text.encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, path: str) -> tuple[str, str]:
        return self.body, "text/plain; version=0.0.4"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ServingStub(MetricsServer):
    """Serving as the collector reads it: ``/metrics`` from a live :class:`ServingMetrics`,
    ``/model`` from :attr:`model` (``None``: no model yet, as serving answers then)."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics = ServingMetrics()
        self.model: ModelStatus | None = None
        self.base = self.url.removesuffix("/metrics")

    def answer(self, path: str) -> tuple[str, str]:
        if path.startswith("/model"):
            body = ({"version": None} if self.model is None else
                    {"version": self.model.version, "age_s": self.model.age_s})
            return json.dumps(body), "application/json"
        return generate_latest(self.metrics.exposition).decode(), "text/plain; version=0.0.4"


@pytest.fixture
def serving() -> Iterator[ServingStub]:
    stub = ServingStub()
    yield stub
    stub.close()


@pytest.fixture
def servers() -> Iterator[tuple[MetricsServer, MetricsServer]]:
    ingest, trainer = MetricsServer(), MetricsServer()
    yield ingest, trainer
    ingest.close()
    trainer.close()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def ingest_text(accepted: float) -> str:
    return (
        "# TYPE streamrec_ingest_events_accepted counter\n"
        f"streamrec_ingest_events_accepted_total {accepted}\n"
        "# TYPE streamrec_ingest_events_rejected counter\n"
        'streamrec_ingest_events_rejected_total{reason="invalid"} 3.0\n'
    )


def trainer_text(samples: float, recall: float | str, baseline: float | str) -> str:
    return (
        "# TYPE streamrec_trainer_samples counter\n"
        f"streamrec_trainer_samples_total {samples}\n"
        "# TYPE streamrec_trainer_quality_rolling gauge\n"
        f'streamrec_trainer_quality_rolling{{metric="recall@10"}} {recall}\n'
        f'streamrec_trainer_quality_rolling{{metric="popularity_recall@10"}} {baseline}\n'
        f'streamrec_trainer_quality_rolling{{metric="item2item_recall@10"}} NaN\n'
        f'streamrec_trainer_quality_rolling{{metric="itemknn_recall@10"}} 0.05\n'
        f'streamrec_trainer_quality_rolling{{metric="ndcg@10"}} 0.5\n'
        "# TYPE streamrec_trainer_trained_through_timestamp_seconds gauge\n"
        "streamrec_trainer_trained_through_timestamp_seconds 1.7e+09\n"
    )


def make(clock: Clock, serving: ServingStub | None, ingest_url: str | None,
         trainer_url: str | None, offsets: object, model: ModelStatus | None = None,
         **kw: object) -> StatsCollector:
    if serving is not None:
        serving.model = model
    # a scrape of a live stub must not time out on a busy host (the slow case sets its own)
    kw.setdefault("http_timeout_s", 10.0)
    return StatsCollector(
        clock=clock,
        serving_url=serving.url if serving else None,
        model_url=f"{serving.base}/model" if serving else None,
        ingest_url=ingest_url, trainer_url=trainer_url, samples_offsets=offsets,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def tick(collector: StatsCollector, clock: Clock, seconds: float = 2.0) -> dict:
    asyncio.run(collector.scrape_once())
    snap = collector.snapshot()
    json.dumps(snap, allow_nan=False)  # what the page gets is strict JSON
    clock.now += timedelta(seconds=seconds)
    return snap


def test_rates_quality_latency_and_shares_from_known_values(servers, serving) -> None:
    ingest, trainer = servers
    clock, metrics = Clock(), serving.metrics
    offsets = iter([50, 350, 350])
    collector = make(clock, serving, ingest.url, trainer.url, lambda: next(offsets),
                     ModelStatus("v7", 42.5))
    ingest.body = ingest_text(100)
    trainer.body = trainer_text(1000, "NaN", "NaN")
    metrics.request_seconds.labels("model").observe(0.004)  # before the first scrape: excluded
    first = tick(collector, clock)
    assert first["latest"]["ingest_eps"] is None  # a rate needs two scrapes
    assert first["latest"]["recall"] is None  # NaN (nothing evaluated yet) -> null

    ingest.body = ingest_text(400)
    trainer.body = trainer_text(2000, 0.31, 0.12)
    for _ in range(90):
        metrics.request_seconds.labels("model").observe(0.004)
    for _ in range(5):
        metrics.request_seconds.labels("popular").observe(0.004)
    for _ in range(5):
        metrics.request_seconds.labels("degraded").observe(0.2)
    snap = tick(collector, clock)
    latest = snap["latest"]
    assert latest["ingest_eps"] == pytest.approx(150.0)
    assert latest["trainer_eps"] == pytest.approx(500.0)
    assert latest["samples_ps"] == pytest.approx(150.0)
    assert latest["recall"] == pytest.approx(0.31)
    assert latest["recall_baseline"] == pytest.approx(0.12)  # the best live baseline
    assert latest["rps"] == pytest.approx(50.0)
    assert latest["share_popular"] == pytest.approx(0.05)
    assert latest["share_degraded"] == pytest.approx(0.05)
    # 95 answers in (3 ms, 5 ms], 5 in (100 ms, 250 ms]: linear interpolation in the bucket
    assert latest["p50_ms"] == pytest.approx(3.0 + 2.0 * 50 / 95)
    assert latest["p99_ms"] == pytest.approx(100.0 + 150.0 * (99 - 95) / 5)
    assert latest["model_version"] == "v7" and latest["model_age_s"] == pytest.approx(42.5)
    assert snap["model"] == {"version": "v7", "age_s": 42.5}
    assert {n: c["up"] for n, c in snap["components"].items()} == {
        "serving": True, "ingest": True, "kafka": True, "trainer": True}
    assert snap["components"]["trainer"]["trained_through_ms"] == 1_700_000_000_000
    series = snap["series"]
    assert series["t_ms"] == [int(T0.timestamp() * 1000), int(T0.timestamp() * 1000) + 2000]
    assert series["ingest_eps"] == [None, pytest.approx(150.0)]

    # No requests and no new events in the next 2 s: zero rates, no latency figures.
    third = tick(collector, clock)["latest"]
    assert third["ingest_eps"] == pytest.approx(300 / 4)  # rate over the 10 s window (4 s)
    assert third["samples_ps"] == pytest.approx(300 / 4)
    assert third["rps"] == pytest.approx(100 / 4)


def test_down_sources_show_their_reason_and_the_rest_keeps_going(servers, serving) -> None:
    ingest, _ = servers
    clock, metrics = Clock(), serving.metrics
    nothing_there = f"http://127.0.0.1:{free_port()}/metrics"

    def broker_down() -> int:
        raise ScrapeError("broker unreachable")

    collector = make(clock, serving, ingest.url, nothing_there, broker_down)
    ingest.body = ingest_text(10)
    tick(collector, clock)
    ingest.body = ingest_text(30)
    metrics.request_seconds.labels("popular").observe(0.001)
    snap = tick(collector, clock)
    comps = snap["components"]
    assert comps["trainer"]["up"] is False
    assert comps["trainer"]["reason"] == "connection refused"
    assert comps["kafka"] == comps["kafka"] | {"up": False, "reason": "broker unreachable"}
    assert comps["ingest"]["up"] is True and comps["serving"]["up"] is True
    latest = snap["latest"]
    assert latest["ingest_eps"] == pytest.approx(10.0)
    assert latest["trainer_eps"] is None and latest["samples_ps"] is None
    assert latest["share_popular"] == pytest.approx(1.0)
    assert snap["model"] == {"version": None, "age_s": None}

    ingest.status = 503
    snap = tick(collector, clock)
    assert snap["components"]["ingest"]["reason"] == "HTTP 503"
    assert snap["components"]["ingest"]["last_up_ms"] == snap["series"]["t_ms"][1]
    assert snap["latest"]["ingest_eps"] is None

    ingest.status, ingest.delay_s = 200, 1.0
    slow = make(clock, serving, ingest.url, None, None, http_timeout_s=0.2)
    snap = tick(slow, clock)
    assert snap["components"]["ingest"]["reason"].startswith("timeout")
    assert snap["components"]["trainer"]["reason"] == "not configured"

    serving.close()  # serving stopped: marked down, its figures and its model unknown
    snap = tick(collector, clock)
    assert snap["components"]["serving"] == snap["components"]["serving"] | {
        "up": False, "reason": "connection refused"}
    assert snap["latest"]["rps"] is None and snap["model"] == {"version": None, "age_s": None}


def test_a_hung_kafka_call_is_not_repeated_while_it_hangs() -> None:
    clock = Clock()
    release, calls = threading.Event(), []

    def offsets() -> int:
        calls.append(1)
        release.wait(10)
        return 7

    async def scenario() -> list[tuple[bool | None, str | None]]:
        collector = make(clock, None, None, None, offsets, kafka_timeout_s=0.1)
        seen = []
        for _ in range(2):
            await collector.scrape_once()
            state = collector.components["kafka"]
            seen.append((state.up, state.reason))
        release.set()
        await collector.scrape_once()
        state = collector.components["kafka"]
        seen.append((state.up, state.reason))
        await collector.aclose()
        return seen

    seen = asyncio.run(scenario())
    assert [up for up, _ in seen] == [False, False, True]
    assert seen[0][1].startswith("timeout")
    assert len(calls) == 1


def test_restart_and_window(servers) -> None:
    _, trainer = servers
    clock = Clock()
    collector = make(clock, None, None, trainer.url, None, window_s=60.0)
    trainer.body = trainer_text(5000, 0.2, 0.1)
    tick(collector, clock)
    trainer.body = trainer_text(100, 0.2, 0.1)  # the trainer restarted: its counter went back
    assert tick(collector, clock)["latest"]["trainer_eps"] is None
    trainer.body = trainer_text(300, 0.2, 0.1)
    # the rate is taken from the scrapes after the restart only
    assert tick(collector, clock, seconds=58)["latest"]["trainer_eps"] == pytest.approx(100.0)
    snap = tick(collector, clock)  # t = 62 s: the scrape at t = 0 left the 60 s window
    ms = int(T0.timestamp() * 1000)
    assert snap["series"]["t_ms"] == [ms + 2000, ms + 4000, ms + 62000]
    assert snap["latest"]["trainer_eps"] is None  # no earlier scrape inside the rate window


def test_quantile_and_parser_edges() -> None:
    inf = float("inf")
    assert histogram_quantile(0.5, [(1.0, 0.0), (inf, 0.0)]) is None
    assert histogram_quantile(0.5, [(1.0, 2.0), (2.0, 4.0), (inf, 4.0)]) == pytest.approx(1.0)
    assert histogram_quantile(0.99, [(1.0, 0.0), (inf, 10.0)]) == pytest.approx(1.0)
    with pytest.raises(ScrapeError):
        parse_metrics("streamrec_x{le=\"1\" 3\n")


def test_routes_serve_the_collectors_snapshot_and_the_page(servers, serving, tmp_path) -> None:
    ingest, _ = servers
    clock = Clock()
    collector = make(clock, serving, ingest.url, None, None, ModelStatus("v1", 3.0))
    ingest.body = ingest_text(1)
    asyncio.run(collector.scrape_once())
    snapshot = collector.snapshot()
    write_stats(tmp_path / "stats.json", snapshot)
    app = FastAPI()
    app.include_router(dashboard_router(tmp_path / "stats.json", clock))
    with TestClient(app) as client:
        stats = client.get("/stats")
        assert stats.status_code == 200
        assert stats.json() == snapshot and snapshot["model"] == {"version": "v1", "age_s": 3.0}
        page = client.get("/dashboard")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert '<script src="/dashboard/dashboard.js">' in page.text
        script = client.get("/dashboard/dashboard.js")
        assert script.status_code == 200 and "pollStats" in script.text


def test_the_stacks_collector_reads_a_serving_app_over_http(servers, tmp_path) -> None:
    """The collector built from the settings reads a real serving app's ``/metrics`` and
    ``/model`` (the app scrapes nothing), and the app's ``/stats`` answers its snapshot."""
    import uvicorn

    from model.artifact.registry import Registry
    from serving.app import create_app
    from serving.dashboard import collector_from_settings
    from serving.deps import ServingDeps
    from serving.stats_file import stats_path
    from streamrec.settings import load_settings
    from tests.support import wait_until
    from tests.unit.serving.test_serving_app import MemoryStore

    ingest, _ = servers
    ingest.body = ingest_text(5)
    settings = load_settings(
        stack={"run_dir": tmp_path},
        trainer={"registry_dir": tmp_path, "model_name": "tt", "metrics_port": free_port()},
        ingest={"port": int(ingest.url.split(":")[2].split("/")[0])},
        kafka={"port": free_port()},
        serving={"port": free_port()},
    )
    clock = Clock()
    app = create_app(ServingDeps(settings, MemoryStore(), clock=clock,
                                 registry=Registry(tmp_path, "tt"), watch=False))
    url = f"http://127.0.0.1:{settings.serving.port}"
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.serving.port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        import httpx

        wait_until(lambda: httpx.get(url + "/health", timeout=2.0).status_code == 200, 30,
                   "the serving app")
        empty = httpx.get(url + "/stats").json()  # no collector yet: every component down
        assert empty["latest"] is None and empty["series"]["t_ms"] == []
        assert {c["up"] for c in empty["components"].values()} == {False}
        collector = collector_from_settings(settings, clock)

        async def two_ticks() -> None:  # one loop: the collector keeps its connections
            await collector.scrape_once()
            clock.now += timedelta(seconds=2)
            async with httpx.AsyncClient() as http:
                for user in ("a", "b", "c"):
                    resp = await http.get(url + "/recommend", params={"user_id": user})
                    assert resp.status_code == 200
            ingest.body = ingest_text(25)
            await collector.scrape_once()
            write_stats(stats_path(settings), collector.snapshot())
            await collector.aclose()

        asyncio.run(two_ticks())
        body = httpx.get(url + "/stats").json()
        assert body == collector.snapshot()
        assert httpx.get(url + "/dashboard").status_code == 200
    finally:
        server.should_exit = True
        thread.join(10)
    latest = body["latest"]
    assert latest["rps"] == pytest.approx(1.5)  # 3 requests in 2 s, all answered `popular`
    assert latest["share_popular"] == pytest.approx(1.0)
    assert latest["ingest_eps"] == pytest.approx(10.0)
    assert body["model"]["version"] is None
    comps = body["components"]
    assert comps["serving"]["up"] is True
    assert comps["trainer"]["reason"] == "connection refused"
    assert comps["kafka"]["up"] is False and "broker unreachable" in comps["kafka"]["reason"]
