"""The live dashboard: ``GET /stats`` (JSON) and ``GET /dashboard`` (one self-contained page).

:func:`dashboard_router` answers ``/stats`` with the snapshot the stack's one collector writes
(``serving.stats_file``): a serving worker scrapes nothing itself.
:func:`collector_from_settings` builds that collector (a
:class:`~serving.stats.StatsCollector`) from the settings, with :class:`TopicEndOffsets` as its
``samples`` source; ``serving.dashboard_collector`` runs it. The page
(``serving/static/dashboard.html`` + ``dashboard.js``, plain SVG drawn by hand-written JS, no
build step, no CDN) polls ``/stats`` every 2 s; its user box reads the existing
``GET /users/{id}/features`` and ``GET /recommend`` routes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from serving.stats import ScrapeError, StatsCollector
from serving.stats_file import STALE_AFTER_S, read_stats
from streamrec.settings import Settings

log = logging.getLogger(__name__)

_NO_CACHE = {"Cache-Control": "no-store"}


def _asset(name: str) -> str:
    return resources.files("serving").joinpath("static", name).read_text(encoding="utf-8")


def dashboard_router(stats_file: Path, clock: Callable[[], datetime],
                     max_age_s: float = STALE_AFTER_S) -> APIRouter:
    """``GET /stats`` (the collector's snapshot in ``stats_file``, its components marked down
    when it is older than ``max_age_s`` on ``clock``), ``GET /dashboard`` and the page's
    script."""
    router = APIRouter(tags=["dashboard"])
    page = _asset("dashboard.html")
    script = _asset("dashboard.js")

    @router.get("/stats")
    def stats() -> Response:
        body = read_stats(stats_file, clock().timestamp(), max_age_s)
        return Response(body, media_type="application/json", headers=_NO_CACHE)

    @router.get("/dashboard", response_class=HTMLResponse)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(page, headers=_NO_CACHE)

    @router.get("/dashboard/dashboard.js")
    def dashboard_js() -> Response:
        return Response(script, media_type="text/javascript", headers=_NO_CACHE)

    return router


class TopicEndOffsets:
    """Sum of a topic's end offsets (records ever produced), read with kafka-python."""

    def __init__(self, bootstrap: str, topic: str, timeout_s: float = 1.5) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.timeout_ms = int(timeout_s * 1000)
        self._consumer: Any = None
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._read()

    def _read(self) -> int:
        from kafka.errors import KafkaError

        from stream.kafka_client import end_offsets, offsets_consumer

        try:
            if self._consumer is None:
                self._consumer = offsets_consumer(self.bootstrap, self.timeout_ms / 1000)
            ends = end_offsets(self._consumer, self.topic, self.timeout_ms / 1000)
            if not ends:
                raise ScrapeError(f"topic {self.topic} not found")
            return int(sum(ends.values()))
        except KafkaError as exc:
            self._drop()
            text = f"{type(exc).__name__}: {exc}"
            unreachable = "NoBrokersAvailable" in text or "bootstrap" in text.lower()
            reason = f"broker unreachable at {self.bootstrap}" if unreachable else text
            raise ScrapeError(reason) from exc

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close(timeout_ms=1000)
            except Exception as exc:  # noqa: BLE001 - closing a broken client; log and drop it
                log.debug("closing the offsets consumer failed: %r", exc)


def _reach(host: str) -> str:
    """A wildcard bind address is reached on the loopback."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def collector_from_settings(
    settings: Settings,
    clock: Callable[[], datetime],
    *,
    ingest_url: str | None = None,
    trainer_url: str | None = None,
    serving_url: str | None = None,
    **options: Any,
) -> StatsCollector:
    """The stack's collector; the sources' addresses come from ``settings`` unless given
    (``ingest_url``/``trainer_url``: full ``/metrics`` URLs; ``serving_url``: serving's base
    URL, whose ``/metrics`` and ``/model`` are read)."""
    serving = serving_url or f"http://{_reach(settings.serving.host)}:{settings.serving.port}"
    return StatsCollector(
        clock=clock,
        serving_url=f"{serving}/metrics",
        model_url=f"{serving}/model",
        ingest_url=ingest_url or f"http://{_reach(settings.ingest.host)}:{settings.ingest.port}/metrics",
        trainer_url=trainer_url or f"http://{settings.trainer.metrics_host}:{settings.trainer.metrics_port}/metrics",
        samples_offsets=TopicEndOffsets(settings.kafka.bootstrap, settings.kafka.samples_topic),
        **options,
    )
