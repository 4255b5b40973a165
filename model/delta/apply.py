"""The apply stage: a delta applied to a state, :func:`apply` (pure; numpy only).

A delta with ``seq == 0`` is a *snapshot*: everything of a state, relative to nothing (the
trainer writes one beside every full version; serving starts a lineage from it). A delta
with ``seq = n > 0`` applies to the state of the same ``base_version`` at ``n - 1``:

* ``seq <= state.seq``: applied already, the state is returned unchanged (idempotent);
* ``seq > state.seq + 1``: :class:`DeltaGap`; another ``base_version``: :class:`UnknownBase`.
  Both mean: resync (load the newest full version, replay its deltas).

The session-kNN index is the one part not upserted by key: a snapshot loads it whole, a
delta replays the positives the trainer's index learnt, call by call, on a copy
(``SessionIndex.learned_copy``), which gives the trainer's index exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from model.delta.state import Attributes, Constants, ModelState
from model.delta.wire import Delta, DeltaError
from model.scoring.attributes import parts_of, token_rows
from model.scoring.sessions import SessionIndex
from model.scoring.sorted_keys import find_sorted

_I64 = np.zeros(0, np.int64)


class DeltaGap(DeltaError):
    """A delta whose sequence number is not the next one of the state."""


class UnknownBase(DeltaError):
    """A delta of another base version than the state's."""


def _empty_rows(dim: int) -> np.ndarray:
    return np.zeros((0, dim), np.float32)


