"""A delta (:class:`Delta`), its wire form, and :func:`apply` (pure; numpy only).

A delta with ``seq == 0`` is a *snapshot*: everything of a state, relative to nothing (the
trainer writes one beside every full version; serving starts a lineage from it). A delta
with ``seq = n > 0`` applies to the state of the same ``base_version`` at ``n - 1``:

* ``seq <= state.seq``: applied already, the state is returned unchanged (idempotent);
* ``seq > state.seq + 1``: :class:`DeltaGap`; another ``base_version``: :class:`UnknownBase`.
  Both mean: resync (load the newest full version, replay its deltas).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from model.delta.wire import DeltaError, decode_rows, encode_rows, pack, unpack
from model.delta.state import Constants, Layer, ModelState, insert_sorted, seed_catalog_index

_I64 = np.zeros(0, np.int64)


class DeltaGap(DeltaError):
    """A delta whose sequence number is not the next one of the state."""


class UnknownBase(DeltaError):
    """A delta of another base version than the state's."""


def _empty_rows(dim: int) -> np.ndarray:
    return np.zeros((0, dim), np.float32)


@dataclass(frozen=True, eq=False)
class Delta:
    """What changed in the trainer since the previous delta (see the module doc)."""

    base_version: str
    seq: int
    offsets: Mapping[str, int]
    trained_through_ms: int | None
    samples_trained: int
    user_keys: np.ndarray
    user_rows: np.ndarray
    removed_users: np.ndarray
    default_user_row: np.ndarray
    hist_keys: np.ndarray
    hist_rows: np.ndarray
    removed_hist: np.ndarray
    new_item_keys: np.ndarray
    new_item_ids: np.ndarray
    removed_items: np.ndarray
    prior_buckets: np.ndarray
    prior_base: np.ndarray
    prior_scalars: tuple[float, float, float]
    #: Dense ids ``first ..`` of the co-visitation's new item keys.
    covisit_first_id: int
    covisit_new_keys: np.ndarray
    covisit_codes: np.ndarray
    covisit_values: np.ndarray
    covisit_removed: np.ndarray
    covisit_scale: float
    weights: tuple[float, float, float, float]
    layers: tuple[Layer, ...]
    #: The lineage's constants: snapshots (``seq == 0``) only.
    constants: Constants | None = None
    created_at: str | None = None
    #: The trainer's :func:`state_checksum` of the state this delta leads to ("" = none).
    state_checksum: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rows_changed(self) -> int:
        return int(self.user_keys.size + self.hist_keys.size)


def encode(delta: Delta, codec: str = "float32", *, compress: bool = False) -> bytes:
    """The delta as one record (``model.delta.wire``); user and history rows in ``codec``."""
    meta: dict[str, Any] = {
        "base_version": delta.base_version, "seq": delta.seq, "offsets": dict(delta.offsets),
        "trained_through_ms": delta.trained_through_ms, "samples_trained": delta.samples_trained,
        "prior_scalars": list(delta.prior_scalars), "covisit_first_id": delta.covisit_first_id,
        "covisit_scale": delta.covisit_scale, "weights": list(delta.weights),
        "activations": [act for _, _, act in delta.layers], "codec": codec,
        "constants": delta.constants.to_json() if delta.constants else None,
        "created_at": delta.created_at, "state_checksum": delta.state_checksum,
        "extra": dict(delta.extra),
    }
    arrays: dict[str, np.ndarray] = {}
    for name in ("user", "hist"):
        for part, arr in encode_rows(getattr(delta, f"{name}_rows"), codec).items():
            arrays[f"{name}_rows.{part}"] = arr
    for name in ("user_keys", "removed_users", "default_user_row", "hist_keys", "removed_hist",
                 "new_item_keys", "new_item_ids", "removed_items", "prior_buckets",
                 "prior_base", "covisit_new_keys", "covisit_codes", "covisit_values",
                 "covisit_removed"):
        arrays[name] = getattr(delta, name)
    for i, (w, b, _) in enumerate(delta.layers):
        arrays[f"layer_{i}_w"], arrays[f"layer_{i}_b"] = w, b
    return pack(meta, arrays, compress=compress)


