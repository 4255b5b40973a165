"""Feature definitions, the online store seam and its Redis backend (layout: FORMAT.md).

Importing the package is light: the Redis client is imported only when a store is built.
"""

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
from feature_store.redis_store import RedisOnlineStore
from feature_store.store import (
    HistoryEntry,
    ItemFeatures,
    OnlineStore,
    OnlineStoreError,
    Trending,
    UserFeatures,
)

__all__ = [
    "Event",
    "FeatureParams",
    "HistoryEntry",
    "ItemFeatures",
    "ItemState",
    "OnlineStore",
    "OnlineStoreError",
    "RedisOnlineStore",
    "Sample",
    "Trending",
    "TrendingState",
    "UserFeatures",
    "UserState",
    "item_features",
    "make_sample",
    "trending",
    "update_item",
    "update_trending",
    "update_user",
    "user_features",
]
