"""A set of 64-bit id hashes that never forgets, at 8 bytes per id (:class:`IdSet`).

Used wherever "was this id seen, ever?" must be exact over unbounded logs: the trainer's
trained sample ids (``model.trainer.dedupe``) and the replay ledger of delivered event ids
(``stream.replay.ledger``). Ids are hashed with :func:`id_hash` (blake2b, 64 bits); two ids
share a hash with probability about ``n**2 / 2**65`` (3e-8 at a million ids).

Layout: the hashes in a sorted ``int64`` array plus a small set of the newest ones, merged
into the array when the set grows past an eighth of it (a linear merge of two sorted runs;
amortised O(log n) per id), with a Bloom filter of the array in front (16 bits per id, 3
probes: about 1% of absent ids need the binary search).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def id_hash(id_: str) -> int:
    return int.from_bytes(hashlib.blake2b(id_.encode(), digest_size=8).digest(), "little",
                          signed=True)


def id_hashes(ids: Sequence[str]) -> np.ndarray:
    """:func:`id_hash` of each id as an int64 array."""
    blake2b = hashlib.blake2b
    raw = b"".join([blake2b(sid.encode(), digest_size=8).digest() for sid in ids])
    return np.frombuffer(raw, dtype="<i8").astype(np.int64, copy=True)


#: The newest ids stay in a set until it holds this many (or an eighth of the array).
MERGE_AT = 1 << 16


class IdSet:
    """A set of 64-bit id hashes that never forgets (module doc)."""

    def __init__(self) -> None:
        self._base = np.zeros(0, np.int64)  # sorted, unique
        self._recent: set[int] = set()
        self._recent_parts: list[np.ndarray] = []  # the same ids, as arrays
        self._bloom = _Bloom(0)  # of the ids in ``_base``

    def __len__(self) -> int:
        return int(self._base.shape[0]) + len(self._recent)

    def admit(self, ids: Sequence[str]) -> np.ndarray:
        """Boolean mask: True for ids not seen before (including earlier in this call);
        those are remembered."""
        return self.admit_hashes(id_hashes(ids))

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """Boolean mask: True for the hashes in the set (nothing is added)."""
        hashes = np.asarray(hashes, dtype=np.int64)
        found = np.zeros(len(hashes), dtype=bool)
        maybe = np.flatnonzero(self._bloom.maybe(hashes))
        if len(maybe):
            found[maybe] = _in_sorted(hashes[maybe], self._base)
        if self._recent:
            found |= np.fromiter((h in self._recent for h in hashes.tolist()), bool, len(hashes))
        return found

    def admit_hashes(self, hashes: np.ndarray) -> np.ndarray:
        """:meth:`admit` for ids given by their :func:`id_hashes`."""
        hashes = np.asarray(hashes, dtype=np.int64)
        keep = np.ones(len(hashes), dtype=bool)
        maybe = np.flatnonzero(self._bloom.maybe(hashes))
        if len(maybe):
            keep[maybe] = ~_in_sorted(hashes[maybe], self._base)
        # first occurrence within the call only
        _, first = np.unique(hashes, return_index=True)
        once = np.zeros(len(hashes), dtype=bool)
        once[first] = True
        keep &= once
        recent = self._recent
        idx = np.flatnonzero(keep)
        candidates = hashes[idx].tolist()
        if recent and not recent.isdisjoint(candidates):
            seen = [i for i, h in zip(idx.tolist(), candidates, strict=True) if h in recent]
            keep[seen] = False
            candidates = hashes[keep].tolist()
        recent.update(candidates)
        self._recent_parts.append(hashes[keep])
        if len(recent) >= max(MERGE_AT, self._base.shape[0] // 8):
            self._merge()
        return keep

    def _merge(self) -> None:
        if self._recent:
            added = np.sort(np.concatenate(self._recent_parts))
            # two sorted runs, disjoint (only ids not in the array were admitted): the stable
            # sort (timsort) merges them in linear time
            self._base = np.sort(np.concatenate([self._base, added]), kind="stable")
            self._recent.clear()
            self._recent_parts.clear()
            if self._bloom.full(len(self._base)):
                self._bloom = _Bloom(len(self._base))
                self._bloom.add(self._base)
            else:
                self._bloom.add(added)

    def to_array(self) -> np.ndarray:
        """Every hash, sorted (what the checkpoint saves)."""
        self._merge()
        return self._base.copy()

    @classmethod
    def from_array(cls, hashes: np.ndarray) -> IdSet:
        out = cls()
        out._base = np.unique(np.asarray(hashes, dtype=np.int64))
        out._bloom = _Bloom(len(out._base))
        out._bloom.add(out._base)
        return out


class _Bloom:
    """A Bloom filter of 64-bit hashes: 16 bits per expected id (at least 2**20), 3 probes
    taken from disjoint bit ranges of the (already uniform) hash."""

    def __init__(self, n: int) -> None:
        bits = 1 << max(20, (max(n, 1) * 32 - 1).bit_length())  # 16 bits per id at 2n
        self._mask = bits - 1
        self._capacity = bits // 16
        self._bits = np.zeros(bits // 8, dtype=np.uint8)

    def full(self, n: int) -> bool:
        return n > self._capacity

    def _probes(self, hashes: np.ndarray) -> list[np.ndarray]:
        u = hashes.view(np.uint64)
        return [((u >> np.uint64(shift)) & np.uint64(self._mask)).astype(np.int64)
                for shift in (0, 21, 42)]

    def add(self, hashes: np.ndarray) -> None:
        for idx in self._probes(hashes):
            idx = np.unique(idx)  # sorted: the bits of one byte are adjacent
            byte = idx >> 3
            starts = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
            masks = np.left_shift(1, idx & 7).astype(np.uint8)
            self._bits[byte[starts]] |= np.bitwise_or.reduceat(masks, starts)

    def maybe(self, hashes: np.ndarray) -> np.ndarray:
        """False where a hash was certainly never added."""
        out = np.ones(len(hashes), dtype=bool)
        for idx in self._probes(hashes):
            out &= (self._bits[idx >> 3] >> (idx & 7).astype(np.uint8)) & 1 == 1
        return out


def _in_sorted(values: np.ndarray, sorted_unique: np.ndarray) -> np.ndarray:
    """Membership of each of ``values`` in ``sorted_unique`` (binary search, vectorised)."""
    if sorted_unique.shape[0] == 0:
        return np.zeros(len(values), dtype=bool)
    pos = np.searchsorted(sorted_unique, values)
    pos[pos == sorted_unique.shape[0]] = 0
    return sorted_unique[pos] == values
