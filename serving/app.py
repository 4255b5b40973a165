"""The serving API: ``create_app(ServingDeps(settings))`` with a lifespan that owns the
background work of one worker (the version watcher, the trending refresh, the model pub/sub,
the connection balancer, the delta follower) and cancels it on shutdown.

The pieces live beside it: the dependencies in ``serving.deps``, what the routes call in
``serving.service``, the routes in ``serving.routes`` (plus ``serving.features_api`` and the
dashboard's ``serving.dashboard``), the body cap in ``serving.middleware`` and the
``GET /recommend`` fast path in ``serving.fastpath``. Request bodies (only the admin routes
take one) are capped at ``max_body_bytes`` before any route parses them: 413 beyond it,
declared or streamed. Errors of the routes reach HTTP through ``serving.errors.install`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI

from serving import errors
from serving.dashboard import dashboard_router
from serving.deps import Resolved, ServingDeps, resolve
from serving.fastpath import RecommendFastPath
from serving.features_api import features_router
from serving.middleware import BodyLimit
from serving.routes import MAX_K, serving_router
from serving.service import ServingState


def create_app(deps: ServingDeps) -> FastAPI:
    """Build the serving app of one worker from ``deps`` (see :class:`ServingDeps`)."""
    wired = resolve(deps)
    state = ServingState(wired.settings, wired.store, wired.registry, wired.clock,
                         wired.pubsub_factory, wired.metrics_dir, wired.shared_dir,
                         ann_dir=wired.ann_dir)
    app = FastAPI(title="streamrec serving", lifespan=_lifespan(state, wired))
    app.add_middleware(BodyLimit, limit=wired.max_body_bytes)
    # outermost of ours: a well-formed GET /recommend skips the routing (serving.fastpath)
    balancer = wired.balancer
    app.add_middleware(RecommendFastPath, answer=state.recommend,
                       default_k=wired.settings.serving.default_k, max_k=MAX_K,
                       close=balancer.should_close if balancer is not None else None)
    app.state.serving = state
    app.include_router(features_router(wired.store, state.store_guard.health))
    app.include_router(dashboard_router(wired.stats_file, wired.clock))
    app.include_router(serving_router(state))
    errors.install(app)
    return app


def _lifespan(state: ServingState,
              wired: Resolved) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[Any]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(state.loader.check)
        await asyncio.to_thread(state.trending.refresh)
        tasks = []
        if wired.watch:
            tasks.append(asyncio.create_task(state.loader.watch(), name="model-watch"))
            tasks.append(asyncio.create_task(state.trending.run(), name="trending"))
            if state.pubsub_factory is not None:
                tasks.append(asyncio.create_task(
                    state.loader.listen(state.pubsub_factory), name="model-pubsub"))
            if wired.balancer is not None:
                tasks.append(asyncio.create_task(wired.balancer.run(), name="connection-balance"))
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

    return lifespan
