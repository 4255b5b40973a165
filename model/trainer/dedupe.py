"""Drop training samples whose ``sample_id`` was already trained.

The Flink feature job writes samples to Kafka at least once: after it restarts from a
checkpoint it emits again the samples of events it had processed after that checkpoint
(same ``sample_id`` = the event's ``event_id``). The trainer remembers the ids it trained
recently and skips a repeat, so each sample is learned once. The memory is a FIFO of the
64-bit hashes of the last ``capacity`` ids, saved in the trainer checkpoint with the model and
offsets; re-emitted samples arrive within one Flink checkpoint interval of the originals,
far inside that horizon.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence

import numpy as np


def id_hash(sample_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(sample_id.encode(), digest_size=8).digest(), "little",
                          signed=True)


def id_hashes(sample_ids: Sequence[str]) -> np.ndarray:
    """:func:`id_hash` of each id as an int64 array (the fetch thread computes them once per
    sample; ``admit_hashes`` and ``model.trainer.samples.digest_of_hashes`` both read them)."""
    blake2b = hashlib.blake2b
    raw = b"".join([blake2b(sid.encode(), digest_size=8).digest() for sid in sample_ids])
    return np.frombuffer(raw, dtype="<i8").astype(np.int64, copy=True)


class RecentIds:
    def __init__(self, capacity: int = 500_000) -> None:
        self.capacity = capacity
        self._order: deque[int] = deque()
        self._set: set[int] = set()

    def __len__(self) -> int:
        return len(self._order)

    def admit(self, sample_ids: Sequence[str]) -> np.ndarray:
        """Boolean mask: True for ids not seen before (including earlier in this call);
        those are remembered."""
        return self.admit_hashes(id_hashes(sample_ids))

    def admit_hashes(self, hashes: np.ndarray) -> np.ndarray:
        """:meth:`admit` for ids given by their :func:`id_hashes`."""
        values = hashes.tolist()
        keep = np.ones(len(values), dtype=bool)
        if self._set.isdisjoint(values) and len(set(values)) == len(values):
            # the usual chunk: nothing seen before, no repeats (set operations run in C)
            self._set.update(values)
            self._order.extend(values)
            while len(self._order) > self.capacity:
                self._set.discard(self._order.popleft())
            return keep
        for i, h in enumerate(values):
            if h in self._set:
                keep[i] = False
                continue
            self._set.add(h)
            self._order.append(h)
            if len(self._order) > self.capacity:
                self._set.discard(self._order.popleft())
        return keep

    def to_array(self) -> np.ndarray:
        return np.fromiter(self._order, dtype=np.int64, count=len(self._order))

    @classmethod
    def from_array(cls, hashes: np.ndarray, capacity: int = 500_000) -> RecentIds:
        out = cls(capacity)
        for h in hashes.tolist()[-capacity:]:
            if h not in out._set:
                out._set.add(h)
                out._order.append(h)
        return out
