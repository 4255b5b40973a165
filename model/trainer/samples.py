"""Decoding ``samples`` records into training batches.

Wire format (docs/design.md, "Wire formats"): UTF-8 JSON ``{"sample_id": str, "user_id": str,
"item_id": str, "event_type": str, "weight": float, "ts": int ms, "history": [item_id, ...]}``.
A record that does not match raises :class:`SampleError` with the reason (the trainer sends
it to the dead-letter topic and keeps going). Samples are :class:`feature_store.features.Sample`,
the type the feature job writes.

The trainer's fetch thread decodes whole polls at once with :func:`decode_columns` (columns
of plain values, validated with C-level set/contains probes, no per-sample objects); it
accepts and rejects exactly what :func:`decode_sample` does, and names the same reasons.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import orjson

from feature_store.features import Sample
from model.errors import ModelError
from model.trainer.dedupe import id_hashes
from streamrec.ids import item_key, user_key


@dataclass(frozen=True)
class Batch:
    """One training batch as numpy arrays (history: item keys, 0-padded, [B, L])."""

    user_keys: np.ndarray
    item_keys: np.ndarray
    history: np.ndarray
    weights: np.ndarray
    #: Event times (epoch ms) of the rows, when the batch came from the samples topic.
    times: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.item_keys.shape[0])

    def rows(self, sl: slice | np.ndarray) -> Batch:
        return Batch(self.user_keys[sl], self.item_keys[sl], self.history[sl], self.weights[sl],
                     None if self.times is None else self.times[sl])


class SampleError(ModelError, ValueError):
    """A ``samples`` record that cannot be trained on (also a ``ValueError``, as before)."""


def _str(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise SampleError(f"{name}: expected a non-empty string")
    return value


_STR_ONLY = {str}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def decode_sample(raw: bytes | str | None) -> Sample:
    """Parse and validate one record value."""
    if raw is None:
        raise SampleError("not JSON: the record has no value")
    try:
        obj = orjson.loads(raw)
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise SampleError(f"not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise SampleError("not a JSON object")
    weight = obj.get("weight")
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
        raise SampleError("weight: expected a finite number")
    if weight <= 0:
        raise SampleError("weight: must be > 0 for a training sample")
    ts = obj.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, int):
        raise SampleError("ts: expected an integer (epoch ms)")
    if not _INT64_MIN <= ts <= _INT64_MAX:
        raise SampleError("ts: out of the int64 range")
    history = obj.get("history", [])
    # JSON decoding yields exact types, so ``type(...) is str`` is the isinstance check; the
    # set of element types and the "" probe run in C (this is the per-sample hot path).
    if not isinstance(history, list) or (
        history and (set(map(type, history)) != _STR_ONLY or "" in history)
    ):
        raise SampleError("history: expected a list of item ids")
    return Sample(
        sample_id=_str(obj, "sample_id"),
        user_id=_str(obj, "user_id"),
        item_id=_str(obj, "item_id"),
        event_type=_str(obj, "event_type"),
        weight=float(weight),
        ts_ms=ts,
        history=tuple(history),
    )


def encode_sample(sample: Sample) -> bytes:
    """The wire value of ``sample`` (the inverse of :func:`decode_sample`)."""
    return sample.to_json().encode()


class _Memo(dict[str, int]):
    """``key_fn(id)`` memoised: a hit is one C-level dict probe (``map(memo.__getitem__, ids)``
    never enters Python for cached ids); a miss computes and stores the key."""

    def __init__(self, key_fn: Callable[[str], int]) -> None:
        super().__init__()
        self.key_fn = key_fn

    def __missing__(self, external_id: str) -> int:
        key = self[external_id] = self.key_fn(external_id)
        return key


class KeyCache:
    """Memoised ``ids.item_key`` / ``ids.user_key`` (hashing dominates decoding otherwise).

    Bounded: a memo that grows past ``max_size`` ids is emptied before its next use (the
    mapping itself is fixed, so forgetting only costs re-hashing)."""

    def __init__(self, max_size: int = 2_000_000) -> None:
        self.max_size = max_size
        self._items = _Memo(item_key)
        self._users = _Memo(user_key)

    def _bounded(self, memo: _Memo) -> _Memo:
        if len(memo) >= self.max_size:
            memo.clear()
        return memo

    def item(self, item_id: str) -> int:
        return self._bounded(self._items)[item_id]

    def items(self, item_ids: Sequence[str]) -> np.ndarray:
        """Keys of many items as an int64 array (one C-level dict probe per cached id)."""
        memo = self._bounded(self._items)
        return np.fromiter(map(memo.__getitem__, item_ids), np.int64, len(item_ids))

    def user(self, user_id: str) -> int:
        return self._bounded(self._users)[user_id]

    def users(self, user_ids: Sequence[str]) -> np.ndarray:
        """Keys of many users as an int64 array."""
        memo = self._bounded(self._users)
        return np.fromiter(map(memo.__getitem__, user_ids), np.int64, len(user_ids))


_HISTORY = attrgetter("history")


def to_batch(samples: Sequence[Sample], history_len: int, keys: KeyCache | None = None) -> Batch:
    """Stack samples into a :class:`Batch` (history truncated to ``history_len``, 0-padded)."""
    return batch_from_columns(
        [s.user_id for s in samples],
        [s.item_id for s in samples],
        list(map(_HISTORY, samples)),
        np.fromiter((s.weight for s in samples), np.float32, len(samples)),
        history_len,
        keys,
    )


def batch_from_columns(
    user_ids: Sequence[str],
    item_ids: Sequence[str],
    histories: Sequence[Sequence[str]],
    weights: np.ndarray,
    history_len: int,
    keys: KeyCache | None = None,
    times: np.ndarray | None = None,
) -> Batch:
    """:func:`to_batch` of samples given column-wise (as :class:`Columns` holds them);
    ``times``: their event times."""
    keys = keys or KeyCache()
    n = len(item_ids)
    width = max(history_len, 1)
    hists = histories
    lens = np.fromiter(map(len, hists), np.int64, n)
    if n and int(lens.max()) > history_len:
        hists = [h[:history_len] for h in hists]
        lens = np.minimum(lens, history_len)
    hist = np.zeros((n, width), np.int64)
    total = int(lens.sum()) if n else 0
    if total:
        # Row-major boolean-mask assignment fills each row's first len(h) cells in order.
        mask = np.arange(width) < lens[:, None]
        hist[mask] = keys.items(list(chain.from_iterable(hists)))
    return Batch(
        user_keys=keys.users(user_ids),
        item_keys=keys.items(item_ids),
        history=hist,
        weights=np.asarray(weights, np.float32),
        times=times,
    )


@dataclass
class Columns:
    """Decoded samples column-wise, in record order (see :func:`decode_columns`)."""

    sample_ids: list[str] = field(default_factory=list)
    user_ids: list[str] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    ts_ms: list[int] = field(default_factory=list)
    histories: list[list[str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sample_ids)

    def extend(self, other: Columns) -> None:
        self.sample_ids += other.sample_ids
        self.user_ids += other.user_ids
        self.item_ids += other.item_ids
        self.weights += other.weights
        self.ts_ms += other.ts_ms
        self.histories += other.histories

    def split(self, n: int) -> Columns:
        """Remove and return the first ``n`` samples."""
        head = Columns(self.sample_ids[:n], self.user_ids[:n], self.item_ids[:n],
                       self.weights[:n], self.ts_ms[:n], self.histories[:n])
        del self.sample_ids[:n], self.user_ids[:n], self.item_ids[:n]
        del self.weights[:n], self.ts_ms[:n], self.histories[:n]
        return head

    def append(self, sample: Sample) -> None:
        self.sample_ids.append(sample.sample_id)
        self.user_ids.append(sample.user_id)
        self.item_ids.append(sample.item_id)
        self.weights.append(sample.weight)
        self.ts_ms.append(sample.ts_ms)
        self.histories.append(list(sample.history))


class _Wire(msgspec.Struct):
    """The types :func:`decode_sample` requires of a sample, for the column path's decoder
    (``msgspec`` checks them while it parses; the other rules are checked on the columns)."""

    sample_id: str
    user_id: str
    item_id: str
    event_type: str
    weight: float  # a JSON int is taken as a float, a bool is refused (as decode_sample)
    ts: int
    history: list[str] = []


_decode_wire: Callable[[Any], _Wire] = msgspec.json.Decoder(_Wire).decode
_STRING_FIELDS = ("sample_id", "user_id", "item_id", "event_type")
_STRING_GETTERS = tuple(map(attrgetter, _STRING_FIELDS))
_WEIGHT, _TS = attrgetter("weight"), attrgetter("ts")


def _fast_columns(values: Sequence[bytes | str | None]) -> Columns | None:
    """All records as columns if every one of them decodes, else None (the caller then
    decodes record by record, :func:`decode_sample` giving the reasons). The types are
    checked by the typed decoder; the values (non-empty ids, a finite positive weight, an
    int64 time, non-empty history ids) over whole columns with C-level loops (why a typed
    decoder: docs/decisions.md#trainer-loop)."""
    try:
        objs = list(map(_decode_wire, values))
    except (msgspec.DecodeError, TypeError):  # TypeError: a record without a value
        return None
    cols = [list(map(get, objs)) for get in _STRING_GETTERS]
    if not all(map(all, cols)):  # an empty id
        return None
    w = np.fromiter(map(_WEIGHT, objs), np.float64, len(objs))
    if not (np.isfinite(w).all() and (w > 0).all()):
        return None
    ts = list(map(_TS, objs))
    if min(ts) < _INT64_MIN or max(ts) > _INT64_MAX:
        return None
    hists = list(map(_HISTORY, objs))
    if not all(chain.from_iterable(hists)):  # an empty history id
        return None
    return Columns(cols[0], cols[1], cols[2], w.tolist(), ts, hists)


def decode_columns(values: Sequence[bytes | str | None]) -> tuple[Columns, list[tuple[int, str]]]:
    """Decode many record values: (the trainable samples as columns in record order, the
    (index into ``values``, reason) of each record that does not decode)."""
    if not values:
        return Columns(), []
    fast = _fast_columns(values)
    if fast is not None:
        return fast, []
    cols, rejected = Columns(), []
    for i, raw in enumerate(values):
        try:
            cols.append(decode_sample(raw))
        except SampleError as exc:
            rejected.append((i, str(exc)))
    return cols, rejected


def digest_of_hashes(hashes: np.ndarray) -> int:
    """:func:`sample_digest` of ids given by their ``model.trainer.dedupe.id_hashes`` (the same
    64-bit BLAKE2b values, read unsigned; the uint64 sum wraps modulo 2**64)."""
    return int(np.asarray(hashes, np.int64).view(np.uint64).sum(dtype=np.uint64))


def sample_digest(sample_ids: Sequence[str]) -> int:
    """Order-independent digest of a set of sample ids (sum of 64-bit hashes mod 2**64).

    Training each sample exactly once gives the digest of the produced ids; a duplicate or
    a skipped sample changes it.
    """
    return digest_of_hashes(id_hashes(sample_ids))
