"""What the serving routes call: :class:`ServingState`, built once per app.

It owns the model loader, the trending cache, the store guard, the recommender and the delta
follower of one worker, and answers the routes: a recommendation (never a 5xx for a store or
model failure), the served model's description, and the admin operations (pin, unpin,
rollback) behind the admin token.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from feature_store.store import OnlineStore
from model.artifact.registry import Registry, RegistryError
from model.scoring.ann import AnnParams
from serving import metrics as m
from serving import retrieval as r
from serving.deltas import DeltaFollower
from serving.errors import Forbidden, NotFound, Unauthorized
from serving.loader import ModelLoader, TrendingCache
from serving.metrics import ServingMetrics
from serving.shared_state import SharedFollower
from streamrec.settings import Settings

log = logging.getLogger(__name__)


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
        ann_dir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = ServingMetrics(clock=clock, multiprocess_dir=metrics_dir)
        self.registry = registry
        sv = settings.serving
        self.loader = ModelLoader(
            registry, self.metrics, clock, sv.poll_interval_s, ann_min_items=sv.ann_min_items,
            ann=AnnParams(nlist=sv.ann_lists, nprobe=sv.ann_nprobe, candidates=sv.ann_candidates,
                          rebuild_share=sv.ann_rebuild_share), ann_cache=ann_dir)
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
            # how requests are ranked: exactly over every item, or in two stages through the
            # ANN index (model.scoring.ann) with the rows it cannot vouch for scored exactly
            retrieval=(
                {"kind": "exact"} if model.ann is None else {
                    "kind": "ann", "lists": model.ann.index.nlist,
                    "probed": min(model.ann.index.params.nprobe, model.ann.index.nlist),
                    "candidates": model.ann.index.params.candidates,
                    "exact_rows": int(model.ann.exact_rows.size),
                    "changed_since_build": model.ann.stale,
                    "build_s": round(model.ann.index.build_s, 2)}
            ),
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
