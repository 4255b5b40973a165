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

_SHIFT = 32
_MASK = (1 << _SHIFT) - 1
#: Session-kNN sums similarities over a dense ``rows x users`` array while it is at most this
#: many times the shared (row, user) pairs, else over the sorted pairs (same sums).
DENSE_RATIO = 4
#: Co-occurrence counts stay a dense matrix while every item index is below this (a small
#: catalogue fills most pairs), then move to sorted pairs.
DENSE_ITEMS = 4096
#: Over sorted pairs, a row first looks at the ``RECENT_FIRST * sample_size`` most recent users.
RECENT_FIRST = 4


def grow(values: np.ndarray, n: int, fill: float = 0) -> np.ndarray:
    """``values`` padded with ``fill`` to at least ``n`` entries (capacity doubles)."""
    if values.size >= n:
        return values
    out = np.full(max(n, 2 * values.size), fill, values.dtype)
    out[: values.size] = values
    return out


def recent_distinct(history: Sequence[int] | np.ndarray, window: int) -> list[int]:
    """Distinct items among the first ``window`` entries of ``history``, first occurrence first."""
    head = history[:window]
    return list(dict.fromkeys(head.tolist() if isinstance(head, np.ndarray) else head))


class SortedPairs:
    """Counts per pair ``(first, second)`` of indices ``< 2**31``, as sorted int64 keys."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.float64)
        self.seconds = np.zeros(0, np.int64)  # keys & mask, kept for cheap gathers

    def add(
        self, first: np.ndarray, second: np.ndarray, weights: np.ndarray | None = None
    ) -> np.ndarray:
        """Count each pair once per occurrence (or add its ``weights``); returns the keys that
        were new (sorted)."""
        packed = (first.astype(np.int64) << _SHIFT) | second
        keys, inverse, counts = np.unique(packed, return_inverse=True, return_counts=True)
        if weights is not None:
            counts = np.bincount(inverse, weights=weights, minlength=keys.size)
        pos = np.asarray(np.searchsorted(self.keys, keys), np.int64)
        known: np.ndarray = pos < self.keys.size
        known[known] = self.keys[pos[known]] == keys[known]
        self.counts[pos[known]] += counts[known]  # keys are unique: no repeated positions
        new = ~known
        if not new.any():
            return keys[new]
        self.keys = np.insert(self.keys, pos[new], keys[new])
        self.counts = np.insert(self.counts, pos[new], counts[new].astype(np.float64))
        self.seconds = np.insert(self.seconds, pos[new], keys[new] & _MASK)
        return keys[new]

    def gather(self, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of the pairs of each ``first[k]`` (concatenated, ``second`` ascending)
        and how many each ``first[k]`` has."""
        first = first.astype(np.int64)
        starts = np.searchsorted(self.keys, first << _SHIFT)
        lens = np.searchsorted(self.keys, (first + 1) << _SHIFT) - starts
        total = int(lens.sum())
        offsets = np.repeat(starts - (np.cumsum(lens) - lens), lens)
        return offsets + np.arange(total), lens

    def second(self, positions: np.ndarray) -> np.ndarray:
        return self.seconds[positions]


