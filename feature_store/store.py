"""The online store seam: what the Flink job writes and serving reads.

One backend for now (Redis, ``feature_store.redis_store``); the key layout is the written
spec ``feature_store/FORMAT.md``. Every record carries ``as_of_ms``, the event time it is
current to: a write whose ``as_of_ms`` is older than what the store holds is ignored, so a
replay never overwrites newer state with older state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    item_id: str
    event_type: str
    ts_ms: int


@dataclass(frozen=True, slots=True)
class UserFeatures:
    user_id: str
    #: Recent interactions, most recent first, at most ``features.history_len``.
    history: tuple[HistoryEntry, ...]
    #: window name ("1h", "24h", "7d") -> event type -> count in that window ending at as_of_ms.
    counts: dict[str, dict[str, int]]
    last_seen_ms: int
    as_of_ms: int


@dataclass(frozen=True, slots=True)
class ItemFeatures:
    item_id: str
    #: Decayed interaction score, valid at ``as_of_ms``.
    score: float
    #: window name ("1h", "24h") -> interaction count in that window ending at as_of_ms.
    counts: dict[str, int]
    as_of_ms: int


@dataclass(frozen=True, slots=True)
class Trending:
    #: (item_id, decayed score), best first.
    items: tuple[tuple[str, float], ...]
    as_of_ms: int
    extra: dict[str, str] = field(default_factory=dict)


class OnlineStoreError(Exception):
    """Root of the errors the online store raises (connection problems included)."""


class OnlineStore(ABC):
    """Batch writes and reads of feature records."""

    @abstractmethod
    def write_batch(
        self,
        users: Sequence[UserFeatures] = (),
        items: Sequence[ItemFeatures] = (),
        trending: Trending | None = None,
    ) -> None:
        """Write records in one round trip; older-than-stored records are ignored."""

    @abstractmethod
    def read_users(self, user_ids: Sequence[str]) -> list[UserFeatures | None]:
        """Read users; ``None`` for an id the store does not hold."""

    @abstractmethod
    def read_items(self, item_ids: Sequence[str]) -> list[ItemFeatures | None]:
        """Read items; ``None`` for an id the store does not hold."""

    @abstractmethod
    def read_trending(self, n: int) -> Trending | None:
        """The global trending list (top ``n``), or ``None`` if nothing was written yet."""
