"""The dashboard's data: a collector that scrapes every component every ``interval_s``.

:class:`StatsCollector` runs once per stack, in its own process (``streamrec
dashboard-collector``, ``serving.dashboard_collector``), never in a serving worker. Each tick
it reads, concurrently and each under its own deadline, the ingest API's, the trainer's and
serving's ``/metrics`` (serving's summed over its workers), serving's ``/model`` (the served
version and its age), the ``samples`` topic's end offsets and, with a trainer cluster, its
per-role figures. It keeps ``window_s`` of points; rates and quantiles come from lifetime
counters over ``rate_window_s`` (a counter that went backwards gives no rate). A source that
cannot be read is marked down with the reason and its series get ``null`` points.
:meth:`StatsCollector.snapshot` is the JSON of ``GET /stats`` (``serving.stats_file`` writes
it); the series read: docs/internals.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from serving.cluster_stats import ClusterFigures, cluster_figures, cluster_view
from serving.errors import ScrapeError
from serving.metrics import REQUEST_SECONDS
from streamrec import metric_names as names

log = logging.getLogger(__name__)

INGEST_ACCEPTED = names.INGEST_ACCEPTED_TOTAL
TRAINER_SAMPLES = names.TRAINER_SAMPLES_TOTAL
TRAINER_QUALITY = names.TRAINER_QUALITY
TRAINER_THROUGH = names.TRAINER_TRAINED_THROUGH

#: Names of the series in ``GET /stats`` (``series`` holds one list per name plus ``t_ms``).
SERIES = (
    "ingest_eps", "samples_ps", "trainer_eps", "recall", "recall_baseline",
    "p50_ms", "p99_ms", "rps", "share_popular", "share_degraded", "model_age_s", "model_version",
)

#: The collector's defaults: one tick every 2 s, 15 minutes of points, rates over 10 s, @10.
INTERVAL_S, WINDOW_S, RATE_WINDOW_S, TOP_K = 2.0, 900.0, 10.0, 10

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]

#: The trainer's live baselines (``model.trainer.rolling``): ``recall_baseline`` is their best.
LIVE_BASELINES = ("popularity", "item2item", "itemknn")


def parse_metrics(text: str) -> Samples:
    """Prometheus text exposition -> ``{(sample name, sorted labels): value}``."""
    try:
        return _samples(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ScrapeError(f"unparseable metrics: {exc}") from exc


def _samples(families: Iterable[Any]) -> Samples:
    out: Samples = {}
    for family in families:
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile`` over ``(upper bound, cumulative count)`` pairs."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, cum in buckets:
        if cum >= rank:
            if math.isinf(upper):
                return lower
            if cum == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (cum - below)
        lower, below = upper, cum
    return lower


@dataclass
class ComponentState:
    """Up/down state of one source, as shown on the page."""

    up: bool | None = None
    reason: str | None = None
    checked_ms: int | None = None
    since_ms: int | None = None
    last_up_ms: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def mark(self, up: bool, reason: str | None, now_ms: int) -> None:
        if up != self.up:
            self.since_ms = now_ms
        self.up, self.reason, self.checked_ms = up, reason, now_ms
        if up:
            self.last_up_ms = now_ms

    def as_json(self) -> dict[str, Any]:
        return {"up": self.up, "reason": self.reason, "checked_ms": self.checked_ms,
                "since_ms": self.since_ms, "last_up_ms": self.last_up_ms, **self.detail}


@dataclass(frozen=True)
class ModelStatus:
    version: str | None
    age_s: float | None

    @classmethod
    def of(cls, info: Any) -> ModelStatus:
        """From serving's ``GET /model`` body (no ``age_s`` key: no model yet)."""
        if not isinstance(info, dict):
            raise ScrapeError("unexpected /model answer")
        version, age = info.get("version"), info.get("age_s")
        return cls(version if isinstance(version, str) else None,
                   float(age) if isinstance(age, int | float) else None)


UNKNOWN_MODEL = ModelStatus(None, None)