def _row_sums(
    rows: np.ndarray, cols: np.ndarray, weights: np.ndarray, b: int, n: int, chunk: int = 8
) -> np.ndarray:
    """``out[r, c] = sum of weights[k] with (rows[k], cols[k]) = (r, c)``, added in array order;
    ``rows`` ascending. Done ``chunk`` rows at a time, so the output being added to stays in
    cache."""
    out = np.zeros((b, n))
    edges = np.searchsorted(rows, np.arange(0, b + chunk, chunk))
    for first in range(0, b, chunk):
        lo, hi = edges[first // chunk], edges[first // chunk + 1]
        if hi > lo:
            m = min(chunk, b - first)
            part = np.bincount(
                (rows[lo:hi] - first) * n + cols[lo:hi], weights=weights[lo:hi], minlength=m * n
            )
            out[first : first + m] = part.reshape(m, n)
    return out


def _windows(histories: Sequence[Sequence[int]], window: int) -> tuple[np.ndarray, np.ndarray]:
    """Row label and item of every window entry of a batch, rows in order."""
    rows: list[int] = []
    items: list[int] = []
    for row, history in enumerate(histories):
        q = recent_distinct(history, window)
        rows.extend([row] * len(q))
        items.extend(q)
    return np.asarray(rows, np.int64), np.asarray(items, np.int64)


def _positions(rows: np.ndarray) -> np.ndarray:
    """Position of every entry within its row (0 = the row's first entry); ``rows`` ascending."""
    return np.arange(rows.size) - np.searchsorted(rows, rows)


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
            k = _positions(rows)
            for kth in range(int(k.max(initial=-1)) + 1):
                pick = k == kth
                part = self.dense[items[pick], :m]
                out[rows[pick], :m] += part if w is None else w[pick, None] * part
            return out
        positions, lens = self.pairs.gather(items)
        cols = self.pairs.second(positions)
        values = self.pairs.counts[positions]
        if weights is not None:
            values = np.repeat(weights, lens) * values
        rows = np.repeat(rows, lens)
        keep = cols < n
        return _row_sums(rows[keep], cols[keep], values[keep], b, n)


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
        rows, items = _windows(histories, self.window)
        t = np.asarray(targets, np.int64)
        self.popularity.learn(t)
        first, second = np.concatenate([t[rows], items]), np.concatenate([items, t[rows]])
        self.counts.add(first, second)

    def scores(self, histories: Sequence[Sequence[int]], n_candidates: int) -> np.ndarray:
        """``[len(histories), n_candidates]``."""
        rows, items = _windows(histories, self.window)
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
        rows, items = _windows(histories, self.window)
        weights = None if self.decay == 1.0 else self._weights[_positions(rows)]
        sums = self.counts.sums(rows, items, weights, len(histories), n_candidates)
        self._damping = grow(self._damping, n_candidates, fill=1.0)
        return sums / self._damping[:n_candidates]


class SessionKNNBaseline:
    """Session-kNN of the V-SKNN family: the recent histories that share an item with the user's.

    A history ``H_u``: the distinct target items of user ``u``'s learned positive events;
    its recency ``r_u``: the position, in learning order, of ``u``'s latest learned event.
    For an event of user ``v`` whose window (see the module doc) is ``q_1 .. q_L``, most
    recent first, weighted ``w(q_p) = (L - p + 1) / L`` (1 for the most recent):

    * neighbours ``N``: the ``sample_size`` users ``u != v`` with ``H_u`` sharing an item
      with the window, of largest ``r_u``; ``rank(u)`` = 0 for the most recent of them;
    * ``sim(u) = sum(w(j) for j in window if j in H_u) / (sqrt(L) * sqrt(|H_u|))`` (cosine
      of binary vectors, the window's entries weighted by recency);
    * with ``k``: only the ``k`` users of ``N`` of largest ``sim(u)`` (ties to the lower
      ``rank``) stay in ``N`` (V-SKNN's nearest among the recent), each keeping its ``rank``;
    * ``weight(u) = sim(u) * (1 - rank(u) / sample_size)`` (recency of the neighbour), or
      ``sim(u)`` without ``recency``;
    * score of candidate ``i``: ``sum(weight(u) for u in N if i in H_u)``, added in ``rank``
      order.

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
        if sample_size < 1 or window < 1 or (k is not None and k < 1):
            raise ValueError("sample_size, window and k must be >= 1")
        self.sample_size = sample_size
        self.window = window
        self.k = k
        self.recency = recency
        self.by_item = SortedPairs()  # (item, user): who holds an item
        self.by_user = SortedPairs()  # (user, item): what a user holds
        self.size = np.zeros(1024, np.int64)  # |H_u|
        self.last = np.full(1024, -1, np.int64)  # r_u
        self.users = 0
        self.learned = 0
        self.popularity = _Popularity()

    def learn(self, users: Sequence[int], targets: Sequence[int]) -> None:
        u = np.asarray(users, np.int64)
        t = np.asarray(targets, np.int64)
        if u.size == 0:
            return
        self.popularity.learn(t)
        self.users = max(self.users, int(u.max()) + 1)
        self.size = grow(self.size, self.users)
        if self.last.size < self.users:
            self.last = np.concatenate([self.last, np.full(self.last.size + self.users, -1)])
        np.maximum.at(self.last, u, self.learned + np.arange(u.size))
        self.learned += u.size
        new = self.by_user.add(u, t)
        self.by_item.add(new & _MASK, new >> _SHIFT)
        np.add.at(self.size, new >> _SHIFT, 1)

    def neighbours(
        self, users: Sequence[int], histories: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The neighbours of every row as flat ``(row, user, weight)``, by row, most recent
        first within a row."""
        b, n_users = len(histories), self.users
        s = min(self.sample_size, n_users)
        qrows, qitems = _windows(histories, self.window)
        if s == 0 or qitems.size == 0:
            none = np.zeros(0, np.int64)
            return none, none, none.astype(np.float64)
        length = np.bincount(qrows, minlength=b).astype(np.float64)  # L per row
        first = np.searchsorted(qrows, np.arange(b))
        p = np.arange(qrows.size) - first[qrows]  # 0 = most recent
        w = (length[qrows] - p) / length[qrows]
        positions, lens = self.by_item.gather(qitems)
        holders = self.by_item.second(positions)
        prows = np.repeat(qrows, lens)
        own = np.asarray(users, np.int64)
        other = holders != own[prows]
        key = prows[other] * n_users + holders[other]
        # sum of w over the shared items, in window order (np.bincount adds in array order)
        if b * n_users <= DENSE_RATIO * key.size:  # dense rows x users: when users are few
            num = np.bincount(key, weights=np.repeat(w, lens)[other], minlength=b * n_users)
            pair = np.flatnonzero(num > 0)
            num = num[pair]
        else:
            pair, num = self._recent_pairs(key, np.repeat(w, lens)[other], b, s)
        rows, cand = pair // n_users, pair % n_users
        order = np.lexsort((-self.last[cand], rows))
        rows, cand, num = rows[order], cand[order], num[order]
        rank = _positions(rows)
        keep = rank < s
        rows, cand, num, rank = rows[keep], cand[keep], num[keep], rank[keep]
        sim = num / (np.sqrt(length[rows]) * np.sqrt(self.size[cand].astype(np.float64)))
        if self.k is not None and self.k < s:
            nearest = np.lexsort((rank, -sim, rows))  # by row, then sim desc, then recency
            near = np.zeros(rows.size, bool)
            near[nearest[_positions(rows[nearest]) < self.k]] = True
            rows, cand, sim, rank = rows[near], cand[near], sim[near], rank[near]
        if not self.recency:
            return rows, cand, sim
        return rows, cand, sim * (1.0 - rank / self.sample_size)

    def _recent_pairs(
        self, key: np.ndarray, w: np.ndarray, b: int, s: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Distinct ``key = row * users + user`` with their summed ``w``, enough of them to
        hold each row's ``s`` most recent users: a row with at least ``s`` users among the
        ``RECENT_FIRST * s`` most recent keeps only those (no other can be among its ``s``
        most recent); the other rows keep all. A user's entries stay or go together."""
        n_users = self.users
        order = np.argsort(-self.last[:n_users])
        global_rank = np.empty(n_users, np.int64)
        global_rank[order] = np.arange(n_users)
        near = global_rank[key % n_users] < RECENT_FIRST * s
        pair, inverse = np.unique(key[near], return_inverse=True)
        short = np.bincount(pair // n_users, minlength=b) < s
        if short.any():  # those rows: every shared user
            near |= short[key // n_users]
            pair, inverse = np.unique(key[near], return_inverse=True)
        return pair, np.bincount(inverse, weights=w[near])

    def scores(
        self, users: Sequence[int], histories: Sequence[Sequence[int]], n_candidates: int
    ) -> np.ndarray:
        """``[len(users), n_candidates]``."""
        b, n = len(histories), n_candidates
        rows, cand, weight = self.neighbours(users, histories)
        positions, lens = self.by_user.gather(cand)
        cols = self.by_user.second(positions)
        rows = np.repeat(rows, lens)
        keep = cols < n
        return _row_sums(rows[keep], cols[keep], np.repeat(weight, lens)[keep], b, n)

    def tiebreak(self, n_candidates: int) -> np.ndarray:
        return self.popularity.tiebreak(n_candidates)
