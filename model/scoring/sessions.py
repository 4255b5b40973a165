"""Session-kNN (V-SKNN family) over recent histories, numpy only: the one rule behind the
evaluation's ``sknn`` baseline and the model's ``sknn`` part of the served score.

A history ``H_u``: the distinct target items of user ``u``'s learned positive events (a
session's items on a session log, a user's on a rating log); its recency ``r_u``: the
position, in learning order, of ``u``'s latest learned event. For a row of user ``v`` whose
window is ``q_1 .. q_L`` (the distinct items among the first ``window`` entries of its
history, most recent first), weighted ``w(q_p) = (L - p + 1) / L``:

* neighbours ``N``: the ``sample_size`` users ``u != v`` with ``H_u`` sharing an item with
  the window, of largest ``r_u``; ``rank(u)`` = 0 for the most recent of them;
* ``sim(u) = sum(w(j) for j in window if j in H_u) / (sqrt(L) * sqrt(|H_u|))``;
* with ``k``: only the ``k`` users of ``N`` of largest ``sim(u)`` (ties to the lower
  ``rank``) stay, each keeping its ``rank``;
* ``weight(u) = sim(u) * (1 - rank(u) / sample_size)`` (or ``sim(u)`` without ``recency``);
* sum of item ``i``: ``s_i = sum(weight(u) for u in N if i in H_u)``, added in ``rank`` order.

:class:`SessionNeighbours` computes it over dense indices (users and items numbered by first
appearance), as the evaluation's baseline uses it. :class:`SessionIndex` keys it by the
model's user and item keys for the trainer and serving, bounded to the ``max_sessions`` most
recent histories; the served part is ``weight * log1p(SCALE * s_i)`` (:func:`part`).
Sparse counts are sorted ``int64`` codes ``first << 32 | second`` (:class:`SortedPairs`).
Why the part and its form: ``docs/decisions.md#session-knn-part``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.scoring.sorted_keys import DenseIds

_SHIFT = 32
_MASK = (1 << _SHIFT) - 1
#: Neighbour weights sum over a dense ``rows x users`` array while it is at most this many
#: times the shared (row, user) pairs, else over the sorted pairs (same sums).
DENSE_RATIO = 4
#: The part's argument scale: ``log1p(SCALE * s)`` (``s`` sums weights below 1 per neighbour).
SCALE = 20.0
#: :func:`sparse_sums` counts densely while the cells are at most this many times the
#: entries (a pass over a cell is far cheaper than a sort's over an entry).
CELLS_RATIO = 16
#: :meth:`SessionIndex.to_arrays`' derived arrays: the holders' codes and users.
HOLDER_ARRAYS = ("sessions_holder_codes", "sessions_holder_users")
#: Triples ``(row, item, value)`` of sparse per-row sums, by row.
Triples = tuple[np.ndarray, np.ndarray, np.ndarray]


def part(sums: np.ndarray) -> np.ndarray:
    """The served part's value of session-kNN sums (before its weight): ``log1p(SCALE * s)``."""
    return np.log1p(SCALE * np.asarray(sums, np.float64))


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


def windows(histories: Sequence[Sequence[int]], window: int) -> tuple[np.ndarray, np.ndarray]:
    """Row label and item of every window entry of a batch, rows in order."""
    rows: list[int] = []
    items: list[int] = []
    for row, history in enumerate(histories):
        q = recent_distinct(history, window)
        rows.extend([row] * len(q))
        items.extend(q)
    return np.asarray(rows, np.int64), np.asarray(items, np.int64)


