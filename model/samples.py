"""Decoding ``samples`` records into training batches.

Wire format (DESIGN.md / README): UTF-8 JSON ``{"sample_id": str, "user_id": str,
"item_id": str, "event_type": str, "weight": float, "ts": int ms, "history": [item_id, ...]}``.
A record that does not match raises :class:`SampleError` with the reason (the trainer sends
it to the dead-letter topic and keeps going). Samples are :class:`feature_store.features.Sample`,
the type the feature job writes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from feature_store.features import Sample
from feature_store.ids import item_key, user_key


@dataclass(frozen=True)
class Batch:
    """One training batch as numpy arrays (history: item keys, 0-padded, [B, L])."""

    user_keys: np.ndarray
    item_keys: np.ndarray
    history: np.ndarray
    weights: np.ndarray

    def __len__(self) -> int:
        return int(self.item_keys.shape[0])

    def rows(self, sl: slice) -> Batch:
        return Batch(self.user_keys[sl], self.item_keys[sl], self.history[sl], self.weights[sl])


class SampleError(ValueError):
    """A ``samples`` record that cannot be trained on."""


def _str(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise SampleError(f"{name}: expected a non-empty string")
    return value


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
    if not isinstance(history, list) or not all(isinstance(h, str) and h for h in history):
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


class KeyCache:
    """Memoised ``ids.item_key`` / ``ids.user_key`` (hashing dominates decoding otherwise)."""

    def __init__(self, max_size: int = 2_000_000) -> None:
        self.max_size = max_size
        self._items: dict[str, int] = {}
        self._users: dict[str, int] = {}

    def item(self, item_id: str) -> int:
        key = self._items.get(item_id)
        if key is None:
            if len(self._items) >= self.max_size:
                self._items.clear()
            key = self._items[item_id] = item_key(item_id)
        return key

    def items(self, item_ids: Sequence[str]) -> np.ndarray:
        """Keys of many items as an int64 array (one dict probe per id when cached)."""
        get = self._items.get
        found = [get(x) for x in item_ids]
        if None in found:
            found = [k if k is not None else self.item(x) for k, x in zip(found, item_ids, strict=True)]
        return np.array(found, dtype=np.int64)

    def user(self, user_id: str) -> int:
        key = self._users.get(user_id)
        if key is None:
            if len(self._users) >= self.max_size:
                self._users.clear()
            key = self._users[user_id] = user_key(user_id)
        return key


def to_batch(samples: Sequence[Sample], history_len: int, keys: KeyCache | None = None) -> Batch:
    """Stack samples into a :class:`Batch` (history truncated to ``history_len``, 0-padded)."""
    keys = keys or KeyCache()
    n = len(samples)
    width = max(history_len, 1)
    flat: list[str] = []
    lens = np.zeros(n, np.int64)
    for i, s in enumerate(samples):
        h = s.history[:history_len]
        flat.extend(h)
        lens[i] = len(h)
    hist = np.zeros((n, width), np.int64)
    if flat:
        rows = np.repeat(np.arange(n), lens)
        starts = np.cumsum(lens) - lens
        cols = np.arange(len(flat)) - np.repeat(starts, lens)
        hist[rows, cols] = keys.items(flat)
    return Batch(
        user_keys=np.fromiter((keys.user(s.user_id) for s in samples), np.int64, n),
        item_keys=keys.items([s.item_id for s in samples]),
        history=hist,
        weights=np.fromiter((s.weight for s in samples), np.float32, n),
    )


def sample_digest(sample_ids: Sequence[str]) -> int:
    """Order-independent digest of a set of sample ids (sum of 64-bit hashes mod 2**64).

    Training each sample exactly once gives the digest of the produced ids; a duplicate or
    a skipped sample changes it.
    """
    total = 0
    for sid in sample_ids:
        total += int.from_bytes(hashlib.blake2b(sid.encode(), digest_size=8).digest(), "little")
    return total % (1 << 64)
