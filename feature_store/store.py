"""The online store seam: what the Flink job writes and serving reads.

One backend for now (Redis, ``feature_store.redis_store``), picked by ``settings.store.backend``
in :func:`open_store`; the key layout is the written spec ``feature_store/FORMAT.md``.

Writes are idempotent and versioned by ``(as_of_ms, seq)``: an older write is ignored, so a
replay never overwrites newer state with older state. A writer that keeps the state behind its
records (the feature job) also counts its write batches per *part* (:class:`Mark`), so a store
that lost writes is detected and flagged as rehydrating until the writer has re-written it
(:meth:`OnlineStore.read_generation` says whether the store is whole). Details:
docs/internals.md and FORMAT.md "Generation".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from feature_store.errors import FeatureStoreError as FeatureStoreError
from feature_store.errors import OnlineStoreError as OnlineStoreError

if TYPE_CHECKING:
    from streamrec.settings import Settings

#: The backends :func:`open_store` knows (``settings.store.backend``).
BACKENDS = ("redis",)


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


@dataclass(frozen=True, slots=True)
class CatalogueItem:
    """An item of the catalogue: its attributes (checked against the feature spec,
    ``feature_store.catalogue``) as of ``ts_ms``; ``deleted`` marks a removal (a tombstone that
    keeps older upserts out)."""

    item_id: str
    attributes: dict[str, Any]
    ts_ms: int
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class Mark:
    """A write batch's place in its part's count of write batches (see the module doc):
    ``prev`` batches were written before this one, ``new`` after it (``new == prev``: a check
    that writes no record)."""

    part: str
    prev: int
    new: int


@dataclass(frozen=True, slots=True)
class Generation:
    """What the store says about its own completeness (FORMAT.md "Generation")."""

    #: Token of this life of the store's contents; None: no marker (never written, or lost).
    epoch: str | None
    #: Writer's wall clock (epoch ms) when ``epoch`` was created.
    since_ms: int
    #: part -> write batches the store holds.
    writes: dict[str, int]
    #: part -> epoch ms the rehydration was flagged at, for the parts not whole yet.
    rehydrating: dict[str, int]


#: A user record given as its parts, for a writer that skips building :class:`UserFeatures`:
#: ``(user_id, as_of_ms, seq, history, counts, last_seen_ms)`` with history entries as
#: ``(item_id, event_type, ts_ms)`` (``feature_store.features.user_history`` / ``user_counts``).
UserRow = tuple[str, int, int, Sequence[tuple[str, str, int]], dict[str, dict[str, int]], int]


class OnlineStore(ABC):
    """Versioned batch writes and batch reads of feature records (see the module doc)."""

    @abstractmethod
    def write_batch(
        self,
        users: Sequence[UserFeatures] = (),
        items: Sequence[ItemFeatures] = (),
        trending: Trending | None = None,
        *,
        user_seqs: Sequence[int] | None = None,
        item_seqs: Sequence[int] | None = None,
        trending_seq: int = 0,
        mark: Mark | None = None,
    ) -> bool:
        """Write records in one round trip, each only if its ``(as_of_ms, seq)`` is not older
        than the stored one. ``user_seqs[n]`` / ``item_seqs[n]`` is the ``seq`` of
        ``users[n]`` / ``items[n]`` (all 0 when omitted); also records each item id in the
        reverse map (:meth:`read_item_ids`). With ``mark``, the batch also advances its part's
        count; returns False if the store is behind the writer (it lost writes: the part is
        now flagged rehydrating), True otherwise."""

    def write_user_rows(self, rows: Iterable[UserRow], mark: Mark | None = None) -> bool:
        """:meth:`write_batch` of users given as :data:`UserRow` parts (the feature job's hot
        path: no per-entry objects). Backends encode the parts directly; this default builds
        the records."""
        users, seqs = [], []
        for user_id, as_of_ms, seq, history, counts, last_seen_ms in rows:
            users.append(UserFeatures(
                user_id=user_id,
                history=tuple(HistoryEntry(i, t, ts) for i, t, ts in history),
                counts=counts,
                last_seen_ms=last_seen_ms,
                as_of_ms=as_of_ms,
            ))
            seqs.append(seq)
        if users or mark is not None:
            return self.write_batch(users=users, user_seqs=seqs, mark=mark)
        return True

    def write_catalogue(self, records: Sequence[CatalogueItem]) -> int:
        """Write catalogue items (upserts and deletes) in one round trip, each only if its
        ``ts_ms`` is not older than the stored one (an equal one is written again: the later
        write wins); returns how many were written. Upserts also enter the reverse map."""
        raise FeatureStoreError(f"{type(self).__name__} keeps no item catalogue")

    def read_catalogue(self, item_ids: Sequence[str]) -> list[CatalogueItem | None]:
        """Catalogue items; ``None`` for an id the store does not hold or that was deleted."""
        raise FeatureStoreError(f"{type(self).__name__} keeps no item catalogue")

    def read_generation(self) -> Generation | None:
        """The store's generation marker (None: this backend keeps none)."""
        return None

    def finish_rehydration(self, part: str, writes: int) -> None:  # noqa: B027 - optional
        """``part`` has re-written its whole state: the store now holds ``writes`` batches."""

    @abstractmethod
    def read_users(self, user_ids: Sequence[str]) -> list[UserFeatures | None]:
        """Read users; ``None`` for an id the store does not hold."""

    @abstractmethod
    def read_items(self, item_ids: Sequence[str]) -> list[ItemFeatures | None]:
        """Read items; ``None`` for an id the store does not hold."""

    @abstractmethod
    def read_trending(self, n: int) -> Trending | None:
        """The global trending list (top ``n``), or ``None`` if nothing was written yet."""

    @abstractmethod
    def read_item_ids(self, keys: Sequence[int]) -> list[str | None]:
        """Reverse map: internal item keys (``streamrec.ids.item_key``) -> external item
        ids of written items; ``None`` for a key the store does not know."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the backend's connections."""


def open_store(settings: Settings, *, timeout_s: float = 5.0) -> OnlineStore:
    """The online store named by ``settings.store.backend``, configured from ``settings``.
    ``timeout_s`` bounds each call to the backend (connect and read)."""
    backend = settings.store.backend
    if backend == "redis":
        from feature_store.redis_store import RedisOnlineStore

        return RedisOnlineStore(settings.redis, settings.features, socket_timeout_s=timeout_s)
    raise FeatureStoreError(f"unknown online store backend {backend!r} (known: {BACKENDS})")
