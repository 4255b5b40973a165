"""Tables keyed by sorted int64 keys (numpy only): a lookup and an addition by binary search,
the one implementation of both that the co-visitation state, the live evaluation's counts and
a version's key tables use."""

from __future__ import annotations

import numpy as np


def find_sorted(table: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(pos, found)``: where each of ``keys`` sits in the ascending ``table`` (clipped to
    its last position) and whether it is there."""
    keys = np.asarray(keys)
    if table.size == 0:
        return np.zeros(keys.shape, np.int64), np.zeros(keys.shape, bool)
    pos = np.minimum(np.searchsorted(table, keys), table.size - 1)
    return pos, table[pos] == keys


def add_sorted(
    keys: np.ndarray, values: np.ndarray, new_keys: np.ndarray, new_values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``keys``/``values`` (keys ascending, distinct) with ``new_values`` added at
    ``new_keys`` (ascending, distinct): the values of keys already there in place, the new
    keys inserted in order (new arrays then)."""
    pos = np.asarray(np.searchsorted(keys, new_keys), np.int64)
    hit: np.ndarray = pos < keys.size
    hit[hit] = keys[pos[hit]] == new_keys[hit]
    values[pos[hit]] += new_values[hit]
    miss = ~hit
    if miss.any():
        keys = np.insert(keys, pos[miss], new_keys[miss])
        values = np.insert(values, pos[miss], new_values[miss])
    return keys, values


class DenseIds:
    """Dense ids (0, 1, ... in order of addition; the keys new in one :meth:`ids` call in key
    order) of int64 keys, with the keys ascending beside them for lookups."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.int64)  # dense id -> key
        self._sorted = np.zeros(0, np.int64)  # the keys, ascending
        self._sorted_ids = np.zeros(0, np.int64)  # dense id of each sorted key

    def ids(self, keys: np.ndarray, add: bool = False) -> np.ndarray:
        """Dense ids of ``keys`` (any shape; -1 for an unknown key unless ``add``)."""
        keys = np.asarray(keys, np.int64)
        flat = keys.reshape(-1)
        ids = np.full(flat.size, -1, np.int64)
        pos, found = find_sorted(self._sorted, flat)
        ids[found] = self._sorted_ids[pos[found]]
        if add and (ids < 0).any():
            new_keys = np.unique(flat[ids < 0])
            start = self.keys.size
            new_ids = np.arange(start, start + new_keys.size, dtype=np.int64)
            self.keys = np.concatenate([self.keys, new_keys])
            at = np.searchsorted(self._sorted, new_keys)
            self._sorted = np.insert(self._sorted, at, new_keys)
            self._sorted_ids = np.insert(self._sorted_ids, at, new_ids)
            miss = ids < 0
            ids[miss] = new_ids[np.searchsorted(new_keys, flat[miss])]
        return ids.reshape(keys.shape)

    def load(self, keys: np.ndarray) -> None:
        """Replace the ids: ``keys[i]`` (distinct) gets id ``i``."""
        self.keys = np.asarray(keys, np.int64)
        order = np.argsort(self.keys, kind="stable")
        self._sorted, self._sorted_ids = self.keys[order], order.astype(np.int64)

    def copy(self) -> DenseIds:
        """A copy sharing the arrays (:meth:`ids` replaces them, never writes them)."""
        out = DenseIds()
        out.keys, out._sorted, out._sorted_ids = self.keys, self._sorted, self._sorted_ids
        return out