def upsert_sorted(
    keys: np.ndarray, values: np.ndarray, new_keys: np.ndarray, new_values: np.ndarray,
    removed: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """A sorted keyed table with ``new_keys`` replaced or added and ``removed`` dropped (new
    arrays; the inputs are left as they are and returned when nothing changes). Linear in
    the table (copies and inserts by binary search) when ``new_keys`` are strictly
    increasing, as deltas send them; sorted otherwise."""
    if not new_keys.size and not removed.size:
        return keys, values
    new_values = np.asarray(new_values, values.dtype)
    if new_keys.size > 1 and not np.all(new_keys[1:] > new_keys[:-1]):
        order = np.argsort(new_keys, kind="stable")
        new_keys, new_values = new_keys[order], new_values[order]
        if not np.all(new_keys[1:] > new_keys[:-1]):
            raise DeltaError("a delta names one key twice")
    k, v = keys, values
    if removed.size and k.size:
        pos = np.minimum(np.searchsorted(k, removed), k.size - 1)
        gone = pos[k[pos] == removed]
        if gone.size:
            k, v = np.delete(k, gone), np.delete(v, gone, axis=0)
    if not new_keys.size:
        return k, v
    pos = np.searchsorted(k, new_keys)
    hit = np.zeros(new_keys.size, bool)
    inside = pos < k.size
    hit[inside] = k[pos[inside]] == new_keys[inside]
    miss = ~hit
    if miss.any():  # one copy: insert the new keys, then overwrite the hits where they moved
        k, v = insert_sorted(k, v, pos[miss], new_keys[miss], new_values[miss])
        if hit.any():
            v[np.searchsorted(k, new_keys[hit])] = new_values[hit]
    elif hit.any():
        v = v.copy() if v is values else v
        v[pos[hit]] = new_values[hit]
    return k, v


def empty_state(constants: Constants, base_version: str, user_dim: int, hist_dim: int) -> ModelState:
    """The state a snapshot applies to."""
    f64 = np.zeros(0, np.float64)
    return ModelState(
        constants=constants, base_version=base_version, seq=-1,
        user_keys=_I64, user_rows=_empty_rows(user_dim),
        default_user_row=np.zeros(user_dim, np.float32), hist_keys=_I64,
        hist_rows=_empty_rows(hist_dim), item_keys=_I64, item_ids=np.zeros(0, np.str_),
        prior_buckets=_I64, prior_base=f64, prior_count=f64, prior_scalars=(0.0, -math.inf, 0.0),
        covisit_keys=_I64, covisit_codes=_I64, covisit_values=f64, covisit_scale=1.0,
        weights=(1.0, 0.0, 0.0, 0.0), layers=(), sessions=constants.session_index(),
        attributes=_no_attributes(constants, hist_dim),
    )


def _no_attributes(constants: Constants, dim: int) -> Attributes | None:
    """The empty attribute parts of a lineage with attribute slots (None: without)."""
    t = constants.attr_tokens
    if not t:
        return None
    return Attributes(keys=_I64, rows=_empty_rows(dim), item_keys=_I64,
                      tokens=np.zeros((0, t), np.int64), weights=np.zeros((0, t), np.float32),
                      default_row=np.zeros(dim, np.float32))


def from_snapshot(snapshot: Delta) -> ModelState:
    """The state of a snapshot (``seq == 0``)."""
    if snapshot.seq != 0 or snapshot.constants is None:
        raise DeltaError(f"not a snapshot: seq {snapshot.seq} of {snapshot.base_version}")
    empty = empty_state(snapshot.constants, snapshot.base_version,
                        snapshot.default_user_row.shape[0], snapshot.hist_rows.shape[1])
    return apply(empty, snapshot)


def apply(state: ModelState, delta: Delta, pause: Callable[[], None] | None = None) -> ModelState:
    """The state after ``delta`` (module doc for the sequence rules); ``state`` is untouched.
    ``pause``: called between the steps (each a few copies of one table), so a caller that
    shares its CPU with requests can yield there (``serving.deltas.Pacer``)."""
    pause = pause or _no_pause
    if delta.base_version != state.base_version:
        raise UnknownBase(f"delta of base {delta.base_version}, state of {state.base_version}")
    if delta.seq <= state.seq:
        return state
    if delta.seq != state.seq + 1:
        raise DeltaGap(f"delta {delta.seq} after {state.seq} of {state.base_version}")
    users = upsert_sorted(state.user_keys, state.user_rows, delta.user_keys, delta.user_rows,
                    delta.removed_users)
    pause()
    hist = upsert_sorted(state.hist_keys, state.hist_rows, delta.hist_keys, delta.hist_rows,
                   delta.removed_hist)
    item_keys, item_ids = state.item_keys, state.item_ids
    removed = bool(delta.removed_items.size)
    if removed:
        keep = ~np.isin(item_keys, delta.removed_items)
        item_keys, item_ids = item_keys[keep], item_ids[keep]
    added = _I64
    if delta.new_item_keys.size:
        # fresh: not in the catalog (found by the state's sorted index, not a scan)
        fresh = (np.isin(delta.new_item_keys, item_keys, invert=True) if removed
                 else state.catalog_rows(delta.new_item_keys) < 0)
        added = delta.new_item_keys[fresh]
        item_keys = np.concatenate([item_keys, added])
        item_ids = np.concatenate([item_ids, delta.new_item_ids[fresh]])
    constants = delta.constants or state.constants
    attributes = _attributes(state, delta, constants)
    # every catalog item keeps a history row or, with attribute slots, attributes: the
    # state's did, so only the items added and the rows and attributes removed can break it
    if attributes is None:
        if added.size and not _all_in(hist[0], added) or (
                delta.removed_hist.size and np.isin(delta.removed_hist, item_keys).any()):
            raise DeltaError(f"delta {delta.seq}: a catalog item has no history row")
    elif added.size or delta.removed_hist.size or delta.attributes.item_keys.size:  # type: ignore[union-attr]
        check = np.union1d(added, np.intersect1d(
            np.union1d(delta.removed_hist, delta.attributes.item_keys),  # type: ignore[union-attr]
            item_keys))
        if not (find_sorted(hist[0], check)[1] | attributes.has(check)).all():
            raise DeltaError(f"delta {delta.seq}: a catalog item has neither a history row "
                             "nor attributes")
    pause()
    prior = upsert_sorted(state.prior_buckets, state.prior_base, delta.prior_buckets,
                    delta.prior_base, _I64)
    count = upsert_sorted(state.prior_buckets, state.prior_count, delta.prior_buckets,
                          delta.prior_count, _I64)
    covisit_keys = state.covisit_keys
    if delta.covisit_new_keys.size:
        if delta.covisit_first_id != covisit_keys.size:
            raise DeltaError(
                f"delta {delta.seq}: co-visitation ids from {delta.covisit_first_id}, "
                f"state has {covisit_keys.size}"
            )
        covisit_keys = np.concatenate([covisit_keys, delta.covisit_new_keys])
    pause()
    codes = upsert_sorted(state.covisit_codes, state.covisit_values, delta.covisit_codes,
                    delta.covisit_values, delta.covisit_removed)
    sessions = _sessions(state, delta, constants)
    pause()
    new = replace(
        state,
        constants=constants,
        seq=delta.seq,
        user_keys=users[0], user_rows=users[1],
        default_user_row=np.asarray(delta.default_user_row, np.float32),
        hist_keys=hist[0], hist_rows=hist[1],
        item_keys=item_keys, item_ids=item_ids,
        prior_buckets=prior[0], prior_base=prior[1], prior_count=count[1],
        prior_scalars=delta.prior_scalars,
        covisit_keys=covisit_keys, covisit_codes=codes[0], covisit_values=codes[1],
        covisit_scale=delta.covisit_scale, weights=delta.weights, layers=delta.layers,
        trained_through_ms=delta.trained_through_ms, offsets=dict(delta.offsets),
        samples_trained=delta.samples_trained,
        created_at=delta.created_at or state.created_at, cold_start=delta.cold_start,
        sessions=sessions,
        sessions_weight=delta.sessions_weight if delta.carries_sessions else state.sessions_weight,
        history_groups=delta.history_groups, item_groups=delta.item_groups,
        attributes=attributes,
    )
    if not removed:
        seed_catalog_index(new, state, added)
    return new


def _attributes(state: ModelState, delta: Delta, constants: Constants) -> Attributes | None:
    """The state's attribute parts after ``delta``: rows and entries upserted by key (an
    entry of weights all 0 removed), the default row replaced."""
    got = delta.attributes
    if not constants.attr_tokens:
        if got is not None:
            raise DeltaError(f"delta {delta.seq}: attributes in a lineage without attribute slots")
        return None
    if got is None:
        raise DeltaError(f"delta {delta.seq}: a lineage with attribute slots needs them in "
                         "every record")
    old = state.attributes or _no_attributes(constants, got.default_row.size)
    assert old is not None
    if got.tokens.shape[1] != constants.attr_tokens:
        raise DeltaError(f"delta {delta.seq}: {got.tokens.shape[1]} attribute keys per item, "
                         f"the lineage has {constants.attr_tokens}")
    keys, rows = upsert_sorted(old.keys, old.rows, got.keys, got.rows, _I64)
    held = (got.weights > 0).any(axis=1)
    gone = got.item_keys[~held]
    items, tokens = upsert_sorted(old.item_keys, old.tokens, got.item_keys[held],
                                  got.tokens[held], gone)
    _, weights = upsert_sorted(old.item_keys, old.weights, got.item_keys[held],
                               got.weights[held], gone)
    new = Attributes(keys=keys, rows=rows, item_keys=items, tokens=tokens, weights=weights,
                     default_row=np.asarray(got.default_row, np.float32))
    known = np.isin(got.keys, old.keys)
    fresh: tuple[np.ndarray, np.ndarray] | None = None
    if "token_rows" in old.__dict__ and known.all():
        # no attribute key added: the entries' positions in the table hold, the changed
        # entries' found (a cached_property of a frozen dataclass: its slot is the
        # instance dict)
        fresh = token_rows(got.tokens[held], got.weights[held], keys)
        new.__dict__["token_rows"] = tuple(
            upsert_sorted(old.item_keys, was, got.item_keys[held], now, gone)[1]
            for was, now in zip(old.token_rows, fresh, strict=True))
    if "item_parts" in old.__dict__ and not known.any():
        # no row an item read moved: the parts carry over, the changed entries' recomputed
        fresh = fresh or token_rows(got.tokens[held], got.weights[held], keys)
        new.__dict__["item_parts"] = upsert_sorted(old.item_keys, old.item_parts,
                                                   got.item_keys[held], parts_of(*fresh, rows),
                                                   gone)[1]
    return new


def _no_pause() -> None:
    """The default ``pause`` of :func:`apply`: none."""


def _sessions(state: ModelState, delta: Delta, constants: Constants) -> SessionIndex | None:
    """The session-kNN index after ``delta``: a snapshot's loaded whole (into a new index of
    the lineage's parameters), then the delta's positives replayed on a copy; ``state``'s
    own index, shared, when the delta has none."""
    index = state.sessions
    if delta.sessions is not None:
        index = constants.session_index()
        if index is None:
            raise DeltaError(f"delta {delta.seq}: a session-kNN index in a lineage without one")
        index.load_arrays(dict(delta.sessions))
    positives = delta.sessions_positives
    if positives is not None and positives[0].size:
        if index is None:
            raise DeltaError(f"delta {delta.seq}: session-kNN positives for a state without "
                             "the index")
        try:
            index = index.learned_copy(*positives)
        except ValueError as exc:
            raise DeltaError(f"delta {delta.seq}: session-kNN positives: {exc}") from exc
    return index


def _all_in(sorted_keys: np.ndarray, keys: np.ndarray) -> bool:
    """Whether every one of ``keys`` is in the sorted array ``sorted_keys``."""
    if not sorted_keys.size:
        return not keys.size
    pos = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    return bool(np.all(sorted_keys[pos] == keys))


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