async def fetch_metrics(client: httpx.AsyncClient, url: str) -> Samples:
    """GET a Prometheus endpoint; :class:`ScrapeError` with a short reason if it fails."""
    return parse_metrics((await _get(client, url)).text)


async def fetch_model(client: httpx.AsyncClient, url: str) -> ModelStatus:
    """GET serving's ``/model``; :class:`ScrapeError` with a short reason if it fails."""
    resp = await _get(client, url)
    try:
        return ModelStatus.of(resp.json())
    except ValueError as exc:
        raise ScrapeError(f"unparseable /model answer: {exc}") from exc


async def _get(client: httpx.AsyncClient, url: str) -> httpx.Response:
    try:
        resp = await client.get(url)
    except httpx.ConnectError as exc:
        raise ScrapeError(_connect_reason(exc)) from exc
    except httpx.TimeoutException as exc:
        raise ScrapeError(f"timeout ({type(exc).__name__})") from exc
    except httpx.HTTPError as exc:
        raise ScrapeError(f"{type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise ScrapeError(f"HTTP {resp.status_code}")
    return resp


def _connect_reason(exc: BaseException) -> str:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or "refused" in str(seen).lower():
            return "connection refused"
        seen = seen.__cause__ or seen.__context__
    return f"cannot connect: {exc}" if str(exc) else "cannot connect"


@dataclass
class _Raw:
    """The cumulative figures of one tick (``None``: the source was down)."""

    t_s: float
    ingest: float | None = None
    samples: float | None = None
    trainer: float | None = None
    buckets: dict[float, float] | None = None
    counts: dict[str, float] | None = None
    cluster: ClusterFigures | None = None


class StatsCollector:
    """Scrapes the components every ``interval_s`` and keeps ``window_s`` of points."""

    def __init__(
        self,
        *,
        clock: Callable[[], datetime],
        serving_url: str | None,
        model_url: str | None,
        ingest_url: str | None,
        trainer_url: str | None,
        samples_offsets: Callable[[], int] | None,
        interval_s: float = INTERVAL_S,
        window_s: float = WINDOW_S,
        rate_window_s: float = RATE_WINDOW_S,
        http_timeout_s: float = 1.0,
        kafka_timeout_s: float = 2.0,
        k: int = TOP_K,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.clock = clock
        self.serving_url = serving_url
        self.model_url = model_url
        self.model = UNKNOWN_MODEL
        self.ingest_url = ingest_url
        self.trainer_url = trainer_url
        self.samples_offsets = samples_offsets
        self.interval_s = interval_s
        self.window_s = window_s
        self.rate_window_s = rate_window_s
        self.kafka_timeout_s = kafka_timeout_s
        self.k = k
        self._http = httpx.AsyncClient(timeout=http_timeout_s, transport=transport)
        self._raw: deque[_Raw] = deque()
        self._points: deque[dict[str, Any]] = deque()
        self._kafka_task: asyncio.Future[int] | None = None
        self.components = {
            "serving": ComponentState(detail={"url": serving_url}),
            "ingest": ComponentState(detail={"url": ingest_url}),
            "kafka": ComponentState(detail={"what": "samples topic end offsets"}),
            "trainer": ComponentState(detail={"url": trainer_url}),
        }

    # -- scraping ------------------------------------------------------------------------------

    async def run(self, on_tick: Callable[[], None] | None = None) -> None:
        """Scrape forever, one tick every ``interval_s``, calling ``on_tick`` after each
        (cancel to stop)."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self.scrape_once()
                if on_tick is not None:
                    on_tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("stats scrape failed")
            next_at = max(next_at + self.interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def scrape_once(self) -> None:
        """One tick: read every source, append a point, drop points older than the window."""
        ingest, trainer, samples, serving, model = await asyncio.gather(
            self._scrape_http("ingest", self.ingest_url),
            self._scrape_http("trainer", self.trainer_url),
            self._scrape_kafka(),
            self._scrape_http("serving", self.serving_url),
            self._scrape_model(),
        )
        now = self.clock()
        now_s = now.timestamp()
        now_ms = int(now_s * 1000)
        for name, got in (("ingest", ingest), ("trainer", trainer), ("kafka", samples),
                          ("serving", serving)):
            ok, value = got
            self.components[name].mark(ok, None if ok else str(value), now_ms)
        raw = _Raw(now_s)
        if ingest[0]:
            raw.ingest = ingest[1].get((INGEST_ACCEPTED, ()), 0.0)
        if samples[0]:
            raw.samples = float(samples[1])
        recall = baseline = None
        if trainer[0]:
            tm: Samples = trainer[1]
            raw.trainer = tm.get((TRAINER_SAMPLES, ()), 0.0)
            raw.cluster = cluster_figures(tm)
            recall = _finite(tm.get((TRAINER_QUALITY, (("metric", f"recall@{self.k}"),))))
            # the strongest of the baselines the trainer keeps live beside the model
            live = [_finite(tm.get((TRAINER_QUALITY, (("metric", f"{b}_recall@{self.k}"),))))
                    for b in LIVE_BASELINES]
            baseline = max((v for v in live if v is not None), default=None)
            through = _finite(tm.get((TRAINER_THROUGH, ())))
            self.components["trainer"].detail["trained_through_ms"] = (
                int(through * 1000) if through else None)
        if serving[0]:
            self._read_serving(raw, serving[1])
        self.model = model
        self._raw.append(raw)
        while self._raw and self._raw[0].t_s < now_s - max(self.rate_window_s * 3, 30.0):
            self._raw.popleft()
        point = self._point(raw, now_ms)
        point.update(recall=recall, recall_baseline=baseline,
                     model_age_s=_finite(model.age_s), model_version=model.version)
        self._points.append(point)
        while self._points and self._points[0]["t_ms"] < now_ms - self.window_s * 1000:
            self._points.popleft()

    async def _scrape_http(self, name: str, url: str | None) -> tuple[bool, Any]:
        if url is None:
            return False, "not configured"
        try:
            return True, await fetch_metrics(self._http, url)
        except ScrapeError as exc:
            log.debug("%s metrics unavailable: %s", name, exc)
            return False, str(exc)

    async def _scrape_model(self) -> ModelStatus:
        if self.model_url is None:
            return UNKNOWN_MODEL
        try:
            return await fetch_model(self._http, self.model_url)
        except ScrapeError as exc:
            log.debug("served model unavailable: %s", exc)
            return UNKNOWN_MODEL

    async def _scrape_kafka(self) -> tuple[bool, Any]:
        if self.samples_offsets is None:
            return False, "not configured"
        if self._kafka_task is None:
            self._kafka_task = asyncio.ensure_future(asyncio.to_thread(self.samples_offsets))
        task = self._kafka_task
        done, _ = await asyncio.wait({task}, timeout=self.kafka_timeout_s)
        if not done:  # leave it running; the next tick collects it instead of piling up calls
            return False, f"timeout (no answer in {self.kafka_timeout_s:g} s)"
        self._kafka_task = None
        exc = task.exception()
        if exc is None:
            return True, task.result()
        if not isinstance(exc, ScrapeError):
            log.warning("samples offsets failed: %r", exc)
            return False, f"{type(exc).__name__}: {exc}"
        return False, str(exc)

    @staticmethod
    def _read_serving(raw: _Raw, own: Samples) -> None:
        buckets: dict[float, float] = {}
        counts: dict[str, float] = {}
        for (name, labels), value in own.items():
            lab = dict(labels)
            if name == f"{REQUEST_SECONDS}_bucket":
                le = float(lab["le"])
                buckets[le] = buckets.get(le, 0.0) + value
            elif name == f"{REQUEST_SECONDS}_count":
                counts[lab.get("source", "")] = value
        raw.buckets, raw.counts = buckets, counts

    # -- derived figures -----------------------------------------------------------------------

    def _base(self, now: _Raw, attr: str) -> _Raw | None:
        """The oldest earlier tick within the rate window that has ``attr``, not counting
        across a reset (a lifetime counter that went backwards: the process restarted)."""
        horizon = now.t_s - self.rate_window_s - 1e-6
        later, base = getattr(now, attr), None
        for old in reversed(self._raw):
            if old is now or old.t_s >= now.t_s:
                continue
            if old.t_s < horizon:
                break
            value = getattr(old, attr)
            if value is None:
                continue
            if attr != "buckets" and value > later:
                break
            base, later = old, (value if attr != "buckets" else later)
        return base

    def _rate(self, now: _Raw, attr: str) -> float | None:
        value = getattr(now, attr)
        base = self._base(now, attr) if value is not None else None
        if base is None:
            return None
        delta, dt = value - getattr(base, attr), now.t_s - base.t_s
        return delta / dt if delta >= 0 and dt > 0 else None

    def _point(self, now: _Raw, now_ms: int) -> dict[str, Any]:
        point: dict[str, Any] = {
            "t_ms": now_ms,
            "ingest_eps": self._rate(now, "ingest"),
            "samples_ps": self._rate(now, "samples"),
            "trainer_eps": self._rate(now, "trainer"),
            "p50_ms": None, "p99_ms": None, "rps": None,
            "share_popular": None, "share_degraded": None,
        }
        base = self._base(now, "buckets")
        if base is None or now.buckets is None or base.buckets is None:
            return point
        old_b, old_c = base.buckets, base.counts or {}
        delta_b = [(le, c - old_b.get(le, 0.0)) for le, c in now.buckets.items()]
        delta_c = {s: c - old_c.get(s, 0.0) for s, c in (now.counts or {}).items()}
        total = sum(delta_c.values())
        dt = now.t_s - base.t_s
        if min((d for _, d in delta_b), default=0.0) < 0 or total < 0 or dt <= 0:
            return point
        point["rps"] = total / dt
        if total > 0:
            p50, p99 = histogram_quantile(0.5, delta_b), histogram_quantile(0.99, delta_b)
            point["p50_ms"] = p50 * 1000.0 if p50 is not None else None
            point["p99_ms"] = p99 * 1000.0 if p99 is not None else None
            point["share_popular"] = delta_c.get("popular", 0.0) / total
            point["share_degraded"] = delta_c.get("degraded", 0.0) / total
        return point

    def _cluster(self) -> dict[str, Any] | None:
        """The cluster panel from the newest scrape with cluster figures (``stale`` when the
        trainer's last scrape had none) and the oldest within the rate window before it."""
        raws = list(self._raw)
        now = next((r for r in reversed(raws) if r.cluster is not None), None)
        if now is None or now.cluster is None:
            return None
        horizon = now.t_s - self.rate_window_s - 1e-6
        base = next((r for r in raws if r.cluster is not None and horizon <= r.t_s < now.t_s), None)
        view = cluster_view(now.cluster, base.cluster if base else None,
                            now.t_s - base.t_s if base else 0.0)
        return {**view, "t_ms": int(now.t_s * 1000), "stale": now is not raws[-1]}

    # -- output --------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The JSON body of ``GET /stats`` (only finite numbers, ``null`` for unknown)."""
        points = list(self._points)
        model = self.model
        return {
            "now_ms": int(self.clock().timestamp() * 1000),
            "interval_s": self.interval_s,
            "window_s": self.window_s,
            "rate_window_s": self.rate_window_s,
            "k": self.k,
            "components": {name: c.as_json() for name, c in self.components.items()},
            "model": {"version": model.version, "age_s": _finite(model.age_s)},
            "latest": dict(points[-1]) if points else None,
            "cluster": self._cluster(),
            "series": {name: [p.get(name) for p in points] for name in ("t_ms", *SERIES)},
        }

    async def aclose(self) -> None:
        task, self._kafka_task = self._kafka_task, None
        if task is not None:
            task.cancel()
        await self._http.aclose()
        closer = getattr(self.samples_offsets, "close", None)
        if callable(closer):
            await asyncio.to_thread(closer)

