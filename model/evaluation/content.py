"""The content baseline of the evaluation: popularity within the user's recent categories.

What a practitioner builds first from a catalogue: the categories of the user's window (the
distinct items among the first ``window`` history entries, as the other per-user baselines
read it) and, for each candidate, the share of those window items that carry each of the
candidate's category tokens, summed; times the candidate's learned popularity damped by
``(count + 1) ** gamma``. A category is a token of a ``categorical`` or ``multi`` item slot
(``feature_store.catalogue``); items without one score 0. Ties go to the more popular item,
then to the item seen first; an empty window therefore gets popularity. Numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.evaluation.neighbours import _Popularity
from model.scoring.sessions import grow, windows

__all__ = ["CATEGORY_KINDS", "ContentBaseline"]

#: Slot kinds whose tokens count as an item's categories.
CATEGORY_KINDS = ("categorical", "multi")


class ContentBaseline:
    """See the module doc. ``tokens[c]``: the category token ids of candidate ``c`` (any
    non-negative integers; a candidate past the list has none)."""

    name = "content"

    def __init__(self, tokens: Sequence[Sequence[int]], window: int = 20, gamma: float = 1.0) -> None:
        if window < 1 or gamma < 0:
            raise ValueError("window must be >= 1 and gamma >= 0")
        self.window = window
        self.gamma = gamma
        self.popularity = _Popularity()
        lengths = np.fromiter((len(t) for t in tokens), np.int64, len(tokens))
        self._start = np.concatenate([[0], np.cumsum(lengths)])
        flat = np.fromiter((x for t in tokens for x in t), np.int64, int(lengths.sum()))
        self._item_tokens = flat
        # the inverted index: token -> the candidates carrying it, as sorted (token, item)
        owner = np.repeat(np.arange(len(tokens), dtype=np.int64), lengths)
        order = np.lexsort((owner, flat))
        self._by_token = owner[order]
        n_tokens = int(flat.max()) + 1 if flat.size else 0
        self._token_start = np.searchsorted(flat[order], np.arange(n_tokens + 1))
        self._damping = np.ones(1024)

    def _tokens_of(self, item: int) -> np.ndarray:
        if item + 1 >= self._start.size:
            return self._item_tokens[:0]
        return self._item_tokens[self._start[item] : self._start[item + 1]]

    def learn(self, targets: Sequence[int], histories: Sequence[Sequence[int]]) -> None:
        t = np.asarray(targets, np.int64)
        self.popularity.learn(t)
        if self.gamma and t.size:
            touched = np.unique(t)
            self._damping = grow(self._damping, int(touched[-1]) + 1, fill=1.0)
            self._damping[touched] = (self.popularity.counts[touched] + 1.0) ** self.gamma

    def scores(self, histories: Sequence[Sequence[int]], n_candidates: int) -> np.ndarray:
        """``[len(histories), n_candidates]``."""
        out = np.zeros((len(histories), n_candidates))
        rows, items = windows(histories, self.window)
        bounds = np.searchsorted(rows, np.arange(len(histories) + 1))
        n_tokens = self._token_start.size - 1
        for row in range(len(histories)):
            window = items[bounds[row] : bounds[row + 1]]
            if not window.size:
                continue
            toks = np.concatenate([self._tokens_of(int(i)) for i in window])
            if not toks.size:
                continue
            uniq, counts = np.unique(toks[toks < n_tokens], return_counts=True)
            share = counts / window.size
            lo, hi = self._token_start[uniq], self._token_start[uniq + 1]
            owners = np.concatenate([self._by_token[a:b] for a, b in zip(lo, hi, strict=True)])
            weights = np.repeat(share, hi - lo)
            keep = owners < n_candidates
            out[row] = np.bincount(owners[keep], weights[keep], minlength=n_candidates)
        self._damping = grow(self._damping, n_candidates, fill=1.0)
        return out * self._damping[:n_candidates]

    def tiebreak(self, n_candidates: int) -> np.ndarray:
        return self.popularity.tiebreak(n_candidates)
