"""The serving API: ``create_app(settings)`` with a lifespan that owns the version watcher.

Request path of ``GET /recommend``: user features from the online store (FORMAT.md, read only
through ``feature_store.store.OnlineStore``) -> user vector from the served version -> exact
top-k -> drop seen items -> pad with trending items. The answer's ``source`` says how it was
made: ``model``; ``popular`` (no model yet, or a user neither the store nor the model knows);
``degraded`` (the store failed: the model on what it can use, else the cached trending list).
The endpoint never answers 5xx for a store or model failure.

Request bodies (only the admin routes take one) are capped at ``max_body_bytes`` by
:class:`BodyLimit` before any route parses them: 413 beyond it, declared or streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Header, Query
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict

from feature_store.settings import Settings
from feature_store.store import OnlineStore, open_store
from model.artifact.guard_note import hold_reason, note_held_since
from model.artifact.registry import Registry, RegistryError
from serving import errors
from serving import metrics as m
from serving import retrieval as r
from serving.balance import ConnectionBalancer
from serving.dashboard import dashboard_router
from serving.deltas import DeltaFollower
from serving.errors import Forbidden, NotFound, Unauthorized
from serving.fastpath import MAX_USER_ID, RecommendFastPath
from serving.features_api import features_router
from serving.loader import ModelLoader, TrendingCache
from serving.metrics import ServingMetrics
from serving.shared_state import SharedFollower
from serving.stats_file import stats_path

log = logging.getLogger(__name__)

MAX_K = 500
#: Default cap on request bodies: the largest legitimate one is a pin request of ~150 bytes.


class BodyLimit:
    """ASGI middleware: buffer at most ``limit`` bytes of a request body, else answer 413.

    FastAPI parses a JSON body before the route runs (so before the admin token is checked);
    without a cap an anonymous client could make the process hold an arbitrarily large body.
    """

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        has_body = False
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if value.isdigit() and int(value) > self.limit:
                    await self._too_large(scope, receive, send)
                    return
                has_body = value != b"0"
            elif name == b"transfer-encoding":
                has_body = True
        if not has_body:  # nothing to buffer (e.g. every GET /recommend)
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Any, receive: Any, send: Any) -> None:
        response = JSONResponse(
            {"error": "payload_too_large", "detail": f"request body exceeds {self.limit} bytes"},
            status_code=413, headers={"Connection": "close"})
        await response(scope, receive, send)


def utc_now() -> datetime:
    """The production clock (tests inject their own)."""
    return datetime.now(UTC)


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str | None = None


class ServingState:
    """Everything the routes use, built once per app."""

    def __init__(
        self,
        settings: Settings,
        store: OnlineStore,
        registry: Registry,
        clock: Callable[[], datetime],
        pubsub_factory: Callable[[], Any] | None,
        metrics_dir: str | None = None,
        shared_dir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = ServingMetrics(clock=clock, multiprocess_dir=metrics_dir)
        self.registry = registry
        self.loader = ModelLoader(registry, self.metrics, clock, settings.serving.poll_interval_s)
        self.trending = TrendingCache(store, settings.features.trending_n)
        self.store_guard = r.StoreGuard(store)
        self.recommender = r.Recommender(
            lambda: self.loader.current, lambda: self.trending.items, self.store_guard,
            self.metrics)
        self.metrics.track_store_state(lambda: self.store_guard.health.status().state)
        self.pubsub_factory = pubsub_factory
        self.deltas: DeltaFollower | SharedFollower | None = None
        if settings.trainer.delta_every_s > 0 and shared_dir is not None:
            self.deltas = SharedFollower(self.loader, registry, shared_dir, clock)
        elif settings.trainer.delta_every_s > 0:
            self.deltas = DeltaFollower(self.loader, registry, settings.kafka, clock,
                                        apply_share=settings.serving.delta_apply_share)

    async def recommend(self, user_id: str, k: int, exclude_seen: bool) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            answer = await self.recommender.submit(r.Ask(user_id, k, exclude_seen))
        except Exception:
            log.exception("recommendation failed for %s; answering from trending", user_id)
            self.metrics.fallbacks.labels(m.INTERNAL_ERROR).inc()
            answer = r.Answer(r.popular(self.trending.items, k, set()), r.DEGRADED, None)
        took = time.perf_counter() - start
        self.metrics.request_seconds.labels(answer.source).observe(took)
        return {
            "user_id": user_id,
            "items": [{"item_id": s.item_id, "score": s.score} for s in answer.items],
            "model_version": answer.version,
            "source": answer.source,
            "reason": answer.reason,
            "took_ms": round(took * 1000.0, 3),
        }

    def model_info(self, checksum: bool = False) -> dict[str, Any]:
        model = self.loader.current
        info: dict[str, Any] = {
            "worker_pid": os.getpid(),
            "version": None,
            "current_pointer": self.registry.current(),
            "pinned": self.registry.pinned(),
            "refused": self.loader.refused,
            # the trainer's quality guard: held, its figures, the version it pinned
            "guard": self.registry.guard(),
        }
        if self.deltas is not None:
            info["delta"] = self.deltas.status(checksum)
        if model is None:
            return info
        through = model.trained_through_ms
        created = model.created_at
        info.update(
            version=model.version,
            loaded_at=model.loaded_at.isoformat(),
            created_at=created.isoformat() if created else None,
            trained_through_ms=through,
            trained_through=(
                datetime.fromtimestamp(through / 1000.0, UTC).isoformat() if through else None
            ),
            age_s=self.loader.age_s(),
            trained_through_age_s=(
                (self.clock() - datetime.fromtimestamp(through / 1000.0, UTC)).total_seconds()
                if through else None
            ),
            items=int(model.artifact.item_ids.shape[0]),
            dim=model.artifact.dim,
        )
        return info

    def check_admin(self, authorization: str | None, x_admin_token: str | None) -> None:
        token = x_admin_token
        if token is None and authorization and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        if not token:
            raise Unauthorized("admin token required (Authorization: Bearer ... or X-Admin-Token)")
        expected = self.settings.serving.admin_token
        if expected is None:
            raise Forbidden("admin endpoints are disabled (no serving.admin_token configured)")
        if not hmac.compare_digest(token.encode(), expected.get_secret_value().encode()):
            raise Forbidden("wrong admin token")

    def pin(self, version: str) -> dict[str, Any]:
        try:
            self.registry.path(version)
        except RegistryError as exc:
            raise NotFound(str(exc)) from exc
        model = self.loader.prepare(version)  # refuses (422) before the pointer moves
        self.registry.pin(version)
        self.loader.swap(model)
        return self.model_info()

    def rollback(self, to: str | None) -> dict[str, Any]:
        try:
            target = self.registry.rollback_target(to)
        except RegistryError as exc:
            raise NotFound(str(exc)) from exc
        model = self.loader.prepare(target)
        self.registry.rollback(target)
        self.loader.swap(model)
        return self.model_info()

    def unpin(self) -> dict[str, Any]:
        self.registry.unpin()
        self.loader.check()
        return self.model_info()


def _redis_kwargs(settings: Settings) -> dict[str, Any]:
    rs = settings.redis
    password = rs.password.get_secret_value() if rs.password else None
    return {"host": rs.host, "port": rs.port, "db": rs.db, "password": password,
            "socket_timeout": 2.0, "socket_connect_timeout": 1.0}


def create_app(
    settings: Settings,
    store: OnlineStore | None = None,
    clock: Callable[[], datetime] = utc_now,
    *,
    registry: Registry | None = None,
    pubsub_factory: Callable[[], Any] | None = None,
    watch: bool = True,
    stats_file: Path | None = None,
    max_body_bytes: int | None = None,
    metrics_dir: str | None = None,
    balancer: ConnectionBalancer | None = None,
    shared_dir: Path | None = None,
) -> FastAPI:
    """Build the serving app. ``store`` defaults to ``feature_store.open_store(settings)``,
    ``registry``/``pubsub_factory`` to the Redis-backed ones from ``settings``; ``watch=False``
    skips the background tasks; ``stats_file`` is the dashboard collector's snapshot that
    ``GET /stats`` answers with (default ``serving.stats_file.stats_path(settings)``; serving
    scrapes nothing itself); ``max_body_bytes`` caps request bodies (413 beyond);
    ``metrics_dir`` is the multiprocess metrics folder shared by the workers of one server
    (``/metrics`` then answers for all of them, see ``serving.metrics``); ``balancer``
    evens keep-alive connections out over those workers (``serving.balance``);
    ``shared_dir``: the directory of the host's delta composer, whose states this worker
    maps instead of following the deltas itself (``serving.shared_state``). Errors
    of the routes reach HTTP through ``serving.errors.install`` only."""
    if registry is None:
        import redis

        registry = Registry(
            settings.trainer.registry_dir,
            settings.trainer.model_name,
            redis_client=redis.Redis(**_redis_kwargs(settings)),
            key_prefix=settings.redis.key_prefix,
            keep=settings.trainer.keep_versions,
        )
    if pubsub_factory is None and watch:
        import redis.asyncio

        kwargs = _redis_kwargs(settings) | {"socket_timeout": None}
        pubsub_factory = lambda: redis.asyncio.Redis(**kwargs)  # noqa: E731
    store = store or open_store(settings, timeout_s=1.0)
    state = ServingState(settings, store, registry, clock, pubsub_factory, metrics_dir,
                         shared_dir)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(state.loader.check)
        await asyncio.to_thread(state.trending.refresh)
        tasks = []
        if watch:
            tasks.append(asyncio.create_task(state.loader.watch(), name="model-watch"))
            tasks.append(asyncio.create_task(state.trending.run(), name="trending"))
            if state.pubsub_factory is not None:
                tasks.append(asyncio.create_task(
                    state.loader.listen(state.pubsub_factory), name="model-pubsub"))
            if balancer is not None:
                tasks.append(asyncio.create_task(balancer.run(), name="connection-balance"))
            if state.deltas is not None:
                state.deltas.start()
        try:
            yield
        finally:
            if state.deltas is not None:
                await asyncio.to_thread(state.deltas.stop)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            state.metrics.worker_exited()

    app = FastAPI(title="streamrec serving", lifespan=lifespan)
    app.add_middleware(
        BodyLimit,
        limit=max_body_bytes if max_body_bytes is not None else settings.serving.max_body_bytes,
    )
    # outermost of ours: a well-formed GET /recommend skips the routing (serving.fastpath)
    app.add_middleware(RecommendFastPath, answer=state.recommend,
                       default_k=settings.serving.default_k, max_k=MAX_K,
                       close=balancer.should_close if balancer is not None else None)
    app.state.serving = state
    app.include_router(features_router(store, state.store_guard.health))
    app.include_router(dashboard_router(stats_file or stats_path(settings), clock))
    default_k = settings.serving.default_k

    errors.install(app)

    @app.get("/recommend")
    async def recommend(
        user_id: str = Query(min_length=1, max_length=MAX_USER_ID),
        k: int = Query(default_k, ge=1, le=MAX_K),
        exclude_seen: bool = True,
    ) -> Response:
        answer = await state.recommend(user_id, k, exclude_seen)
        return Response(orjson.dumps(answer), media_type="application/json")

    @app.get("/model")
    def model_info(checksum: bool = False) -> dict[str, Any]:
        return state.model_info(checksum)

    @app.get("/model/items/{item_id}")
    def model_item(item_id: str) -> dict[str, Any]:
        """Whether the served model can recommend ``item_id`` (it is in its catalog)."""
        model = state.loader.current
        return {
            "item_id": item_id,
            "in_catalog": model is not None and item_id in model.artifact.item_index,
            "version": model.version if model else None,
            "delta_seq": model.manifest.get("delta_seq") if model else None,
        }

    @app.post("/model/pin")
    def pin(
        body: PinRequest,
        authorization: str | None = Header(None),
        x_admin_token: str | None = Header(None),
    ) -> dict[str, Any]:
        state.check_admin(authorization, x_admin_token)
        return state.pin(body.version)

    @app.delete("/model/pin")
    def unpin(
        authorization: str | None = Header(None),
        x_admin_token: str | None = Header(None),
    ) -> dict[str, Any]:
        state.check_admin(authorization, x_admin_token)
        return state.unpin()

    @app.post("/model/rollback")
    def rollback(
        body: RollbackRequest | None = None,
        authorization: str | None = Header(None),
        x_admin_token: str | None = Header(None),
    ) -> dict[str, Any]:
        state.check_admin(authorization, x_admin_token)
        return state.rollback(body.to if body else None)

    @app.get("/health")
    def health() -> JSONResponse:
        model = state.loader.current
        ready = model is not None or state.trending.loaded
        # a quality guard hold older than the alarm (the trainer's GUARD.json note) is a
        # degradation, not unreadiness: the served model stays valid, only newer ones wait
        held = hold_reason(note_held_since(state.registry.guard()), state.clock(),
                           settings.trainer.guard_hold_alarm_s)
        degraded = [held] if held else []
        body = {
            "status": "starting" if not ready else "degraded" if degraded else "ready",
            "degraded": degraded,
            "model_version": model.version if model else None,
            "trending_items": len(state.trending.items),
            "store": state.store_guard.health.status().as_dict(),
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        state.metrics.refresh_store_state()
        return Response(generate_latest(state.metrics.exposition), media_type=CONTENT_TYPE_LATEST)

    return app
