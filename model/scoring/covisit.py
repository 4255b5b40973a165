"""Item co-visitation term of the retrieval score (numpy only, no TensorFlow).

The model's score of item i for a user is the two towers' score plus::

    covisit_weight * log1p(s_i),   s_i = sum_{j < window} decay ** j * C[h_j, i]

where ``h`` is the user's history (most recent first) and ``C[a, b]`` the decayed weight of
item b following item a, learnt from every positive training sample (and, at ``reverse``, of
b preceding a). Why: the towers' rows blur which items follow which; exact pair weights of the
last few items keep that (``docs/decisions.md#co-visitation``). :class:`CoVisitation` lives in
the trainer and is exported as a CSR matrix; :func:`accumulate` is the one sum trainer and
serving compute. The update rule and storage: docs/internals.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from model.scoring.sorted_keys import DenseIds, add_sorted

PAD_KEY = 0
#: ``(row, dense id, s)`` arrays of :meth:`CoVisitation.row_sums`.
Triples = tuple[np.ndarray, np.ndarray, np.ndarray]
#: Mask of the low 32 bits of a pair code (``a << 32 | b``).
LOW32 = np.int64(0xFFFFFFFF)


def row_pairs(row_of: np.ndarray, id_codes: np.ndarray, values: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Pairs by dense ids (``a << 32 | b``) as pairs by rows (``row_of``: each id's row, -1:
    none), those with both items among the rows, with their ``values`` (float64)."""
    id_codes = np.asarray(id_codes, np.int64)
    a, b = row_of[id_codes >> 32], row_of[id_codes & LOW32]
    keep = (a >= 0) & (b >= 0)
    return (a[keep] << 32) | b[keep], np.asarray(values, np.float64)[keep]


