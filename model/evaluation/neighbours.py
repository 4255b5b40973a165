"""Per-user baselines of the evaluation: item co-occurrence, popularity-damped item-kNN and
session-kNN, numpy only.

All read a user's *window*: the distinct items among the first ``window`` entries of the
event's point-in-time history (``Sample.history``: the user's earlier positives and rated
items, most recent first; :func:`recent_distinct`), and all learn from the positive events
of the learned micro-batches (target item, window, user). All rank the candidates by their
score, ties to the more popular item (learned positives per item, :meth:`tiebreak`), then
to the item seen first; a user with an empty window therefore gets popularity.

Items and users are indices (first appearance in the stream). Sparse counts are kept as
sorted ``int64`` keys ``first << 32 | second`` (:class:`SortedPairs`), so a batch's scores
are one gather and one ``np.bincount``; item-pair sums over a small catalogue are a dense
matrix (:class:`PairCounts`, ``DENSE_ITEMS``). Every storage choice gives the same scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.scoring.covisit import ITEMKNN_ALPHA
from model.scoring.sessions import (
    _SHIFT,
    SessionNeighbours,
    SortedPairs,
    grow,
    positions,
    row_sums,
    windows,
)

#: Co-occurrence counts stay a dense matrix while every item index is below this (a small
#: catalogue fills most pairs), then move to sorted pairs.
DENSE_ITEMS = 4096


class _Popularity:
    def __init__(self) -> None:
        self.counts = np.zeros(1024, np.int64)

    def learn(self, targets: np.ndarray) -> None:
        if targets.size:
            self.counts = grow(self.counts, int(targets.max()) + 1)
            np.add.at(self.counts, targets, 1)

    def tiebreak(self, n_candidates: int) -> np.ndarray:
        self.counts = grow(self.counts, n_candidates)
        return self.counts[:n_candidates].copy()


class PairCounts:
    """Sums per ordered item pair ``C[a, b]``: a dense matrix while every index is below
    ``DENSE_ITEMS``, then :class:`SortedPairs` (the same values either way)."""

    def __init__(self) -> None:
        self.pairs = SortedPairs()
        self.dense: np.ndarray | None = np.zeros((0, 0))

    def add(self, first: np.ndarray, second: np.ndarray, weights: np.ndarray | None = None) -> None:
        """``C[first[k], second[k]] += weights[k]`` (1 without ``weights``), in array order."""
        if not first.size:
            return
        if self.dense is not None:
            top = int(max(first.max(), second.max())) + 1
            if top <= DENSE_ITEMS:
                if top > self.dense.shape[0]:
                    size = min(DENSE_ITEMS, max(top, 2 * self.dense.shape[0]))
                    dense = np.zeros((size, size))
                    dense[: self.dense.shape[0], : self.dense.shape[0]] = self.dense
                    self.dense = dense
                np.add.at(self.dense, (first, second), 1.0 if weights is None else weights)
                return
            a, b = np.nonzero(self.dense)  # row-major: sorted keys
            self.pairs.keys = (a.astype(np.int64) << _SHIFT) | b
            self.pairs.counts = self.dense[a, b]
            self.pairs.seconds = b.astype(np.int64)
            self.dense = None
        self.pairs.add(first, second, weights)

    def sums(
        self, rows: np.ndarray, items: np.ndarray, weights: np.ndarray | None, b: int, n: int
    ) -> np.ndarray:
        """``out[r, i] = sum(weights[k] * C[items[k], i] for k with rows[k] = r)`` (weight 1
        without ``weights``), added from 0 in entry order; ``rows`` ascending: ``[b, n]``."""
        if self.dense is not None:
            out = np.zeros((b, n))
            size = self.dense.shape[0]
            known = items < size
            rows, items = rows[known], items[known]
            w = None if weights is None else weights[known]
            m = min(n, size)
            # k-th entry of every row at once (rows are distinct within a k), k ascending
            k = positions(rows)
            for kth in range(int(k.max(initial=-1)) + 1):
                pick = k == kth
                part = self.dense[items[pick], :m]
                out[rows[pick], :m] += part if w is None else w[pick, None] * part
            return out
        where, lens = self.pairs.gather(items)
        cols = self.pairs.second(where)
        values = self.pairs.counts[where]
        if weights is not None:
            values = np.repeat(weights, lens) * values
        rows = np.repeat(rows, lens)
        keep = cols < n
        return row_sums(rows[keep], cols[keep], values[keep], b, n)


class CooccurrenceBaseline:
    """Symmetric item co-occurrence counts, summed over the user's window.

    Co-occur: a learned positive event with target ``t`` and window ``S`` (the distinct items
    among the first ``window`` entries of its history; ``t`` is never in it) counts each pair
    once: ``C[t, j] += 1`` and ``C[j, t] += 1`` for every ``j`` in ``S``. So ``C[a, b]`` is the
    number of learned positive events in which one of ``a, b`` was the target and the other
    among the user's last ``window`` items, over every learned event (all users).
    Score of candidate ``i`` for an event with window ``S``: ``sum(C[j, i] for j in S)``.
    """

    name = "cooccurrence"

    def __init__(self, window: int = 20) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self.counts = PairCounts()
        self.popularity = _Popularity()

    def learn(self, targets: Sequence[int], histories: Sequence[Sequence[int]]) -> None:
        rows, items = windows(histories, self.window)
        t = np.asarray(targets, np.int64)
        self.popularity.learn(t)
        first, second = np.concatenate([t[rows], items]), np.concatenate([items, t[rows]])
        self.counts.add(first, second)

    def scores(self, histories: Sequence[Sequence[int]], n_candidates: int) -> np.ndarray:
        """``[len(histories), n_candidates]``."""
        rows, items = windows(histories, self.window)
        return self.counts.sums(rows, items, None, len(histories), n_candidates)

    def tiebreak(self, n_candidates: int) -> np.ndarray:
        return self.popularity.tiebreak(n_candidates)


class ItemKNNBaseline(CooccurrenceBaseline):
    """Popularity-damped item-kNN: co-occurrence sums divided by the candidate's popularity.

    ``C`` and its learning are :class:`CooccurrenceBaseline`'s. For an event whose window is
    ``q_0 .. q_{L-1}`` (most recent first) the score of candidate ``i`` is
    ``sum(decay ** p * C[q_p, i] for p in 0 .. L-1) / (count_i + 1) ** alpha``, the sum added
    from 0 in window order, ``count_i`` the learned positives of ``i`` (``alpha = 0.5`` is
    the cosine-style square-root damping; ``decay = 1``: every window entry counts alike).
    The defaults are tuned across the real-log panel (rating and session logs).
    """

    name = "itemknn"

    def __init__(self, window: int = 20, alpha: float = ITEMKNN_ALPHA, decay: float = 0.7) -> None:
        super().__init__(window)
        if alpha < 0 or not 0 < decay <= 1:
            raise ValueError("alpha must be >= 0 and decay in (0, 1]")
        self.alpha = alpha
        self.decay = decay
        self._weights = np.array([decay**p for p in range(window)])  # as the rule writes them
        self._damping = np.ones(1024)  # (count_i + 1) ** alpha

    def learn(self, targets: Sequence[int], histories: Sequence[Sequence[int]]) -> None:
        super().learn(targets, histories)
        touched = np.unique(np.asarray(targets, np.int64))
        if touched.size:
            self._damping = grow(self._damping, int(touched[-1]) + 1, fill=1.0)
            counts = self.popularity.counts[touched].tolist()
            self._damping[touched] = [(c + 1) ** self.alpha for c in counts]

    def scores(self, histories: Sequence[Sequence[int]], n_candidates: int) -> np.ndarray:
        """``[len(histories), n_candidates]``."""
        rows, items = windows(histories, self.window)
        weights = None if self.decay == 1.0 else self._weights[positions(rows)]
        sums = self.counts.sums(rows, items, weights, len(histories), n_candidates)
        self._damping = grow(self._damping, n_candidates, fill=1.0)
        return sums / self._damping[:n_candidates]


class SessionKNNBaseline(SessionNeighbours):
    """Session-kNN of the V-SKNN family: the recent histories that share an item with the
    user's (``model.scoring.sessions``, the rule the model's ``sknn`` part serves), over the
    evaluation's user and item indices; scores are the sums ``s_i``.

    The defaults are tuned across the real-log panel; ``sample_size=100, k=None`` is the
    earlier form (every sampled neighbour counts).
    """

    name = "sknn"

    def __init__(
        self,
        sample_size: int = 300,
        window: int = 20,
        k: int | None = 75,
        recency: bool = True,
    ) -> None:
        super().__init__(sample_size, window, k, recency)
        self.popularity = _Popularity()

    def learn(self, users: Sequence[int], targets: Sequence[int]) -> None:
        u = np.asarray(users, np.int64)
        t = np.asarray(targets, np.int64)
        if u.size == 0:
            return
        self.popularity.learn(t)
        self.learn_indices(u, t)

    def neighbours(
        self, users: Sequence[int], histories: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The neighbours of every row as flat ``(row, user, weight)``, by row, most recent
        first within a row."""
        qrows, qitems = windows(histories, self.window)
        return self.neighbours_of(np.asarray(users, np.int64), qrows, qitems, len(histories))

    def scores(
        self, users: Sequence[int], histories: Sequence[Sequence[int]], n_candidates: int
    ) -> np.ndarray:
        """``[len(users), n_candidates]``."""
        rows, cols, weight = self.item_triples(self.neighbours(users, histories))
        keep = cols < n_candidates
        return row_sums(rows[keep], cols[keep], weight[keep], len(histories), n_candidates)

    def tiebreak(self, n_candidates: int) -> np.ndarray:
        return self.popularity.tiebreak(n_candidates)
