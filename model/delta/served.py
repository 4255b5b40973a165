"""Composing successive states of a lineage into servable artifacts, patched per delta.

:func:`model.delta.compose` builds an artifact from a state from scratch (catalog lookups,
a sort, the id map): too slow to run for every delta in every serving worker. A
:class:`Composer` keeps, privately, what those lookups produce aligned with the catalog's
rows, rewrites only what a delta changed, and recomputes the served item matrix from the
cached rows into a new array, so the result equals a full compose and requests in flight keep
the array they started with. A delta that removes items, the first state of a lineage and any
state not the successor of the last are composed from scratch. What is cached and why the
matrix is recomputed: docs/internals.md; the costs: ``docs/decisions.md#delta-stream``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from model.artifact.files import ServingArtifact
from model.delta.apply import Delta
from model.delta.state import ModelState, compose, insert_sorted, item_index, servable
from model.scoring.prior import normalized_rows, served_item_vectors


class Composer:
    """Artifacts of one follower's states (module doc); not thread-safe: one caller."""

    def __init__(self) -> None:
        self._state: ModelState | None = None
        self._artifact: ServingArtifact | None = None
        self._rows = np.zeros((0, 0), np.float32)  # normalised history rows, by catalog row
        self._base = np.zeros(0, np.float64)  # prior base, by catalog row
        self._buckets = np.zeros(0, np.int64)  # catalog's prior buckets, sorted
        self._bucket_rows = np.zeros(0, np.int64)  # their catalog rows
        #: How the last artifact was built: "full" or "patched".
        self.last = ""

    def compose(self, state: ModelState, delta: Delta | None = None,
                pause: Callable[[], None] | None = None) -> ServingArtifact:
        """The artifact of ``state``; patched from the last one when ``state`` is the
        result of applying ``delta`` (no removed items) to the last state composed.
        ``pause``: called between the steps of a patch (as ``model.delta.apply``'s)."""
        prev, self._state = self._state, None  # a failure below leaves nothing half-patched
        if (prev is None or delta is None or delta.removed_items.size
                or delta.base_version != prev.base_version or state.base_version != prev.base_version
                or delta.seq != prev.seq + 1 or state.seq != delta.seq
                or state.constants != prev.constants
                or state.item_keys.size < prev.item_keys.size or self._artifact is None):
            artifact = self._full(state)
            self.last = "full"
        else:
            artifact = self._patched(prev, state, delta, self._artifact, pause or _no_pause)
            self.last = "patched"
        self._state, self._artifact = state, artifact
        return artifact

    # -- from scratch --------------------------------------------------------------------------
    def _full(self, state: ModelState) -> ServingArtifact:
        rows = state.catalog_hist_rows()
        self._rows = normalized_rows(rows) if state.constants.normalize and rows.size \
            else np.array(rows, np.float32)
        self._base = state.prior_base_of(state.item_keys)
        buckets = np.mod(state.item_keys, np.int64(state.constants.prior_buckets))
        order = np.argsort(buckets, kind="stable").astype(np.int64)
        self._buckets, self._bucket_rows = buckets[order], order
        state.catalog_index  # noqa: B018 - built now, so apply merges it into the next state's
        return compose(state)

    # -- per delta -----------------------------------------------------------------------------
    def _patched(self, prev: ModelState, state: ModelState, delta: Delta,
                 previous: ServingArtifact, pause: Callable[[], None]) -> ServingArtifact:
        c = state.constants
        n_prev, n = prev.item_keys.size, state.item_keys.size
        added = np.arange(n_prev, n, dtype=np.int64)
        if added.size:
            buckets = np.mod(state.item_keys[added], np.int64(c.prior_buckets))
            order = np.argsort(buckets, kind="stable")
            at = np.searchsorted(self._buckets, buckets[order])
            self._buckets, self._bucket_rows = insert_sorted(
                self._buckets, self._bucket_rows, at, buckets[order], added[order])
        pause()
        touched = state.catalog_rows(delta.hist_keys)
        touched = np.union1d(touched[touched >= 0], added)
        self._rows = _grown(self._rows, n)
        if touched.size:
            rows = state.catalog_hist_rows(touched)
            self._rows[touched] = normalized_rows(rows) if c.normalize else rows
        pause()
        if c.score_bias:
            self._base = _grown(self._base, n)
            lo = np.searchsorted(self._buckets, delta.prior_buckets, side="left")
            hi = np.searchsorted(self._buckets, delta.prior_buckets, side="right")
            moved = self._bucket_rows[_ranges(lo, hi)]
            rebased = np.union1d(moved, added)
            if rebased.size:
                self._base[rebased] = state.prior_base_of(state.item_keys[rebased])
        pause()
        item_rows = self._rows[:n]
        log_q = state.log_q_of_base(self._base[:n]) if c.score_bias else None
        vectors = served_item_vectors(item_rows, log_q, normalize=False,
                                      tower_weight=state.weights[0],
                                      prior_weight=state.weights[1], temperature=c.temperature)
        if np.shares_memory(vectors, self._rows):
            vectors = vectors.copy()  # the cache is rewritten next delta; the served is not
        pause()
        covisit = state.covisit_csr(pause) if c.covisit_window is not None else None
        pause()
        # the catalog is the previous one with items appended (a patch removes none)
        return servable(state, vectors, covisit,
                        item_index(state.item_ids, previous, prefix_known=True))


def _no_pause() -> None:
    """The default ``pause`` of :meth:`Composer.compose`: none."""


def _grown(arr: np.ndarray, n: int) -> np.ndarray:
    """``arr`` with room for ``n`` rows (capacity doubles: appends stay amortised O(1))."""
    if arr.shape[0] >= n:
        return arr
    out = np.empty((max(n, 2 * arr.shape[0]), *arr.shape[1:]), arr.dtype)
    out[: arr.shape[0]] = arr
    return out


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The concatenated ``arange(lo[i], hi[i])``."""
    lengths = hi - lo
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.int64)
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return starts + np.arange(total, dtype=np.int64)


