"""Per-user baselines of the evaluation: item co-occurrence and session-kNN, numpy only.

Both read a user's *window*: the distinct items among the first ``window`` entries of the
event's point-in-time history (``Sample.history``: the user's earlier positives and rated
items, most recent first; :func:`recent_distinct`), and both learn from the positive events
of the learned micro-batches (target item, window, user). Both rank the candidates by their
score, ties to the more popular item (learned positives per item, :meth:`tiebreak`), then
to the item seen first; a user with an empty window therefore gets popularity.

Items and users are indices (first appearance in the stream). Sparse counts are kept as
sorted ``int64`` keys ``first << 32 | second`` (:class:`SortedPairs`), so a batch's scores
are one gather and one ``np.bincount``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_SHIFT = 32
_MASK = (1 << _SHIFT) - 1


def grow(values: np.ndarray, n: int) -> np.ndarray:
    """``values`` zero-padded to at least ``n`` entries (capacity doubles)."""
    if values.size >= n:
        return values
    out = np.zeros(max(n, 2 * values.size), values.dtype)
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

    def add(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """Count each pair once per occurrence; returns the keys that were new (sorted)."""
        packed = (first.astype(np.int64) << _SHIFT) | second
        keys, counts = np.unique(packed, return_counts=True)
        pos = np.asarray(np.searchsorted(self.keys, keys), np.int64)
        known: np.ndarray = pos < self.keys.size
        known[known] = self.keys[pos[known]] == keys[known]
        self.counts[pos[known]] += counts[known]  # keys are unique: no repeated positions
        new = ~known
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


def _windows(histories: Sequence[Sequence[int]], window: int) -> tuple[np.ndarray, np.ndarray]:
    """Row label and item of every window entry of a batch, rows in order."""
    rows: list[int] = []
    items: list[int] = []
    for row, history in enumerate(histories):
        q = recent_distinct(history, window)
        rows.extend([row] * len(q))
        items.extend(q)
    return np.asarray(rows, np.int64), np.asarray(items, np.int64)


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
        self.pairs = SortedPairs()
        self.popularity = _Popularity()

    def learn(self, targets: Sequence[int], histories: Sequence[Sequence[int]]) -> None:
        rows, items = _windows(histories, self.window)
        t = np.asarray(targets, np.int64)
        self.popularity.learn(t)
        if items.size:
            self.pairs.add(np.concatenate([t[rows], items]), np.concatenate([items, t[rows]]))

    def scores(self, histories: Sequence[Sequence[int]], n_candidates: int) -> np.ndarray:
        """``[len(histories), n_candidates]``."""
        b, n = len(histories), n_candidates
        rows, items = _windows(histories, self.window)
        # The rows of C that the batch needs, once each (a batch holds few users), then one
        # product; counts are integers, so the float sums are exact in any order.
        unique, which = np.unique(items, return_inverse=True)
        positions, lens = self.pairs.gather(unique)
        cols = self.pairs.second(positions)
        part = np.repeat(np.arange(unique.size), lens)
        keep = cols < n
        dense = np.zeros((unique.size, n))
        dense[part[keep], cols[keep]] = self.pairs.counts[positions[keep]]
        pick = np.zeros((b, unique.size))
        pick[rows, which] = 1.0
        return pick @ dense

    def tiebreak(self, n_candidates: int) -> np.ndarray:
        return self.popularity.tiebreak(n_candidates)


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
    * ``weight(u) = sim(u) * (1 - rank(u) / sample_size)`` (recency of the neighbour);
    * score of candidate ``i``: ``sum(weight(u) for u in N if i in H_u)``.
    """

    name = "sknn"

    def __init__(self, sample_size: int = 100, window: int = 20) -> None:
        if sample_size < 1 or window < 1:
            raise ValueError("sample_size and window must be >= 1")
        self.sample_size = sample_size
        self.window = window
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
        """Per row the neighbours, most recent first: ``(user [B, S], weight [B, S], valid)``."""
        b, n_users = len(histories), self.users
        s = min(self.sample_size, n_users)
        if s == 0:
            empty = np.zeros((b, 0), np.int64)
            return empty, empty.astype(np.float64), empty.astype(bool)
        qrows, qitems = _windows(histories, self.window)
        length = np.bincount(qrows, minlength=b).astype(np.float64)  # L per row
        first = np.searchsorted(qrows, np.arange(b))
        p = np.arange(qrows.size) - first[qrows]  # 0 = most recent
        w = (length[qrows] - p) / length[qrows]
        positions, lens = self.by_item.gather(qitems)
        holders = self.by_item.second(positions)
        num = np.bincount(
            np.repeat(qrows, lens) * n_users + holders,
            weights=np.repeat(w, lens),
            minlength=b * n_users,
        ).reshape(b, n_users)
        own = np.asarray(users, np.int64)
        mine = own < n_users
        num[np.flatnonzero(mine), own[mine]] = 0.0
        recency = np.where(num > 0, self.last[:n_users][None, :], -1)
        if s < n_users:
            top = np.argpartition(-recency, s - 1, axis=1)[:, :s]
        else:
            top = np.broadcast_to(np.arange(n_users), (b, n_users)).copy()
        order = np.argsort(-np.take_along_axis(recency, top, axis=1), axis=1, kind="stable")
        top = np.take_along_axis(top, order, axis=1)
        valid = np.take_along_axis(recency, top, axis=1) >= 0
        rank = np.arange(s, dtype=np.float64)[None, :]
        # max(., 1) only guards rows without a window and users without items (never valid)
        sim = np.take_along_axis(num, top, axis=1) / (
            np.sqrt(np.maximum(length, 1.0))[:, None]
            * np.sqrt(np.maximum(self.size[top], 1).astype(np.float64))
        )
        weight = np.where(valid, sim * (1.0 - rank / self.sample_size), 0.0)
        return top, weight, valid

    def scores(
        self, users: Sequence[int], histories: Sequence[Sequence[int]], n_candidates: int
    ) -> np.ndarray:
        """``[len(users), n_candidates]``."""
        b, n = len(histories), n_candidates
        top, weight, valid = self.neighbours(users, histories)
        rows = np.broadcast_to(np.arange(b)[:, None], top.shape)[valid]
        positions, lens = self.by_user.gather(top[valid])
        cols = self.by_user.second(positions)
        rows = np.repeat(rows, lens)
        keep = cols < n
        flat = np.bincount(
            rows[keep] * n + cols[keep],
            weights=np.repeat(weight[valid], lens)[keep],
            minlength=b * n,
        )
        return flat.reshape(b, n)

    def tiebreak(self, n_candidates: int) -> np.ndarray:
        return self.popularity.tiebreak(n_candidates)
