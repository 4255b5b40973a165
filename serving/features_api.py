"""Read side of the online store: ``GET /users/{user_id}/features``, ``GET /items/{item_id}/features``.

A router factory taking an :class:`~feature_store.store.OnlineStore`; the serving app mounts it
(``app.include_router(features_router(store))``). Answers what the store holds, with the event
time it is current to (``as_of_ms``); 404 for an id the store does not hold; 503 if the store
cannot be reached (as :class:`~serving.errors.ServingError`: an app mounting the router maps
them with ``serving.errors.install``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from feature_store.store import OnlineStore, OnlineStoreError
from serving.errors import NotFound, StoreUnavailable

log = logging.getLogger(__name__)


def features_router(store: OnlineStore) -> APIRouter:
    """Routes that read user and item features from ``store``."""
    router = APIRouter(tags=["features"])

    @router.get("/users/{user_id:path}/features")
    async def user_features(user_id: str) -> dict[str, Any]:
        found = await _read(store.read_users, user_id)
        if found is None:
            raise NotFound(f"unknown user_id {user_id!r}")
        return asdict(found)

    @router.get("/items/{item_id:path}/features")
    async def item_features(item_id: str) -> dict[str, Any]:
        found = await _read(store.read_items, item_id)
        if found is None:
            raise NotFound(f"unknown item_id {item_id!r}")
        return asdict(found)

    return router


async def _read(reader: Any, key: str) -> Any:
    try:
        (found,) = await run_in_threadpool(reader, [key])
    except OnlineStoreError as exc:
        log.warning("online store read failed: %s", exc)
        raise StoreUnavailable("feature store unavailable") from exc
    return found
