"""The serving API's own routes: ``/recommend``, ``/model`` (and its admin routes), ``/health``
and ``/metrics``, over one :class:`~serving.service.ServingState`.

Request path of ``GET /recommend``: user features from the online store (FORMAT.md, read only
through ``feature_store.store.OnlineStore``) -> user vector from the served version -> exact
top-k -> drop seen items -> pad with trending items. The answer's ``source`` says how it was
made: ``model``; ``popular`` (no model yet, or a user neither the store nor the model knows);
``degraded`` (the store failed: the model on what it can use, else the cached trending list).
The endpoint never answers 5xx for a store or model failure. (A well-formed ``GET /recommend``
is answered before the routing by ``serving.fastpath``, with the same body.)
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict

from model.artifact.guard_note import hold_reason, note_held_since
from serving.fastpath import MAX_USER_ID
from serving.service import ServingState

MAX_K = 500


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str | None = None


def serving_router(state: ServingState) -> APIRouter:
    """The routes above, answered by ``state``."""
    router = APIRouter()
    settings = state.settings
    default_k = settings.serving.default_k

    @router.get("/recommend")
    async def recommend(
        user_id: str = Query(min_length=1, max_length=MAX_USER_ID),
        k: int = Query(default_k, ge=1, le=MAX_K),
        exclude_seen: bool = True,
    ) -> Response:
        answer = await state.recommend(user_id, k, exclude_seen)
        return Response(orjson.dumps(answer), media_type="application/json")

    @router.get("/model")
    def model_info(checksum: bool = False) -> dict[str, Any]:
        return state.model_info(checksum)

    @router.get("/model/items/{item_id}")
    def model_item(item_id: str) -> dict[str, Any]:
        """Whether the served model can recommend ``item_id`` (it is in its catalog)."""
        model = state.loader.current
        return {
            "item_id": item_id,
            "in_catalog": model is not None and item_id in model.artifact.item_index,
            "version": model.version if model else None,
            "delta_seq": model.manifest.get("delta_seq") if model else None,
        }

    @router.post("/model/pin")
    def pin(
        body: PinRequest,
        authorization: str | None = Header(None),
        x_admin_token: str | None = Header(None),
    ) -> dict[str, Any]:
        state.check_admin(authorization, x_admin_token)
        return state.pin(body.version)

    @router.delete("/model/pin")
    def unpin(
        authorization: str | None = Header(None),
        x_admin_token: str | None = Header(None),
    ) -> dict[str, Any]:
        state.check_admin(authorization, x_admin_token)
        return state.unpin()

    @router.post("/model/rollback")
    def rollback(
        body: RollbackRequest | None = None,
        authorization: str | None = Header(None),
        x_admin_token: str | None = Header(None),
    ) -> dict[str, Any]:
        state.check_admin(authorization, x_admin_token)
        return state.rollback(body.to if body else None)

    @router.get("/health")
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

    @router.get("/metrics")
    def metrics() -> Response:
        state.metrics.refresh_store_state()
        return Response(generate_latest(state.metrics.exposition), media_type=CONTENT_TYPE_LATEST)

    return router