def positions(rows: np.ndarray) -> np.ndarray:
    """Position of every entry within its row (0 = the row's first entry); ``rows`` ascending."""
    return np.arange(rows.size) - np.searchsorted(rows, rows)


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

    def copy(self) -> SortedPairs:
        """A copy that shares the key arrays (:meth:`add` replaces them, never writes them)
        and owns its counts (:meth:`add` adds to them in place)."""
        out = SortedPairs()
        out.keys, out.seconds, out.counts = self.keys, self.seconds, self.counts.copy()
        return out

    def load(self, keys: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Replace the pairs by ``keys`` (sorted, distinct) with ``counts`` (1 without)."""
        self.keys = np.asarray(keys, np.int64)
        self.counts = (np.ones(self.keys.size) if counts is None
                       else np.asarray(counts, np.float64))
        self.seconds = self.keys & _MASK

    def gather(self, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of the pairs of each ``first[k]`` (concatenated, ``second`` ascending)
        and how many each ``first[k]`` has (none for a negative ``first[k]``)."""
        first = first.astype(np.int64)
        starts = np.searchsorted(self.keys, first << _SHIFT)
        lens = np.searchsorted(self.keys, (first + 1) << _SHIFT) - starts
        lens[first < 0] = 0
        total = int(lens.sum())
        offsets = np.repeat(starts - (np.cumsum(lens) - lens), lens)
        return offsets + np.arange(total), lens

    def second(self, positions: np.ndarray) -> np.ndarray:
        return self.seconds[positions]


def row_sums(
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
            part_ = np.bincount(
                (rows[lo:hi] - first) * n + cols[lo:hi], weights=weights[lo:hi], minlength=m * n
            )
            out[first : first + m] = part_.reshape(m, n)
    return out


def sparse_sums(rows: np.ndarray, cols: np.ndarray, weights: np.ndarray, b: int, n: int
                ) -> Triples:
    """The non-empty cells of :func:`row_sums` (``b`` rows, ``n`` columns) as triples ``(row,
    col, sum)`` sorted by (row, col): each sum added in array order, as :func:`row_sums` adds
    it; every weight > 0. Over a dense ``b x n`` count while that is at most
    ``CELLS_RATIO`` times the entries, else by sorting them (the same sums)."""
    if not rows.size:
        return rows, cols, weights.astype(np.float64)
    if b * n <= CELLS_RATIO * rows.size:
        cells = np.bincount(rows * n + cols, weights=weights, minlength=b * n)
        hit = np.flatnonzero(cells > 0)  # the weights are > 0 (a neighbour's)
        return hit // n, hit % n, cells[hit]
    code = (rows.astype(np.int64) << _SHIFT) | cols
    cells, inverse = np.unique(code, return_inverse=True)
    sums = np.bincount(inverse.reshape(-1), weights=weights, minlength=cells.size)
    return cells >> _SHIFT, cells & _MASK, sums


class Holders:
    """Who holds each item, most recent last: sorted codes ``item << POS_BITS | r_u`` with
    the holder ``u`` beside each, so an item's ``m`` most recent holders are the last ``m``
    of its slice. A history's entries move to its new recency whenever it learns."""

    #: Bits of a recency (learning position) in a code; the item index takes the rest.
    POS_BITS = 37

    def __init__(self) -> None:
        self.codes = np.zeros(0, np.int64)
        self.users = np.zeros(0, np.int64)

    def load(self, items: np.ndarray, users: np.ndarray, last: np.ndarray) -> None:
        """Replace the entries by the (item, user) pairs given, at the users' recencies."""
        codes = self._codes(items, last[users])
        order = np.argsort(codes, kind="stable")
        self.codes, self.users = codes[order], np.asarray(users, np.int64)[order]

    def _codes(self, items: np.ndarray, recency: np.ndarray) -> np.ndarray:
        items = np.asarray(items, np.int64)
        if items.size and (items.max() >> (63 - self.POS_BITS) or recency.max() >> self.POS_BITS):
            raise ValueError("session-kNN: item index or learning position out of range")
        return (items << self.POS_BITS) | recency

    def move(self, moved: np.ndarray, n_users: int, new: tuple[np.ndarray, np.ndarray],
             users: np.ndarray) -> None:
        """Drop every entry of the users ``moved`` (of ``n_users``) and add ``new`` (item,
        recency) held by ``users`` (new arrays: the old ones are never written). The drop is
        one pass over the holders (a flag per user), not a search per entry."""
        flag = np.zeros(n_users, bool)
        flag[moved] = True
        keep = ~flag[self.users]
        codes, holders = self.codes[keep], self.users[keep]
        added = self._codes(*new)
        order = np.argsort(added, kind="stable")
        added, users = added[order], np.asarray(users, np.int64)[order]
        at = np.searchsorted(codes, added)
        self.codes, self.users = np.insert(codes, at, added), np.insert(holders, at, users)

    def recent(self, items: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``m`` most recent holders of each of ``items`` (concatenated, oldest first
        within an item) and how many each has (none for a negative item)."""
        items = np.asarray(items, np.int64)
        starts = np.searchsorted(self.codes, items << self.POS_BITS)
        ends = np.searchsorted(self.codes, (items + 1) << self.POS_BITS)
        starts = np.maximum(starts, ends - m)
        lens = np.where(items < 0, 0, ends - starts)
        offsets = np.repeat(starts - (np.cumsum(lens) - lens), lens)
        return self.users[offsets + np.arange(int(lens.sum()))], lens


#: Largest recency (learning position) a :class:`Holders` code holds.
RECENCY_MAX = (1 << Holders.POS_BITS) - 1


class SessionNeighbours:
    """Session-kNN over dense user and item indices (the module doc's rule).

    A row reads, of each item of its window, only the ``sample_size + 1`` most recent holders
    (:class:`Holders`): exact, since a history missing from a shared item's list has
    ``sample_size + 1`` more recent holders of that item, ``sample_size`` of them not the
    row's own, so it is not among the row's ``sample_size`` most recent neighbours. What it
    saves: a popular item's every holder gathered by each row that holds it."""

    def __init__(
        self, sample_size: int = 300, window: int = 20, k: int | None = 75, recency: bool = True,
    ) -> None:
        if sample_size < 1 or window < 1 or (k is not None and k < 1):
            raise ValueError("sample_size, window and k must be >= 1")
        self.sample_size = sample_size
        self.window = window
        self.k = k
        self.recency = recency
        self.holders = Holders()  # who holds an item, by recency
        self.by_user = SortedPairs()  # (user, item): what a user holds
        self.size = np.zeros(1024, np.int64)  # |H_u|
        self.last = np.full(1024, -1, np.int64)  # r_u
        self.users = 0
        self.learned = 0

    def learn_indices(self, u: np.ndarray, t: np.ndarray) -> None:
        """Learn positives of users ``u`` on items ``t`` (dense indices, in order)."""
        if u.size == 0:
            return
        self.users = max(self.users, int(u.max()) + 1)
        self.size = grow(self.size, self.users)
        if self.last.size < self.users:
            self.last = np.concatenate([self.last, np.full(self.last.size + self.users, -1)])
        moved = np.unique(u)
        np.maximum.at(self.last, u, self.learned + np.arange(u.size))
        self.learned += u.size
        new = self.by_user.add(u, t)
        np.add.at(self.size, new >> _SHIFT, 1)
        where, lens = self.by_user.gather(moved)  # every entry of a moved user, at its recency
        self.holders.move(moved, self.users,
                          (self.by_user.second(where), np.repeat(self.last[moved], lens)),
                          np.repeat(moved, lens))

    def load(self, codes: np.ndarray, last: np.ndarray, size: np.ndarray, learned: int,
             holders: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Replace the state: ``codes`` sorted ``user << 32 | item``, each user's recency and
        size; ``holders``: :class:`Holders`' arrays of that state when the caller has them."""
        self.users = int(last.size)
        self.last = np.asarray(last, np.int64).copy()
        self.size = np.asarray(size, np.int64).copy()
        self.by_user.load(codes)
        if holders is None:
            self.holders.load(codes & _MASK, codes >> _SHIFT, self.last)
        else:
            self.holders.codes, self.holders.users = holders
        self.learned = int(learned)

    def copy(self) -> SessionNeighbours:
        """A copy that learns without touching this one (arrays shared until replaced)."""
        out = SessionNeighbours(self.sample_size, self.window, self.k, self.recency)
        out.by_user = self.by_user.copy()
        out.holders.codes, out.holders.users = self.holders.codes, self.holders.users
        out.size, out.last = self.size.copy(), self.last.copy()  # written in place by learning
        out.users, out.learned = self.users, self.learned
        return out

    def neighbours_of(
        self, own: np.ndarray, qrows: np.ndarray, qitems: np.ndarray, b: int
    ) -> Triples:
        """The neighbours of every row as flat ``(row, user, weight)``, by row, most recent
        first within a row; the rows' windows as flat ``(qrows, qitems)`` (rows ascending,
        each row's items distinct, most recent first; a negative item is one no history
        holds), ``own[row]`` the row's own user (-1: none)."""
        n_users = self.users
        s = min(self.sample_size, n_users)
        if s == 0 or qitems.size == 0:
            none = np.zeros(0, np.int64)
            return none, none, none.astype(np.float64)
        length = np.bincount(qrows, minlength=b).astype(np.float64)  # L per row
        first = np.searchsorted(qrows, np.arange(b))
        p = np.arange(qrows.size) - first[qrows]  # 0 = most recent
        w = (length[qrows] - p) / length[qrows]
        holders, lens = self.holders.recent(qitems, self.sample_size + 1)
        prows = np.repeat(qrows, lens)
        other = holders != own[prows]
        # sum of w over the shared items, in window order (np.bincount adds in array order)
        wk = np.repeat(w, lens)[other]
        if b * n_users <= DENSE_RATIO * wk.size:  # dense rows x users: when users are few
            key = prows[other] * n_users + holders[other]
            num = np.bincount(key, weights=wk, minlength=b * n_users)
            pair = np.flatnonzero(num > 0)
            num = num[pair]
            rows, cand = pair // n_users, pair % n_users
            order = np.lexsort((-self.last[cand], rows))
            rows, cand, num = rows[order], cand[order], num[order]
        else:  # one sort by (row, recency descending): recencies are distinct per user
            held = holders[other]
            code = (prows[other] << Holders.POS_BITS) | (RECENCY_MAX - self.last[held])
            _, at, inverse = np.unique(code, return_index=True, return_inverse=True)
            num = np.bincount(inverse.reshape(-1), weights=wk, minlength=at.size)
            rows, cand = prows[other][at], held[at]
        rank = positions(rows)
        keep = rank < s
        rows, cand, num, rank = rows[keep], cand[keep], num[keep], rank[keep]
        sim = num / (np.sqrt(length[rows]) * np.sqrt(self.size[cand].astype(np.float64)))
        if self.k is not None and self.k < s:
            nearest = np.lexsort((rank, -sim, rows))  # by row, then sim desc, then recency
            near = np.zeros(rows.size, bool)
            near[nearest[positions(rows[nearest]) < self.k]] = True
            rows, cand, sim, rank = rows[near], cand[near], sim[near], rank[near]
        if not self.recency:
            return rows, cand, sim
        return rows, cand, sim * (1.0 - rank / self.sample_size)

    def item_triples(self, neighbours: Triples) -> Triples:
        """``(row, item, weight)`` of every item of every neighbour (``neighbours_of``'s
        triples), in neighbour order."""
        rows, cand, weight = neighbours
        where, lens = self.by_user.gather(cand)
        return np.repeat(rows, lens), self.by_user.second(where), np.repeat(weight, lens)


class SessionIndex:
    """Session-kNN keyed by the model's user and item keys (the trainer's part and the
    artifact's), bounded to the ``max_sessions`` most recent histories: past
    ``EVICT_SLACK`` times that many, the least recent are dropped (the sums then differ from
    the unbounded rule's only where a row's ``sample_size`` most recent neighbours reach
    that far back)."""

    #: Histories kept past ``max_sessions`` before the least recent are dropped.
    EVICT_SLACK = 1.25
    #: Positives :meth:`learn` holds at most before it learns them.
    LEARN_EVERY = 4096

    def __init__(
        self, sample_size: int = 300, window: int = 10, k: int | None = 75,
        max_sessions: int = 200_000,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.core = SessionNeighbours(sample_size, window, k)
        self.max_sessions = int(max_sessions)
        self.items = DenseIds()
        self.users = DenseIds()
        #: Bumped when the state is replaced (:meth:`load_arrays`): item indices only grow
        #: in between, so maps over them can be extended rather than rebuilt.
        self.generation = 0
        #: With :meth:`keep_journal`: the positives learnt since the last :meth:`drain`, one
        #: entry per :meth:`learn` call (what a delta sends: replayed call by call by
        #: :meth:`learned_copy`, they give this state exactly).
        self._journal: list[tuple[np.ndarray, np.ndarray]] | None = None
        #: Positives handed to :meth:`learn` and not learnt yet (:meth:`flush`).
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0

    @property
    def window(self) -> int:
        return self.core.window

    @property
    def sessions(self) -> int:
        """Histories held."""
        self.flush()
        return self.core.users

    @property
    def entries(self) -> int:
        """(history, item) entries held."""
        self.flush()
        return int(self.core.by_user.keys.size)

    def learn(self, user_keys: np.ndarray, item_keys: np.ndarray) -> None:
        """Learn positives (user key, item key), in order: held until :data:`LEARN_EVERY`
        of them wait or anything reads the index (:meth:`flush`), then learnt in one call.
        Why: a learning call copies the index's sorted arrays once whatever its size, so
        the live trainer, which reads every few batches, learns a few batches at a time
        (the sums it reads are the same)."""
        user_keys = np.asarray(user_keys, np.int64)
        if user_keys.size:
            self._pending.append((user_keys.copy(), np.asarray(item_keys, np.int64).copy()))
            self._pending_size += user_keys.size
            if self._pending_size >= self.LEARN_EVERY:
                self.flush()

    def flush(self) -> None:
        """Learn the positives :meth:`learn` holds (one learning call)."""
        if not self._pending:
            return
        parts, self._pending, self._pending_size = self._pending, [], 0
        if len(parts) == 1:
            user_keys, item_keys = parts[0]
        else:
            user_keys = np.concatenate([u for u, _ in parts])
            item_keys = np.concatenate([t for _, t in parts])
        self._learn_now(user_keys, item_keys)

    def _learn_now(self, user_keys: np.ndarray, item_keys: np.ndarray) -> None:
        if self._journal is not None:
            self._journal.append((user_keys, item_keys))
        u = self.users.ids(user_keys, add=True)
        t = self.items.ids(item_keys, add=True)
        self.core.learn_indices(u, t)
        if self.core.users > self.EVICT_SLACK * self.max_sessions:
            self._evict()

    def keep_journal(self) -> None:
        """From now on, keep the positives learnt (:meth:`drain` hands them over)."""
        if self._journal is None:
            self._journal = []

    def drain(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(user keys, item keys, calls)`` learnt since the last call (or
        :meth:`keep_journal`), in order, ``calls`` the positives of each :meth:`learn`
        call; the journal starts again empty."""
        self.flush()
        parts, self._journal = self._journal or [], [] if self._journal is not None else None
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return (np.concatenate([u for u, _ in parts]), np.concatenate([t for _, t in parts]),
                np.array([u.size for u, _ in parts], np.int64))

    def learned_copy(self, user_keys: np.ndarray, item_keys: np.ndarray, calls: np.ndarray
                     ) -> SessionIndex:
        """A new index: this one after learning the positives (:meth:`drain`'s, call by
        call), this one left as it is (the arrays nothing changes are shared, never
        written)."""
        if int(np.sum(calls)) != len(user_keys) or len(item_keys) != len(user_keys):
            raise ValueError("the calls do not add up to the positives")
        self.flush()
        out = SessionIndex(self.core.sample_size, self.core.window, self.core.k,
                           self.max_sessions)
        out.items = self.items.copy()
        out.users = self.users.copy()
        out.generation = self.generation
        out.core = self.core.copy()
        for lo, hi in zip(np.cumsum(calls) - calls, np.cumsum(calls), strict=True):
            out._learn_now(np.asarray(user_keys[lo:hi], np.int64),
                           np.asarray(item_keys[lo:hi], np.int64))
        return out

    def _evict(self) -> None:
        """Keep the ``max_sessions`` most recent histories (users renumbered by recency)."""
        core = self.core
        n = core.users
        keep = np.argsort(-core.last[:n], kind="stable")[: self.max_sessions]
        keep.sort()
        new_of = np.full(n, -1, np.int64)
        new_of[keep] = np.arange(keep.size)
        codes = core.by_user.keys
        mapped = new_of[codes >> _SHIFT]
        held = mapped >= 0
        self._load(self.users.keys[keep], core.last[keep], core.size[keep],
                   (mapped[held] << _SHIFT) | (codes[held] & _MASK), core.learned)

    def _load(self, user_keys: np.ndarray, last: np.ndarray, size: np.ndarray,
              codes: np.ndarray, learned: int,
              holders: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.users.load(np.asarray(user_keys, np.int64))
        self.core.load(codes, last, size, learned, holders)

    def windows_of(self, history: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat ``(row, item index)`` windows of a padded history matrix (item keys, 0 =
        padding, most recent first): distinct keys first, then indices (-1: an item no
        history holds, which still counts in the window's length)."""
        h = np.asarray(history, np.int64)[:, : self.window]
        # the distinct non-padding entries of the first ``window`` ones, first occurrence
        # first: an entry equal to an earlier one of its row is a repeat (padding is last)
        earlier = np.tril(np.ones((h.shape[1], h.shape[1]), bool), -1)
        repeat = ((h[:, :, None] == h[:, None, :]) & earlier).any(axis=2)
        rows, cols = np.nonzero((h != 0) & ~repeat)
        return rows.astype(np.int64), self.items.ids(h[rows, cols])

    def sums(self, user_keys: np.ndarray, history: np.ndarray, held: bool = False) -> Triples:
        """``(row, item index, s)``, by row then item, of the rows with a history (item
        keys, 0-padded, most recent first) of users ``user_keys``: the module doc's sums.
        ``held``: as the index is, without the positives :meth:`learn` still holds (at most
        :data:`LEARN_EVERY`; the live trainer's figures, which the delta stream's index lags
        more than that)."""
        if not held:
            self.flush()
        return sparse_sums(*self._triples(user_keys, history), len(history),
                           int(self.items.keys.size))

    def _triples(self, user_keys: np.ndarray, history: np.ndarray) -> Triples:
        """``(row, item index, weight)`` of every item of every row's neighbours."""
        qrows, qitems = self.windows_of(history)
        own = self.users.ids(np.asarray(user_keys, np.int64))
        return self.core.item_triples(self.core.neighbours_of(own, qrows, qitems, len(history)))

    def dense(self, user_keys: np.ndarray, history: np.ndarray, item_keys: np.ndarray
              ) -> np.ndarray:
        """``[B, len(item_keys)]`` sums (float64; 0 where no neighbour holds the item)."""
        self.flush()
        rows, ids, weight = self._triples(user_keys, history)
        col = self.columns(item_keys)[ids]
        ok = col >= 0
        return row_sums(rows[ok], col[ok], weight[ok], len(history), len(item_keys))

    def columns(self, item_keys: np.ndarray) -> np.ndarray:
        """``[items held]``: the position of each item index in ``item_keys``, -1 if absent."""
        self.flush()
        out = np.full(self.items.keys.size, -1, np.int64)
        ids = self.items.ids(np.asarray(item_keys, np.int64))
        known = ids >= 0
        out[ids[known]] = np.flatnonzero(known)
        return out

    # -- export and checkpoint -------------------------------------------------------------
    def to_arrays(self, holders: bool = False) -> dict[str, np.ndarray]:
        """The state as arrays (``sessions_*``): the trainer's checkpoint and the artifact;
        with ``holders`` also the items' holders by recency (:data:`HOLDER_ARRAYS`, derived:
        a reader handed them skips their sort). Arrays later learning writes are copies."""
        self.flush()
        core = self.core
        n = core.users
        out = {
            "sessions_item_keys": self.items.keys,
            "sessions_user_keys": self.users.keys[:n],
            "sessions_last": core.last[:n].copy(),
            "sessions_size": core.size[:n].copy(),
            "sessions_codes": core.by_user.keys,
            "sessions_learned": np.array([core.learned], np.int64),
        }
        if holders:
            out.update(zip(HOLDER_ARRAYS, (core.holders.codes, core.holders.users), strict=True))
        return out

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore :meth:`to_arrays` (absent keys: an empty state)."""
        def get(name: str) -> np.ndarray:
            return np.asarray(arrays.get(name, np.zeros(0, np.int64)), np.int64)

        self.generation += 1
        self._pending, self._pending_size = [], 0
        self.items.load(get("sessions_item_keys"))
        learned = get("sessions_learned")
        held = None
        if all(name in arrays for name in HOLDER_ARRAYS):
            held = (get(HOLDER_ARRAYS[0]), get(HOLDER_ARRAYS[1]))
        self._load(get("sessions_user_keys"), get("sessions_last"), get("sessions_size"),
                   get("sessions_codes"), int(learned[0]) if learned.size else 0, held)

    def params(self) -> dict[str, int | None]:
        return {"sample_size": self.core.sample_size, "window": self.core.window,
                "k": self.core.k, "max_sessions": self.max_sessions}
