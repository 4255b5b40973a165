"""Baselines of the test-then-train evaluation (``model.evaluation.replay``), numpy only.

Both score every candidate item with one number shared by all users; the evaluation ranks
the candidates by that score (ties: the item first seen earlier in the stream wins) and
drops the items the user already interacted with.

* :class:`PopularityBaseline` — all-time count of positive events per item so far.
* :class:`RecentPopularityBaseline` — the same counts, exponentially decayed in event
  time: an event ``dt`` ms older than the newest event learned from counts
  ``2 ** (-dt / half_life_ms)``. ``streamrec evaluate`` uses a half-life of 365 days (why:
  ``docs/decisions.md#recent-popularity``).

Items are identified by their position in the evaluation's candidate list (first
appearance in the stream), so the arrays grow as new items appear.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DAY_MS = 86_400_000


def _grow(values: np.ndarray, n: int) -> np.ndarray:
    if values.size >= n:
        return values
    out = np.zeros(max(n, 2 * values.size), values.dtype)
    out[: values.size] = values
    return out


class PopularityBaseline:
    """Counts of positive events per item index, all time so far."""

    name = "popularity"

    def __init__(self) -> None:
        self.counts = np.zeros(1024, np.float64)

    def learn(
        self, item_index: Sequence[int] | np.ndarray, ts_ms: Sequence[int] | np.ndarray
    ) -> None:
        idx = np.asarray(item_index, np.int64)
        if idx.size == 0:
            return
        self.counts = _grow(self.counts, int(idx.max()) + 1)
        np.add.at(self.counts, idx, 1.0)

    def scores(self, n_candidates: int) -> np.ndarray:
        """Score of candidates ``0 .. n_candidates - 1`` (shape ``[n_candidates]``)."""
        self.counts = _grow(self.counts, n_candidates)
        return self.counts[:n_candidates].copy()


class RecentPopularityBaseline:
    """Exponentially decayed counts (half-life in event time), valid at the newest event."""

    name = "recent_popularity"

    def __init__(self, half_life_ms: int = 365 * DAY_MS) -> None:
        if half_life_ms <= 0:
            raise ValueError("half_life_ms must be > 0")
        self.half_life_ms = half_life_ms
        self.values = np.zeros(1024, np.float64)
        self.as_of_ms: int | None = None

    def learn(
        self, item_index: Sequence[int] | np.ndarray, ts_ms: Sequence[int] | np.ndarray
    ) -> None:
        idx = np.asarray(item_index, np.int64)
        ts = np.asarray(ts_ms, np.int64)
        if idx.size == 0:
            return
        newest = int(ts.max())
        if self.as_of_ms is None:
            self.as_of_ms = newest
        if newest > self.as_of_ms:
            self.values *= 2.0 ** (-(newest - self.as_of_ms) / self.half_life_ms)
            self.as_of_ms = newest
        self.values = _grow(self.values, int(idx.max()) + 1)
        np.add.at(self.values, idx, 2.0 ** (-(self.as_of_ms - ts) / self.half_life_ms))

    def scores(self, n_candidates: int) -> np.ndarray:
        self.values = _grow(self.values, n_candidates)
        return self.values[:n_candidates].copy()
