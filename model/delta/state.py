"""The served model as deltas build it: :class:`ModelState`, and what it computes.

A state holds what the served score depends on in the form the trainer changes it, so a
delta replaces only what moved (format: ``model/delta/FORMAT.md``): user and history rows by
key and the user tower's dense layers, the catalog in row order, the popularity prior by hash
bucket, the co-visitation pairs relative to the lineage's reference count, and the mix weights.

:func:`compose` turns a state into a :class:`model.artifact.files.ServingArtifact` with the
arithmetic of ``Trainer._scoring_items`` and ``CoVisitation.csr``; :func:`state_checksum`
hashes a state in a canonical order (replicas that applied the same deltas hash equal). Each
part in detail: docs/internals.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from model.artifact.files import ServingArtifact
from model.scoring.prior import served_item_vectors

_LOW = np.int64(0xFFFFFFFF)
Layer = tuple[np.ndarray, np.ndarray, str]


@dataclass(frozen=True)
class Constants:
    """What a lineage (a base and its deltas) never changes."""

    normalize: bool
    score_bias: bool
    temperature: float
    history_len: int | None
    history_decay: float
    #: Hash buckets of the frequency estimate (``key mod buckets``).
    prior_buckets: int
    #: ``base`` of a bucket the state does not hold (never counted).
    prior_default: float
    covisit_window: int | None = None
    covisit_decay: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True, eq=False)
class ModelState:
    """One immutable state; :func:`model.delta.apply` returns a new one (arrays shared
    where nothing changed, never written)."""

    constants: Constants
    base_version: str
    seq: int
    user_keys: np.ndarray
    user_rows: np.ndarray
    default_user_row: np.ndarray
    hist_keys: np.ndarray
    hist_rows: np.ndarray
    item_keys: np.ndarray
    item_ids: np.ndarray
    prior_buckets: np.ndarray
    prior_base: np.ndarray
    #: (shift, floor, log_norm) of the prior.
    prior_scalars: tuple[float, float, float]
    covisit_keys: np.ndarray
    covisit_codes: np.ndarray
    covisit_values: np.ndarray
    covisit_scale: float
    #: (tower, prior, covisit, covisit_last) weights of the score.
    weights: tuple[float, float, float, float]
    layers: tuple[Layer, ...]
    trained_through_ms: int | None = None
    offsets: Mapping[str, int] = field(default_factory=dict)
    samples_trained: int = 0
    created_at: str | None = None

    def prior_base_of(self, keys: np.ndarray) -> np.ndarray:
        """The prior's ``base`` (float64) of item ``keys``: their bucket's, or the default."""
        c = self.constants
        buckets = np.mod(np.asarray(keys, np.int64), np.int64(c.prior_buckets))
        base = np.full(buckets.shape, c.prior_default, np.float64)
        if self.prior_buckets.size:
            pos = np.minimum(np.searchsorted(self.prior_buckets, buckets), self.prior_buckets.size - 1)
            hit = self.prior_buckets[pos] == buckets
            base[hit] = self.prior_base[pos[hit]]
        return base

    def log_q_of_base(self, base: np.ndarray) -> np.ndarray:
        """``log q`` (float32) from ``base`` values (:meth:`prior_base_of`): elementwise, so a
        part of the catalog computes exactly what the whole does."""
        shift, floor, log_norm = self.prior_scalars
        return (np.maximum(base - shift, floor) - log_norm).astype(np.float32)

    def log_q(self, keys: np.ndarray) -> np.ndarray:
        """The prior's ``log q`` of item ``keys`` (float32)."""
        return self.log_q_of_base(self.prior_base_of(keys))

    @cached_property
    def catalog_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(catalog keys sorted, their catalog rows): key -> row by binary search. Derived
        (not a field, so ``replace`` never carries a stale one); ``apply`` seeds the next
        state's from this one's (:func:`seed_catalog_index`), else built on first use."""
        order = np.argsort(self.item_keys, kind="stable")
        return self.item_keys[order], order.astype(np.int64)

    def catalog_rows(self, keys: np.ndarray) -> np.ndarray:
        """Catalog rows of ``keys`` (-1: not in the catalog)."""
        sorted_keys, rows = self.catalog_index
        out = np.full(keys.shape, -1, np.int64)
        if sorted_keys.size and keys.size:
            pos = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
            hit = sorted_keys[pos] == keys
            out[hit] = rows[pos[hit]]
        return out

    def catalog_hist_rows(self, rows: np.ndarray | None = None) -> np.ndarray:
        """History (item table) rows of the catalog's ``rows`` (all: None), in that order."""
        keys = self.item_keys if rows is None else self.item_keys[rows]
        if not keys.size:
            return np.zeros((0, self.hist_rows.shape[1]), np.float32)
        return self.hist_rows[np.searchsorted(self.hist_keys, keys)]

    def item_vectors(self) -> np.ndarray:
        """Scoring vectors of the catalog, in its row order (``Trainer._scoring_items``)."""
        c = self.constants
        log_q = self.log_q(self.item_keys) if c.score_bias else None
        return served_item_vectors(self.catalog_hist_rows(), log_q, normalize=c.normalize,
                                   tower_weight=self.weights[0], prior_weight=self.weights[1],
                                   temperature=c.temperature)

    def covisit_csr(self, pause: Callable[[], None] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pairs among the catalog as CSR arrays over its rows (``CoVisitation.csr``):
        O(pairs log pairs + catalog), the catalog's keys found by :attr:`catalog_index`.
        ``pause``: called once, before the sort (as ``model.delta.apply``'s)."""
        n = self.item_keys.size
        row_of = self.catalog_rows(self.covisit_keys)
        a, b = row_of[self.covisit_codes >> 32], row_of[self.covisit_codes & _LOW]
        keep = (a >= 0) & (b >= 0)
        a, b = a[keep], b[keep]
        w = self.covisit_values[keep] * self.covisit_scale
        if pause is not None:
            pause()
        order = np.argsort(a * np.int64(max(n, 1)) + b, kind="stable")  # by (a, b)
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(a, minlength=n), out=indptr[1:])
        return indptr, b[order].astype(np.int32), w[order].astype(np.float32)

    def artifact_arrays(self) -> dict[str, Any]:
        """The arrays a full version of this state would hold (names of ``write_artifact``)."""
        out: dict[str, Any] = {
            "item_ids": self.item_ids,
            "item_vectors": self.item_vectors(),
            "item_hist_keys": self.hist_keys,
            "item_hist_rows": self.hist_rows,
            "user_keys": self.user_keys,
            "user_rows": self.user_rows,
            "default_user_row": self.default_user_row,
            "layers": list(self.layers),
        }
        if self.constants.covisit_window is not None:
            out["covisit"] = self.covisit_csr()
        return out


def compose(state: ModelState, previous: ServingArtifact | None = None) -> ServingArtifact:
    """The state as a servable artifact (its ``manifest`` names the base version and the
    delta sequence), built from scratch. ``previous``: the artifact of an earlier state of
    the lineage, whose id -> row map is reused when the catalog is the same or only grew.
    ``model.delta.served.Composer`` builds the same artifact per delta from the last one."""
    covisit = state.covisit_csr() if state.constants.covisit_window is not None else None
    return servable(state, state.item_vectors(), covisit, item_index(state.item_ids, previous))


def servable(
    state: ModelState, vectors: np.ndarray,
    covisit: tuple[np.ndarray, np.ndarray, np.ndarray] | None, index: Mapping[str, int],
) -> ServingArtifact:
    """The artifact of ``state`` with its item ``vectors``, CSR pairs and id -> row map
    (computed by the caller: from scratch or patched); the arrays are made read-only."""
    c = state.constants
    for arr in vectors, state.user_rows, state.hist_rows:
        arr.setflags(write=False)
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
    if covisit is not None:
        manifest["covisit"] = {
            "weight": state.weights[2], "last_weight": state.weights[3],
            "window": c.covisit_window, "decay": c.covisit_decay,
        }
    return ServingArtifact(
        path=Path(f"delta:{state.base_version}+{state.seq}"),
        manifest=manifest,
        item_ids=state.item_ids,
        item_vectors=vectors,
        item_hist_keys=state.hist_keys,
        item_hist_rows=state.hist_rows,
        user_keys=state.user_keys,
        user_rows=state.user_rows,
        default_user_row=state.default_user_row,
        layers=state.layers,
        normalize=c.normalize,
        item_index=index,
        covisit=covisit,
    )


def insert_sorted(
    keys: np.ndarray, values: np.ndarray, at: np.ndarray, new_keys: np.ndarray,
    new_values: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``np.insert(keys, at, new_keys)`` and ``np.insert(values, at, new_values, axis=0)``
    for non-decreasing ``at``. Rows of ``values`` (2-D) are copied as the runs between
    insertion points, one slice copy each: ``np.insert`` goes through a boolean mask over
    every row, which costs more (``docs/decisions.md#delta-stream``). A 1-D table keeps
    ``np.insert`` (its mask is cheap; a run per key was slower)."""
    if values.ndim == 1:
        return np.insert(keys, at, new_keys), np.insert(values, at, new_values)
    m, n = at.size, keys.shape[0]
    out_k = np.empty(n + m, keys.dtype)
    out_v = np.empty((n + m, *values.shape[1:]), values.dtype)
    dest = at + np.arange(m, dtype=np.int64)
    out_k[dest], out_v[dest] = new_keys, new_values
    bounds = [0, *at.tolist(), n]
    for i in range(m + 1):
        lo, hi = bounds[i], bounds[i + 1]
        if hi > lo:
            out_k[lo + i:hi + i] = keys[lo:hi]
            out_v[lo + i:hi + i] = values[lo:hi]
    return out_k, out_v


def seed_catalog_index(state: ModelState, previous: ModelState, added: np.ndarray) -> None:
    """Give ``state`` (whose catalog is ``previous``'s with ``added`` keys appended, none
    removed) its :attr:`ModelState.catalog_index` from ``previous``'s: one merge, no sort."""
    if "catalog_index" not in previous.__dict__:
        return  # never used: built on first use instead
    keys, rows = previous.catalog_index
    if added.size:
        order = np.argsort(added, kind="stable")
        at = np.searchsorted(keys, added[order])
        keys, rows = insert_sorted(keys, rows, at, added[order],
                                   previous.item_keys.size + order.astype(np.int64))
    state.__dict__["catalog_index"] = (keys, rows)


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


def state_checksum(state: ModelState) -> str:
    """BLAKE2b-128 of everything the served score reads, in a canonical order (catalog by
    key), so states equal in content hash equal whatever order their items joined in."""
    h = hashlib.blake2b(digest_size=16)
    order = np.argsort(state.item_keys, kind="stable")

    def put(arr: np.ndarray) -> None:
        a = np.ascontiguousarray(arr)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())

    for arr in (state.user_keys, state.user_rows, state.default_user_row, state.hist_keys,
                state.hist_rows, state.item_keys[order], state.item_ids[order],
                state.item_vectors()[order]):
        put(arr)
    for w, b, act in state.layers:
        put(w)
        put(b)
        h.update(act.encode())
    if state.constants.covisit_window is not None:
        # pairs as (key a, key b, weight), sorted: independent of dense ids and row order
        ka = state.covisit_keys[state.covisit_codes >> 32]
        kb = state.covisit_keys[state.covisit_codes & _LOW]
        w = (state.covisit_values * state.covisit_scale).astype(np.float32)
        o = np.lexsort((kb, ka))
        for arr in (ka[o], kb[o], w[o]):
            put(arr)
    h.update(repr(tuple(float(x) for x in state.weights)).encode())
    return h.hexdigest()
