"""Sequential rules (SR, Ludewig & Jannach): a per-user baseline of the evaluation, numpy only.

Directional: a rule ``a -> b`` says that ``b`` was a target after ``a`` among the user's
recent items, weighted by how recent ``a`` was. Storage is the co-occurrence baseline's
(:class:`model.evaluation.neighbours.PairCounts`), ranking as in ``neighbours`` (score, then
learned positives per item, then the item seen first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from model.evaluation.neighbours import PairCounts, _Popularity
from model.scoring.sessions import positions, windows

#: Largest ``steps`` and ``query_items``: the scaled sums stay integers far below 2**53.
MAX_STEPS = 12


def scale(steps: int) -> int:
    """``lcm(1 .. steps)``: the factor that makes every weight ``1 / (p + 1)``, ``p < steps``,
    an integer."""
    return math.lcm(*range(1, steps + 1))


class SequentialRulesBaseline:
    """Sequential rules: items that followed the user's most recent items, by distance.

    Learning: a learned positive event with target ``t`` whose history window is
    ``h_0 .. h_{L-1}`` (the distinct items among the first ``steps`` entries of its history,
    most recent first; ``t`` is never among them) adds ``1 / (p + 1)`` to ``R[h_p, t]`` for
    every ``p``. Score of candidate ``i`` for an event whose query window is ``q_0 .. q_{M-1}``
    (the distinct items among the first ``query_items`` entries of its history):
    ``sum(R[q_m, i] / (m + 1) for m in 0 .. M-1)``. The scores are returned multiplied by
    ``scale(steps) * scale(query_items)`` (:func:`scale`), which makes every sum an integer,
    exact in any order; the ranking is the same. ``query_items = 1`` is the original SR
    (the last item only); the defaults are tuned across the real-log panel.
    """

    name = "sr"

    def __init__(self, steps: int = 10, query_items: int = 12) -> None:
        if not (1 <= steps <= MAX_STEPS and 1 <= query_items <= MAX_STEPS):
            raise ValueError(f"steps and query_items must be in 1 .. {MAX_STEPS}")
        self.steps = steps
        self.query_items = query_items
        self.window = max(steps, query_items)  # history entries read (``HistoryLearner``)
        self.rules = PairCounts()  # R * scale(steps)
        self.popularity = _Popularity()
        self._learn_weights = np.array([scale(steps) // (p + 1) for p in range(steps)], float)
        self._query_weights = np.array(
            [scale(query_items) // (m + 1) for m in range(query_items)], float
        )

    def learn(self, targets: Sequence[int], histories: Sequence[Sequence[int]]) -> None:
        rows, items = windows(histories, self.steps)
        t = np.asarray(targets, np.int64)
        self.popularity.learn(t)
        self.rules.add(items, t[rows], self._learn_weights[positions(rows)])

    def scores(self, histories: Sequence[Sequence[int]], n_candidates: int) -> np.ndarray:
        """``[len(histories), n_candidates]``."""
        rows, items = windows(histories, self.query_items)
        weights = self._query_weights[positions(rows)]
        return self.rules.sums(rows, items, weights, len(histories), n_candidates)

    def tiebreak(self, n_candidates: int) -> np.ndarray:
        return self.popularity.tiebreak(n_candidates)
