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
