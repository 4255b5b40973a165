"""The trainer's memory of recently trained sample ids."""

from __future__ import annotations

import numpy as np

from model.trainer.dedupe import RecentIds


def test_repeats_are_dropped_within_and_across_calls() -> None:
    seen = RecentIds()
    assert seen.admit(["a", "b", "a"]).tolist() == [True, True, False]
    assert seen.admit(["c", "b"]).tolist() == [True, False]
    assert len(seen) == 3


def test_capacity_forgets_the_oldest() -> None:
    seen = RecentIds(capacity=2)
    seen.admit(["a", "b", "c"])
    assert seen.admit(["a"]).tolist() == [True]  # "a" fell out of the horizon
    assert seen.admit(["c"]).tolist() == [False]


def test_round_trip_through_an_array_keeps_order_and_capacity() -> None:
    seen = RecentIds(capacity=3)
    seen.admit(["a", "b", "c", "d"])
    again = RecentIds.from_array(seen.to_array(), capacity=3)
    assert again.to_array().dtype == np.int64
    assert again.admit(["b", "c", "d", "a"]).tolist() == [False, False, False, True]


def test_chunks_with_and_without_repeats_agree_with_one_id_at_a_time() -> None:
    rng = np.random.default_rng(4)
    chunked, single = RecentIds(capacity=50), RecentIds(capacity=50)
    for _ in range(200):
        # mostly fresh chunks (the fast path), sometimes with old or repeated ids
        low = 0 if rng.random() < 0.3 else 10_000
        ids = [str(i) for i in rng.integers(low, 10**9 if low else 120, rng.integers(1, 30))]
        got = chunked.admit(ids).tolist()
        want = [bool(single.admit([i])[0]) for i in ids]
        assert got == want
        assert chunked.to_array().tolist() == single.to_array().tolist()
