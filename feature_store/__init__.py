"""Feature definitions, the online store seam and its Redis backend (layout: FORMAT.md).

* ``features`` (+ ``sample``) — every feature as a pure function of (state, event).
* ``catalogue`` — the feature spec: item attribute slots, context and time slots, their checks.
* ``store`` — the :class:`OnlineStore` interface, its records (features and the item
  catalogue, :class:`CatalogueItem`), and :func:`open_store`, which
  every writer and reader builds its store with (backend: ``settings.store.backend``).
* ``redis_store`` — the Redis backend (the only one for now).
* ``errors`` — one root, :class:`FeatureStoreError`.

Settings, id hashing and the metric names live in the kernel, ``streamrec`` (the one
package below this one).

Importing the package is light: the Redis client is imported only when a store is built.
"""

from feature_store.errors import FeatureStoreError, OnlineStoreError
from feature_store.features import (
    Event,
    FeatureParams,
    ItemState,
    Sample,
    TrendingState,
    UserState,
    item_features,
    make_sample,
    trending,
    update_item,
    update_trending,
    update_user,
    user_features,
)
from feature_store.store import (
    CatalogueItem,
    Generation,
    HistoryEntry,
    ItemFeatures,
    Mark,
    OnlineStore,
    Trending,
    UserFeatures,
    UserRow,
    open_store,
)

__all__ = [
    "CatalogueItem",
    "Event",
    "FeatureParams",
    "FeatureStoreError",
    "Generation",
    "HistoryEntry",
    "ItemFeatures",
    "ItemState",
    "Mark",
    "OnlineStore",
    "OnlineStoreError",
    "Sample",
    "Trending",
    "TrendingState",
    "UserFeatures",
    "UserRow",
    "UserState",
    "item_features",
    "make_sample",
    "open_store",
    "trending",
    "update_item",
    "update_trending",
    "update_user",
    "user_features",
]