def decode(record: bytes) -> Delta:
    """Inverse of :func:`encode` (checksum verified; rows back in float32)."""
    meta, arrays = unpack(record)
    try:
        codec = meta["codec"]
        rows = {
            name: decode_rows({k.split(".", 1)[1]: v for k, v in arrays.items()
                               if k.startswith(f"{name}_rows.")}, codec)
            for name in ("user", "hist")
        }
        layers = tuple(
            (arrays[f"layer_{i}_w"], arrays[f"layer_{i}_b"], str(act))
            for i, act in enumerate(meta["activations"])
        )
        constants = Constants(**meta["constants"]) if meta.get("constants") else None
        return Delta(
            base_version=str(meta["base_version"]), seq=int(meta["seq"]),
            offsets={str(k): int(v) for k, v in meta["offsets"].items()},
            trained_through_ms=meta["trained_through_ms"],
            samples_trained=int(meta["samples_trained"]),
            user_keys=arrays["user_keys"], user_rows=rows["user"],
            removed_users=arrays["removed_users"], default_user_row=arrays["default_user_row"],
            hist_keys=arrays["hist_keys"], hist_rows=rows["hist"],
            removed_hist=arrays["removed_hist"], new_item_keys=arrays["new_item_keys"],
            new_item_ids=arrays["new_item_ids"], removed_items=arrays["removed_items"],
            prior_buckets=arrays["prior_buckets"], prior_base=arrays["prior_base"],
            prior_scalars=tuple(float(x) for x in meta["prior_scalars"]),  # type: ignore[arg-type]
            covisit_first_id=int(meta["covisit_first_id"]),
            covisit_new_keys=arrays["covisit_new_keys"], covisit_codes=arrays["covisit_codes"],
            covisit_values=arrays["covisit_values"], covisit_removed=arrays["covisit_removed"],
            covisit_scale=float(meta["covisit_scale"]),
            weights=tuple(float(x) for x in meta["weights"]),  # type: ignore[arg-type]
            layers=layers, constants=constants, created_at=meta.get("created_at"),
            state_checksum=str(meta.get("state_checksum", "")), extra=meta.get("extra", {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DeltaError(f"delta record lacks or garbles {exc}") from exc


def peek(record: bytes) -> tuple[str, int]:
    """(base version, seq) of a record, checksum verified, without building the delta."""
    meta, _ = unpack(record)
    return str(meta["base_version"]), int(meta["seq"])


def _upsert(
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
        prior_buckets=_I64, prior_base=f64, prior_scalars=(0.0, -math.inf, 0.0),
        covisit_keys=_I64, covisit_codes=_I64, covisit_values=f64, covisit_scale=1.0,
        weights=(1.0, 0.0, 0.0, 0.0), layers=(),
    )


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
    users = _upsert(state.user_keys, state.user_rows, delta.user_keys, delta.user_rows,
                    delta.removed_users)
    pause()
    hist = _upsert(state.hist_keys, state.hist_rows, delta.hist_keys, delta.hist_rows,
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
    # every catalog item keeps a history row: the state's did, so only the items added and
    # the rows removed can break it
    if added.size and not _all_in(hist[0], added) or (
            delta.removed_hist.size and np.isin(delta.removed_hist, item_keys).any()):
        raise DeltaError(f"delta {delta.seq}: a catalog item has no history row")
    pause()
    prior = _upsert(state.prior_buckets, state.prior_base, delta.prior_buckets,
                    delta.prior_base, _I64)
    covisit_keys = state.covisit_keys
    if delta.covisit_new_keys.size:
        if delta.covisit_first_id != covisit_keys.size:
            raise DeltaError(
                f"delta {delta.seq}: co-visitation ids from {delta.covisit_first_id}, "
                f"state has {covisit_keys.size}"
            )
        covisit_keys = np.concatenate([covisit_keys, delta.covisit_new_keys])
    pause()
    codes = _upsert(state.covisit_codes, state.covisit_values, delta.covisit_codes,
                    delta.covisit_values, delta.covisit_removed)
    new = replace(
        state,
        constants=delta.constants or state.constants,
        seq=delta.seq,
        user_keys=users[0], user_rows=users[1],
        default_user_row=np.asarray(delta.default_user_row, np.float32),
        hist_keys=hist[0], hist_rows=hist[1],
        item_keys=item_keys, item_ids=item_ids,
        prior_buckets=prior[0], prior_base=prior[1], prior_scalars=delta.prior_scalars,
        covisit_keys=covisit_keys, covisit_codes=codes[0], covisit_values=codes[1],
        covisit_scale=delta.covisit_scale, weights=delta.weights, layers=delta.layers,
        trained_through_ms=delta.trained_through_ms, offsets=dict(delta.offsets),
        samples_trained=delta.samples_trained,
        created_at=delta.created_at or state.created_at,
    )
    if not removed:
        seed_catalog_index(new, state, added)
    return new


def _no_pause() -> None:
    """The default ``pause`` of :func:`apply`: none."""


def _all_in(sorted_keys: np.ndarray, keys: np.ndarray) -> bool:
    """Whether every one of ``keys`` is in the sorted array ``sorted_keys``."""
    if not sorted_keys.size:
        return not keys.size
    pos = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    return bool(np.all(sorted_keys[pos] == keys))