def pairs_csr(row_codes: np.ndarray, weights: np.ndarray, n: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs by rows, sorted by code, as the artifact's CSR arrays over ``n`` rows:
    ``(indptr int64 [n + 1], neighbours int32 [nnz], weights float32 [nnz])``."""
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(row_codes >> 32, minlength=n), out=indptr[1:])
    return indptr, (row_codes & LOW32).astype(np.int32), np.asarray(weights).astype(np.float32)
#: Buffered pair updates that trigger a merge (the trainer also merges before reading).
MERGE_EVERY = 1 << 18
#: Largest groups x targets that :func:`accumulate` counts densely.
DENSE_MAX = 1 << 22
#: ... and at most this many times the entries summed (else sorting them is cheaper).
DENSE_RATIO = 8

#: Popularity damping of item-kNN over co-occurrence sums, ``sum / (count + 1) ** alpha``: the
#: panel's ``itemknn`` baseline (``model.evaluation.neighbours``) and the trainer's live
#: item-kNN figure (``model.trainer.rolling``); chosen on the panel, docs/decisions.md.
ITEMKNN_ALPHA = 0.3


def position_weights(window: int, decay: float) -> np.ndarray:
    """``decay ** j`` for the history positions ``j < window`` (float64)."""
    return np.power(float(decay), np.arange(window, dtype=np.float64))


def accumulate(
    starts: np.ndarray,
    ends: np.ndarray,
    scale: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray,
    groups: np.ndarray | None = None,
    n_targets: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(t, s)``: for every target ``t`` in the slices ``targets[starts[j]:ends[j]]``, the sum
    ``s`` of ``scale[j] * weights[k]`` over the slices' entries ``k`` that name it (``t`` sorted,
    distinct). With ``groups`` (``[J]`` ints >= 0), sums are kept apart per group of slices
    and ``t`` is ``group << 32 | target``.

    ``n_targets`` (every target is below it) lets the sums be counted in a dense array
    instead of sorting the entries when groups x targets is at most :data:`DENSE_MAX` and
    :data:`DENSE_RATIO` times the entries (the trainer's head of 32 rows over all items): the
    same triples, the same float sums (both add in input order)."""
    group, target, sums = _sum_entries(
        *_gather(starts, ends, scale, targets, weights, groups), n_targets)
    return (target if group is None else group << 32 | target), sums


def _gather(
    starts: np.ndarray,
    ends: np.ndarray,
    scale: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray,
    groups: np.ndarray | None = None,
    mask: np.int64 | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The entries of :func:`accumulate`'s slices in slice order: ``(target, scale * weight,
    group)`` (``target & mask`` with ``mask``; group None without ``groups``)."""
    lens = (ends - starts).astype(np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64), (
            None if groups is None else np.zeros(0, np.int64))
    # the positions of all slices in one array: a running index restarted at each slice
    offsets = np.repeat(starts.astype(np.int64) - np.cumsum(lens) + lens, lens)
    idx = offsets + np.arange(total, dtype=np.int64)
    vals = weights[idx] * np.repeat(scale, lens)
    found = targets[idx].astype(np.int64)
    if mask is not None:
        found &= mask
    group_of = None if groups is None else np.repeat(np.asarray(groups, np.int64), lens)
    return found, vals, group_of


def _sum_entries(
    found: np.ndarray, vals: np.ndarray, group_of: np.ndarray | None, n_targets: int | None
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """:func:`accumulate`'s sums of gathered entries (:func:`_gather`), added in entry order,
    as ``(group, target, s)`` sorted by group, then target (group None without groups)."""
    if found.size == 0:
        none = np.zeros(0, np.int64)
        return (None if group_of is None else none), none, np.zeros(0, np.float64)
    n_groups = 1 if group_of is None else int(group_of.max()) + 1
    if n_targets is not None and n_groups * n_targets <= min(DENSE_MAX, DENSE_RATIO * found.size):
        flat = found if group_of is None else group_of * n_targets + found
        size = n_groups * int(n_targets)
        # the hits from a bool mask: ``nonzero`` on the counts themselves costs several
        # times more where a third of the cells are hit (the trainer's head)
        hits = np.flatnonzero(np.bincount(flat, minlength=size) != 0)
        sums = np.bincount(flat, vals, minlength=size)[hits]
        if group_of is None:
            return None, hits, sums
        # each hit's group by where the groups' cells begin (no division per hit)
        cuts = np.searchsorted(hits, np.arange(1, n_groups, dtype=np.int64) * n_targets)
        group = np.repeat(np.arange(n_groups, dtype=np.int64),
                          np.diff(cuts, prepend=0, append=hits.size))
        return group, hits - group * n_targets, sums
    if group_of is None:
        uniq, inv = np.unique(found, return_inverse=True)
        return None, uniq, np.bincount(inv, vals)
    uniq, inv = np.unique(found | group_of << 32, return_inverse=True)
    return uniq >> 32, uniq & LOW32, np.bincount(inv, vals)


def _sum_runs(codes: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sums of ``vals`` per distinct code, for codes made of a few sorted runs of distinct
    codes (a stable merge, no dense count): equal to :func:`_sum_entries` bit for bit (each
    code's values added in entry order)."""
    if codes.size == 0:
        return codes, np.zeros(0, np.float64)
    order = np.argsort(codes, kind="stable")
    codes = codes[order]
    first = np.concatenate(([True], codes[1:] != codes[:-1]))
    # bincount adds one by one in order (``np.add.reduceat`` sums a long run pairwise)
    return codes[first], np.bincount(np.cumsum(first) - 1, vals[order])


def _add_sorted(
    codes: np.ndarray,
    weights: np.ndarray,
    new_codes: np.ndarray,
    new_weights: np.ndarray,
    distinct: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``codes``/``weights`` (sorted, distinct) with ``new_weights`` added at ``new_codes``
    (unsorted, repeats allowed; sorted and distinct already if ``distinct``)."""
    if not distinct:
        new_codes, inv = np.unique(new_codes, return_inverse=True)
        new_weights = np.bincount(inv, new_weights)
    return add_sorted(codes, weights, new_codes, new_weights)


def term(sums: np.ndarray, weight: float) -> np.ndarray:
    """The score added for co-visitation sums ``s``: ``weight * log1p(s)`` (float32)."""
    return (float(weight) * np.log1p(sums)).astype(np.float32)


class CoVisitation:
    """Decayed item co-visitation weights learnt from training samples (see the module doc)."""

    def __init__(
        self,
        window: int = 5,
        decay: float = 0.9,
        half_life: float = 20_000.0,
        max_pairs: int = 4_000_000,
        merge_every: int = MERGE_EVERY,
        reverse: float = 0.0,
    ) -> None:
        if window < 1 or not 0.0 < decay <= 1.0 or half_life < 0 or max_pairs < 1:
            raise ValueError("window >= 1, 0 < decay <= 1, half_life >= 0, max_pairs >= 1")
        if reverse < 0.0:
            raise ValueError("reverse must be >= 0")
        self.reverse = float(reverse)
        self.window = int(window)
        self.decay = float(decay)
        self.half_life = float(half_life)
        self.max_pairs = int(max_pairs)
        self.merge_every = int(merge_every)
        self._rate = math.log(2.0) / half_life if half_life > 0 else 0.0
        self._scale = position_weights(self.window, self.decay)
        self._ids = DenseIds()  # item key <-> dense id
        self.codes = np.zeros(0, np.int64)  # sorted pair codes a << 32 | b
        self.weights = np.zeros(0, np.float64)  # weight of each code at ``_base`` samples
        self.samples = 0  # positive samples learnt
        self._base = 0  # ``samples`` at which ``weights`` are exact
        # updates since the last merge, folded by reads: sorted distinct codes, weights at
        # ``_base`` (a read adds them to ``codes``' sums instead of merging the whole state)
        self._recent_codes = np.zeros(0, np.int64)
        self._recent_weights = np.zeros(0, np.float64)
        self._pend_codes: list[np.ndarray] = []
        self._pend_weights: list[np.ndarray] = []
        self._pending = 0
        #: Bumped when the state is replaced (:meth:`load_arrays`): dense ids only grow
        #: in between, so maps over them can be extended rather than rebuilt.
        self.generation = 0

    # -- ids -----------------------------------------------------------------------------------
    @property
    def keys(self) -> np.ndarray:
        """Item key of each dense id."""
        return self._ids.keys

    def ids(self, keys: np.ndarray, add: bool = False) -> np.ndarray:
        """Dense ids of item ``keys`` (-1 for an unknown key unless ``add``)."""
        return self._ids.ids(keys, add)

    # -- learning ------------------------------------------------------------------------------
    def learn(self, history: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> None:
        """Add one batch of samples (``history`` ``[B, L]`` item keys, most recent first,
        0-padded; ``targets`` ``[B]``; ``weights`` ``[B]``, only > 0 counts)."""
        keep = np.asarray(weights) > 0
        if not keep.any():
            return
        hist = np.asarray(history, np.int64)[keep, : self.window]
        tgt = np.asarray(targets, np.int64)[keep]
        w = np.asarray(weights, np.float64)[keep]
        growth = math.exp(self._rate * (self.samples - self._base))
        self.samples += int(tgt.size)
        rows, cols = np.nonzero((hist != PAD_KEY) & (hist != tgt[:, None]))
        if rows.size == 0:
            return
        ids = self.ids(np.concatenate([tgt, hist[rows, cols]]), add=True)
        b, a = ids[: tgt.size][rows], ids[tgt.size :]
        vals = w[rows] * self._scale[cols] * growth
        self._pend_codes.append((a << 32) | b)
        self._pend_weights.append(vals)
        self._pending += int(rows.size)
        if self.reverse:
            self._pend_codes.append((b << 32) | a)
            self._pend_weights.append(vals * self.reverse)
            self._pending += int(rows.size)
        if self._pending + self._recent_codes.size >= self.merge_every:
            self.merge()

    def _fold(self) -> None:
        """Fold the buffered updates into the recent pairs (a few thousand per batch: no
        pass over the whole state)."""
        if self._pending:
            codes = np.concatenate(self._pend_codes)
            vals = np.concatenate(self._pend_weights)
            self._pend_codes, self._pend_weights, self._pending = [], [], 0
            self._recent_codes, self._recent_weights = _add_sorted(
                self._recent_codes, self._recent_weights, codes, vals)

    def merge(self) -> None:
        """Fold the buffered updates, the recent pairs and the decay since the last merge
        into the arrays (``codes`` and ``weights`` are then exact at ``samples``)."""
        self._fold()
        if self.samples == self._base and not self._recent_codes.size:
            return
        shrink = math.exp(-self._rate * (self.samples - self._base))
        self._base = self.samples
        if shrink != 1.0:
            self.weights *= shrink
        if not self._recent_codes.size:
            return
        codes, vals = self._recent_codes, self._recent_weights * shrink
        self._recent_codes = np.zeros(0, np.int64)
        self._recent_weights = np.zeros(0, np.float64)
        self.codes, self.weights = _add_sorted(self.codes, self.weights, codes, vals,
                                               distinct=True)
        if self.codes.size > self.max_pairs:
            keep = np.sort(np.argpartition(self.weights, -self.max_pairs)[-self.max_pairs :])
            self.codes, self.weights = self.codes[keep], self.weights[keep]

    # -- reading -------------------------------------------------------------------------------
    def row_sums(self, history: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The non-zero ``s`` of each history row (item keys ``[B, L]``, most recent first) as
        ``(row, dense id of the item, s)`` triples (sorted by row, then id).

        Reads the merged pairs and the recent ones side by side and applies the decay since
        the last merge as one factor, so a read costs what its rows name, not a pass over
        every pair (the live evaluation reads a head every few batches)."""
        return self.row_sums_and_last(history, last=False)[0]

    def row_sums_and_last(
        self, history: np.ndarray, last: bool = True
    ) -> tuple[Triples, Triples | None]:
        """:meth:`row_sums` of ``history`` and, with ``last``, of its first column alone (the
        most recent item's own term) from the same gathered entries: equal to
        ``row_sums(history[:, :1])`` bit for bit."""
        self._fold()
        ids = self.ids(np.asarray(history, np.int64)[:, : self.window])
        rows, pos = np.nonzero(ids >= 0)
        empty = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
        if not rows.size:
            return empty, empty if last else None
        first = ids[rows, pos]
        lo, hi, scale = first << 32, (first + 1) << 32, self._scale[pos]
        parts = []
        for codes, weights in ((self.codes, self.weights),
                               (self._recent_codes, self._recent_weights)):
            if codes.size:
                starts, ends = np.searchsorted(codes, lo), np.searchsorted(codes, hi)
                found, vals, group = _gather(starts, ends, scale, codes, weights, rows, mask=LOW32)
                newest = np.repeat(pos == 0, ends - starts) if last else None
                parts.append((found, vals, group, newest))
        if not parts:
            return empty, empty if last else None
        found = np.concatenate([p[0] for p in parts])
        vals = np.concatenate([p[1] for p in parts])
        group = np.concatenate([p[2] for p in parts if p[2] is not None])
        factor = (math.exp(-self._rate * (self.samples - self._base))
                  if self.samples != self._base else None)
        rows_of, ids, s = _sum_entries(found, vals, group, self.keys.size)
        assert rows_of is not None  # grouped by row
        out: list[Triples] = [(rows_of, ids, s)]
        if last:
            # the most recent items' entries: per row one sorted slice of each part
            newest = np.concatenate([p[3] for p in parts])
            codes, sl = _sum_runs(group[newest] << 32 | found[newest], vals[newest])
            out.append((codes >> 32, codes & LOW32, sl))
        if factor is not None:
            for triple in out:
                triple[2][...] *= factor
        return out[0], out[1] if last else None

    def sums(self, history: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """``[B, N]`` float64: ``s`` of each history row (item keys ``[B, L]``, most recent
        first) for each of the ``candidates`` (item keys ``[N]``; 0 where no pairs)."""
        history = np.asarray(history, np.int64)
        out = np.zeros((history.shape[0], len(candidates)), np.float64)
        rows, ids, s = self.row_sums(history)
        col = self.positions(np.asarray(candidates, np.int64))[ids]
        ok = col >= 0
        out[rows[ok], col[ok]] = s[ok]
        return out

    def positions(self, candidates: np.ndarray) -> np.ndarray:
        """``[n ids]``: the position of each dense id in ``candidates`` (item keys), -1 if
        absent."""
        out = np.full(self.keys.size, -1, np.int64)
        ids = self.ids(np.asarray(candidates, np.int64))
        known = ids >= 0
        out[ids[known]] = np.flatnonzero(known)
        return out

    def csr(self, item_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pairs among ``item_keys`` (the rows of an artifact, in order) as CSR arrays
        ``(indptr int64 [N + 1], neighbours int32 [nnz], weights float32 [nnz])``: row ``r``'s
        neighbours are rows of ``item_keys`` (ascending), with their current weights."""
        self.merge()
        codes, w = row_pairs(self.positions(item_keys), self.codes, self.weights)
        order = np.argsort(codes)  # (a, b) pairs are distinct: no ties
        return pairs_csr(codes[order], w[order], len(item_keys))

    # -- checkpoint ----------------------------------------------------------------------------
    def to_arrays(self) -> dict[str, np.ndarray]:
        """The state as arrays (``covisit_*``) for the trainer's checkpoint."""
        self.merge()
        return {
            "covisit_keys": self.keys,
            "covisit_codes": self.codes,
            "covisit_weights": self.weights,
            "covisit_samples": np.array([self.samples], np.int64),
        }

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore :meth:`to_arrays` (absent keys: an empty state)."""
        self.generation += 1
        self._ids.load(np.asarray(arrays.get("covisit_keys", np.zeros(0, np.int64)), np.int64))
        self.codes = np.asarray(arrays.get("covisit_codes", np.zeros(0, np.int64)), np.int64)
        self.weights = np.asarray(arrays.get("covisit_weights", np.zeros(0)), np.float64)
        samples = arrays.get("covisit_samples", np.zeros(1, np.int64))
        self.samples = self._base = int(samples[0]) if len(samples) else 0
        self._pend_codes, self._pend_weights, self._pending = [], [], 0
        self._recent_codes = np.zeros(0, np.int64)
        self._recent_weights = np.zeros(0, np.float64)


def history_rows(index: Mapping[str, int], history: Sequence[str], window: int) -> list[int]:
    """Row of each of the first ``window`` history entries in an artifact (-1: not there)."""
    return [index.get(item, -1) for item in history[:window]]
