"""The served stage: a state composed into a ``ServingArtifact``, per delta by a patch.

:func:`compose` builds an artifact from a state from scratch (catalog lookups, a sort, the id
map): too slow to run for every delta in every serving worker. A :class:`Composer` keeps,
privately, what those lookups produce aligned with the catalog's rows, rewrites only what a
delta changed, and recomputes the served item matrix from the cached rows into a new array, so
the result equals a full compose and requests in flight keep the array they started with. A
delta that removes items, the first state of a lineage and any state not the successor of the
last are composed from scratch. The co-visitation pairs are kept by catalog rows and patched
too, so no delta sorts them all; so is the catalog row of each session-kNN item (the index's
items and the catalog only grow within a patch). The session-kNN index itself is the state's
(``ModelState.sessions``, never written), served while its weight is > 0. What is cached and
why the matrix is recomputed: docs/internals.md; the costs: ``docs/decisions.md#delta-stream``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from model.artifact.files import ServingArtifact
from model.artifact.sessions import params_of
from model.delta.apply import insert_sorted, upsert_sorted
from model.delta.state import ModelState
from model.delta.wire import Delta
from model.scoring.cold import POPULAR, popularity_scores
from model.scoring.covisit import LOW32, pairs_csr, row_pairs
from model.scoring.prior import normalized_rows, served_item_vectors

_I64 = np.zeros(0, np.int64)


def compose(state: ModelState, previous: ServingArtifact | None = None) -> ServingArtifact:
    """The state as a servable artifact (its ``manifest`` names the base version and the
    delta sequence), built from scratch. ``previous``: the artifact of an earlier state of
    the lineage, whose id -> row map is reused when the catalog is the same or only grew.
    :class:`Composer` builds the same artifact per delta from the last one."""
    covisit = state.covisit_csr() if state.constants.covisit_window is not None else None
    return servable(state, state.item_vectors(), covisit, item_index(state.item_ids, previous))


def servable(
    state: ModelState, vectors: np.ndarray,
    covisit: tuple[np.ndarray, np.ndarray, np.ndarray] | None, index: Mapping[str, int],
    popularity: np.ndarray | None = None, sessions_rows: np.ndarray | None = None,
    hist_rows: np.ndarray | None = None,
) -> ServingArtifact:
    """The artifact of ``state`` with its item ``vectors``, CSR pairs and id -> row map
    (computed by the caller: from scratch or patched); the arrays are made read-only.
    ``popularity``: the catalog's all-time popularity scores when the state's cold start
    ranks by them (``ModelState.item_popularity``; computed here when not given).
    ``sessions_rows``: the catalog row of each session-kNN item (-1: none) when the state
    serves that part (computed here when not given). ``hist_rows``: the rows histories are
    pooled from (``ModelState.served_hist_rows``; computed here when not given)."""
    c = state.constants
    if state.cold_start != POPULAR:
        popularity = None
    elif popularity is None:
        popularity = state.item_popularity()
    sessions = state.sessions if state.serves_sessions else None
    if sessions is None:
        sessions_rows = None
    elif sessions_rows is None:
        sessions_rows = state.catalog_rows(sessions.items.keys)
    if hist_rows is None:
        hist_rows = state.served_hist_rows
    for arr in vectors, state.user_rows, state.hist_rows, hist_rows:
        arr.setflags(write=False)
    for extra in popularity, sessions_rows:
        if extra is not None:
            extra.setflags(write=False)
    manifest: dict[str, Any] = {
        "format": "streamrec-artifact",
        "version": state.base_version,
        "delta_seq": state.seq,
        "created_at": state.created_at,
        "trained_through_ms": state.trained_through_ms,
        "normalize": c.normalize,
        "dims": {
            "items": int(state.item_ids.shape[0]), "d": int(vectors.shape[1]),
            "hist_items": int(state.hist_keys.shape[0]), "hist_dim": int(state.hist_rows.shape[1]),
            "users": int(state.user_keys.shape[0]), "user_dim": int(state.user_rows.shape[1]),
        },
    }
    if c.score_bias:
        manifest["score_bias"] = True
    if c.history_len is not None:
        manifest["history_len"] = c.history_len
    if c.history_decay != 1.0:
        manifest["history_decay"] = c.history_decay
    if state.cold_start != "mix":
        manifest["cold_start"] = state.cold_start
    if covisit is not None:
        manifest["covisit"] = {
            "weight": state.weights[2], "last_weight": state.weights[3],
            "window": c.covisit_window, "decay": c.covisit_decay,
        }
    if sessions is not None:
        manifest["sessions"] = params_of(sessions, state.sessions_weight)
    if state.history_groups is not None:
        manifest["history_groups"] = dict(state.history_groups)
    return ServingArtifact(
        path=Path(f"delta:{state.base_version}+{state.seq}"),
        manifest=manifest,
        item_ids=state.item_ids,
        item_vectors=vectors,
        item_hist_keys=state.hist_keys,
        item_hist_rows=hist_rows,
        user_keys=state.user_keys,
        user_rows=state.user_rows,
        default_user_row=state.default_user_row,
        layers=state.layers,
        normalize=c.normalize,
        item_index=index,
        covisit=covisit,
        item_popularity=popularity,
        sessions=sessions,
        sessions_rows=sessions_rows,
    )


def item_index(ids: np.ndarray, previous: ServingArtifact | None,
               prefix_known: bool = False) -> Mapping[str, int]:
    """id -> catalog row; from ``previous`` when its catalog is ``ids`` or a prefix of it
    (apply keeps the same array when the catalog did not change and appends new items).
    ``prefix_known``: the caller knows that it is (the prefix is not compared)."""
    if previous is not None:
        old = previous.item_ids
        if old is ids:
            return previous.item_index
        n = old.shape[0]
        if n <= ids.shape[0] and (prefix_known or np.array_equal(ids[:n], old)):
            if n == ids.shape[0]:
                return previous.item_index  # the same catalog (maps are never written)
            index = dict(previous.item_index)
            index.update((str(i), n + r) for r, i in enumerate(ids[n:].tolist()))
            return index
    return {str(i): r for r, i in enumerate(ids.tolist())}


class Composer:
    """Artifacts of one follower's states (module doc); not thread-safe: one caller."""

    def __init__(self) -> None:
        self._state: ModelState | None = None
        self._artifact: ServingArtifact | None = None
        self._rows = np.zeros((0, 0), np.float32)  # normalised history rows, by catalog row
        self._base = np.zeros(0, np.float64)  # prior base, by catalog row
        self._count = np.zeros(0, np.float64)  # all-time counts, by catalog row
        self._buckets = np.zeros(0, np.int64)  # catalog's prior buckets, sorted
        self._bucket_rows = np.zeros(0, np.int64)  # their catalog rows
        #: The co-visitation pairs among the catalog, by catalog rows (``a << 32 | b``,
        #: sorted) with their stored values, and each co-visitation id's catalog row (-1:
        #: not in the catalog): patched per delta instead of sorted afresh.
        self._pair_codes = np.zeros(0, np.int64)
        self._pair_values = np.zeros(0, np.float64)
        self._row_of_id = np.zeros(0, np.int64)
        #: The catalog row of each session-kNN item index (-1: not in the catalog), of the
        #: last state's index (None: it has none); never written once built (it is served).
        self._sessions_rows: np.ndarray | None = None
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
        self._count = state.prior_count_of(state.item_keys)
        buckets = np.mod(state.item_keys, np.int64(state.constants.prior_buckets))
        order = np.argsort(buckets, kind="stable").astype(np.int64)
        self._buckets, self._bucket_rows = buckets[order], order
        state.catalog_index  # noqa: B018 - built now, so apply merges it into the next state's
        covisit = None
        if state.constants.covisit_window is not None:
            self._row_of_id = state.catalog_rows(state.covisit_keys)
            codes, values = row_pairs(self._row_of_id, state.covisit_codes,
                                       state.covisit_values)
            order = np.argsort(codes)  # (a, b) pairs are distinct: no ties
            self._pair_codes, self._pair_values = codes[order], values[order]
            covisit = self._csr(state)
        self._sessions_rows = (state.catalog_rows(state.sessions.items.keys)
                               if state.sessions is not None else None)
        return servable(state, state.item_vectors(), covisit, item_index(state.item_ids, None),
                        sessions_rows=self._sessions_rows)

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
        if state.attributes is not None and delta.attributes is not None:
            touched = np.union1d(touched, _attributes_moved(prev, state, delta))
        self._rows = _grown(self._rows, n)
        if touched.size:
            rows = state.catalog_hist_rows(touched)
            self._rows[touched] = normalized_rows(rows) if c.normalize else rows
        pause()
        lo = np.searchsorted(self._buckets, delta.prior_buckets, side="left")
        hi = np.searchsorted(self._buckets, delta.prior_buckets, side="right")
        rebased = np.union1d(self._bucket_rows[_ranges(lo, hi)], added)
        self._count = _grown(self._count, n)
        if rebased.size:
            self._count[rebased] = state.prior_count_of(state.item_keys[rebased])
        if c.score_bias:
            self._base = _grown(self._base, n)
            if rebased.size:
                self._base[rebased] = state.prior_base_of(state.item_keys[rebased])
        pause()
        item_rows = self._rows[:n]
        log_q = state.log_q_of_base(self._base[:n]) if c.score_bias else None
        vectors = served_item_vectors(item_rows, log_q, normalize=False,
                                      tower_weight=state.weights[0],
                                      prior_weight=state.weights[1], temperature=c.temperature,
                                      item_scale=state.item_scales(self._count[:n]))
        if np.shares_memory(vectors, self._rows):
            vectors = vectors.copy()  # the cache is rewritten next delta; the served is not
        pause()
        covisit = self._patched_csr(prev, state, delta, pause) \
            if c.covisit_window is not None else None
        pause()
        # the catalog is the previous one with items appended (a patch removes none)
        popularity = popularity_scores(self._count[:n]) if state.cold_start == POPULAR else None
        self._sessions_rows = self._patched_sessions_rows(prev, state, added)
        return servable(state, vectors, covisit,
                        item_index(state.item_ids, previous, prefix_known=True), popularity,
                        self._sessions_rows)

    def _patched_sessions_rows(self, prev: ModelState, state: ModelState, added: np.ndarray
                               ) -> np.ndarray | None:
        """The catalog row of each session-kNN item of ``state`` from the last ones: within a
        lineage the index only gains items (a learned copy keeps the ids and the
        generation), so the items new to it are looked up and the catalog's ``added`` rows
        set (a new array: the last one is served)."""
        index, last = state.sessions, self._sessions_rows
        if index is None:
            return None
        if (last is None or prev.sessions is None
                or index.generation != prev.sessions.generation
                or index.items.keys.size < last.size):
            return state.catalog_rows(index.items.keys)
        if index.items.keys.size == last.size and not added.size:
            return last
        rows = np.concatenate([last, state.catalog_rows(index.items.keys[last.size:])])
        ids = index.items.ids(state.item_keys[added])
        held = ids >= 0
        rows[ids[held]] = added[held]
        return rows


    def _patched_csr(self, prev: ModelState, state: ModelState, delta: Delta,
                     pause: Callable[[], None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The CSR pairs of ``state`` from the last ones: the delta's pairs upserted and
        removed, and the stored pairs of items that joined the catalog added — linear in
        the pairs (no sort of them all, as ``ModelState.covisit_csr`` does)."""
        row_of = state.catalog_rows(state.covisit_keys)
        old = self._row_of_id
        joined = np.flatnonzero((old < 0) & (row_of[:old.size] >= 0))
        codes, values = self._pair_codes, self._pair_values
        if joined.size:  # pairs stored before their items were in the catalog
            mark = np.zeros(row_of.size, bool)
            mark[joined] = True
            ids = state.covisit_codes
            hit = mark[ids >> 32] | mark[ids & LOW32]
            more, more_values = row_pairs(row_of, ids[hit], state.covisit_values[hit])
            codes, values = upsert_sorted(codes, values, more, more_values, _I64)
        pause()
        changed, changed_values = row_pairs(row_of, delta.covisit_codes,
                                             np.asarray(delta.covisit_values, np.float64))
        removed, _ = row_pairs(row_of, delta.covisit_removed,
                                np.zeros(delta.covisit_removed.size))
        codes, values = upsert_sorted(codes, values, changed, changed_values, removed)
        self._pair_codes, self._pair_values, self._row_of_id = codes, values, row_of
        pause()
        return self._csr(state)

    def _csr(self, state: ModelState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The CSR arrays over the catalog's rows from the cached pairs."""
        return pairs_csr(self._pair_codes, self._pair_values * state.covisit_scale,
                         state.item_keys.size)


def _attributes_moved(prev: ModelState, state: ModelState, delta: Delta) -> np.ndarray:
    """Catalog rows of ``state`` whose attribute part or default row ``delta`` changed: the
    items whose entry changed; with rows of attribute keys the state held moved, every item
    with attributes (an attribute key's items are many: no index of them is kept; a key new
    to the state is only in the entries that came with it); with the default row moved, the
    items without a history row."""
    got, now = delta.attributes, state.attributes
    assert got is not None and now is not None
    rows = [state.catalog_rows(got.item_keys)]
    before = prev.attributes
    if got.keys.size and (before is None or np.isin(got.keys, before.keys).any()):
        rows.append(state.catalog_rows(now.item_keys))
    if before is None or not np.array_equal(before.default_row, now.default_row):
        rows.append(np.flatnonzero(~np.isin(state.item_keys, state.hist_keys)))
    out = np.unique(np.concatenate(rows))
    return out[out >= 0]


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
