"""Sorted key tables: lookups and additions equal a plain dict's."""

from __future__ import annotations

import numpy as np

from model.scoring.sorted_keys import add_sorted, find_sorted


def test_additions_and_lookups_equal_a_dict() -> None:
    rng = np.random.default_rng(3)
    keys, values = np.zeros(0, np.int64), np.zeros(0, np.int64)
    ref: dict[int, int] = {}
    for _ in range(20):
        new = np.unique(rng.integers(-50, 50, rng.integers(0, 12)))
        counts = rng.integers(1, 5, new.size)
        keys, values = add_sorted(keys, values, new, counts)
        for k, c in zip(new.tolist(), counts.tolist(), strict=True):
            ref[k] = ref.get(k, 0) + c
        assert keys.tolist() == sorted(ref) and values.tolist() == [ref[k] for k in sorted(ref)]
    probe = np.arange(-60, 60)
    pos, found = find_sorted(keys, probe)
    assert found.tolist() == [int(k) in ref for k in probe]
    assert values[pos[found]].tolist() == [ref[int(k)] for k in probe[found]]


def test_an_empty_table_finds_nothing() -> None:
    pos, found = find_sorted(np.zeros(0, np.int64), np.array([[1, 2], [3, 4]]))
    assert pos.shape == found.shape == (2, 2) and not found.any()
