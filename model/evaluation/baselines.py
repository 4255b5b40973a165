"""Baselines of the test-then-train evaluation (``model.evaluation.replay``), numpy only.

Items are identified by their position in the evaluation's candidate list, users by their
first appearance. Every baseline learns from the positive events of the learned micro-batches
only, in stream order. Shared scores: :class:`PopularityBaseline`,
:class:`RecentPopularityBaseline`. Per-user scores (ties to the more popular item, then the
item seen first): :class:`CooccurrenceBaseline`, :class:`ItemKNNBaseline` (popularity-damped),
:class:`SequentialRulesBaseline`, :class:`SessionKNNBaseline` (V-SKNN family). They are the
strong forms practitioners use, so the model's ratio to the best of them means something.
Each baseline's rule: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.evaluation.neighbours import (
    CooccurrenceBaseline,
    ItemKNNBaseline,
    SessionKNNBaseline,
    grow,
)
from model.evaluation.sequential import SequentialRulesBaseline

__all__ = [
    "CooccurrenceBaseline",
    "ItemKNNBaseline",
    "PopularityBaseline",
    "RecentPopularityBaseline",
    "SequentialRulesBaseline",
    "SessionKNNBaseline",
]


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
        self.counts = grow(self.counts, int(idx.max()) + 1)
        np.add.at(self.counts, idx, 1.0)

    def scores(self, n_candidates: int) -> np.ndarray:
        """Score of candidates ``0 .. n_candidates - 1`` (shape ``[n_candidates]``)."""
        self.counts = grow(self.counts, n_candidates)
        return self.counts[:n_candidates].copy()


class RecentPopularityBaseline:
    """Counts of positive events per item among the last ``window`` learned positives.

    ``score(i) = #{e among the last window learned positive events : item(e) = i}``, the
    window taken in learning order (stream order), whatever the event times.
    """

    name = "recent_popularity"

    def __init__(self, window: int = 2_000) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self.counts = np.zeros(1024, np.float64)
        self._recent = np.zeros(0, np.int64)  # items of the last `window` events, oldest first

    def learn(
        self, item_index: Sequence[int] | np.ndarray, ts_ms: Sequence[int] | np.ndarray
    ) -> None:
        idx = np.asarray(item_index, np.int64)
        if idx.size == 0:
            return
        joined = np.concatenate([self._recent, idx])
        leaving = joined[: max(0, joined.size - self.window)]
        self._recent = joined[leaving.size :]
        self.counts = grow(self.counts, int(idx.max()) + 1)
        np.add.at(self.counts, idx, 1.0)
        np.subtract.at(self.counts, leaving, 1.0)

    def scores(self, n_candidates: int) -> np.ndarray:
        self.counts = grow(self.counts, n_candidates)
        return self.counts[:n_candidates].copy()
