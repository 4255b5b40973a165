"""Decoding ``samples`` records into training batches.

Wire format (DESIGN.md / README): UTF-8 JSON ``{"sample_id": str, "user_id": str,
"item_id": str, "event_type": str, "weight": float, "ts": int ms, "history": [item_id, ...]}``.
A record that does not match raises :class:`SampleError` with the reason (the trainer sends
it to the dead-letter topic and keeps going). Samples are :class:`feature_store.features.Sample`,
the type the feature job writes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np
import orjson

from feature_store.features import Sample
from feature_store.ids import item_key, user_key
from model.dedupe import id_hashes


@dataclass(frozen=True)
class Batch:
    """One training batch as numpy arrays (history: item keys, 0-padded, [B, L])."""

    user_keys: np.ndarray
    item_keys: np.ndarray
    history: np.ndarray
    weights: np.ndarray

    def __len__(self) -> int:
        return int(self.item_keys.shape[0])

    def rows(self, sl: slice | np.ndarray) -> Batch:
        return Batch(self.user_keys[sl], self.item_keys[sl], self.history[sl], self.weights[sl])


class SampleError(ValueError):
    """A ``samples`` record that cannot be trained on."""


def _str(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise SampleError(f"{name}: expected a non-empty string")
    return value


_STR_ONLY = {str}


def decode_sample(raw: bytes | str) -> Sample:
    """Parse and validate one record value."""
    try:
        obj = orjson.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
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
    keys = keys or KeyCache()
    n = len(samples)
    width = max(history_len, 1)
    hists = list(map(_HISTORY, samples))
    lens = np.fromiter(map(len, hists), np.int64, n)
    if n and int(lens.max()) > history_len:
        hists = [h[:history_len] for h in hists]
        lens = np.minimum(lens, history_len)
    hist = np.zeros((n, width), np.int64)
    total = int(lens.sum())
    if total:
        # Row-major boolean-mask assignment fills each row's first len(h) cells in order.
        mask = np.arange(width) < lens[:, None]
        hist[mask] = keys.items(list(chain.from_iterable(hists)))
    return Batch(
        user_keys=keys.users([s.user_id for s in samples]),
        item_keys=keys.items([s.item_id for s in samples]),
        history=hist,
        weights=np.fromiter((s.weight for s in samples), np.float32, n),
    )


def digest_of_hashes(hashes: np.ndarray) -> int:
    """:func:`sample_digest` of ids given by their ``model.dedupe.id_hashes`` (the same
    64-bit BLAKE2b values, read unsigned; the uint64 sum wraps modulo 2**64)."""
    return int(np.asarray(hashes, np.int64).view(np.uint64).sum(dtype=np.uint64))


def sample_digest(sample_ids: Sequence[str]) -> int:
    """Order-independent digest of a set of sample ids (sum of 64-bit hashes mod 2**64).

    Training each sample exactly once gives the digest of the produced ids; a duplicate or
    a skipped sample changes it.
    """
    return digest_of_hashes(id_hashes(sample_ids))
