"""Read side of the online store: ``GET /users/{user_id}/features``, ``GET /items/{item_id}/features``
and the item catalogue, ``GET /items/{item_id}`` (``{"item_id", "attributes", "ts"}``).

A router factory taking an :class:`~feature_store.store.OnlineStore`; the serving app mounts it
(``app.include_router(features_router(store))``). Answers what the store holds, with the event
time it is current to (``as_of_ms``); 404 for an id the store does not hold, but 503 while the
store is not whole (``serving.store_health``: the id may be among what it lost); 503 if the store
cannot be reached (as :class:`~serving.errors.ServingError`: an app mounting the router maps
them with ``serving.errors.install``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any, NoReturn

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from feature_store.store import OnlineStore, OnlineStoreError
from serving.errors import NotFound, StoreUnavailable
from serving.store_health import StoreHealth

log = logging.getLogger(__name__)


def features_router(store: OnlineStore, health: StoreHealth | None = None) -> APIRouter:
    """Routes that read user and item features from ``store`` (``health``: whether it is
    whole; by default read from ``store``)."""
    router = APIRouter(tags=["features"])
    health = health or StoreHealth(store)

    async def _missing(what: str) -> NoReturn:
        status = await run_in_threadpool(health.status)
        if status.degraded:
            raise StoreUnavailable(f"{what} not in the feature store, which is not whole: "
                                   f"{status.reason}")
        raise NotFound(what)

    @router.get("/users/{user_id:path}/features")
    async def user_features(user_id: str) -> dict[str, Any]:
        found = await _read(store.read_users, user_id)
        if found is None:
            await _missing(f"unknown user_id {user_id!r}")
        return asdict(found)

    @router.get("/items/{item_id:path}/features")
    async def item_features(item_id: str) -> dict[str, Any]:
        found = await _read(store.read_items, item_id)
        if found is None:
            await _missing(f"unknown item_id {item_id!r}")
        return asdict(found)

    # After the features route: an id ending in "/features" is read as that route.
    @router.get("/items/{item_id:path}", tags=["catalogue"])
    async def catalogue_item(item_id: str) -> dict[str, Any]:
        """The item's catalogue attributes and the time they are current to (epoch ms)."""
        found = await _read(store.read_catalogue, item_id)
        if found is None:
            await _missing(f"item_id {item_id!r} not in the catalogue")
        return {"item_id": found.item_id, "attributes": found.attributes, "ts": found.ts_ms}

    return router


async def _read(reader: Any, key: str) -> Any:
    try:
        (found,) = await run_in_threadpool(reader, [key])
    except OnlineStoreError as exc:
        log.warning("online store read failed: %s", exc)
        raise StoreUnavailable("feature store unavailable") from exc
    return found
