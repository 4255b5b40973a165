"""The trainer's memory of every trained sample id (``streamrec.idset.IdSet``)."""

from __future__ import annotations

import numpy as np

from model.trainer.dedupe import TrainedIds, id_hashes
from streamrec import idset


def test_repeats_are_dropped_within_and_across_calls() -> None:
    seen = TrainedIds()
    assert seen.admit(["a", "b", "a"]).tolist() == [True, True, False]
    assert seen.admit(["c", "b"]).tolist() == [True, False]
    assert len(seen) == 3


def test_nothing_is_forgotten_past_any_horizon(monkeypatch: object) -> None:
    """The old FIFO forgot an id after 500,000 newer ones; a replayed log is older than that."""
    monkeypatch.setattr(idset, "MERGE_AT", 1000)  # type: ignore[attr-defined]
    seen = TrainedIds()
    first = [f"old-{i}" for i in range(5_000)]
    assert seen.admit(first).all()
    for chunk in range(60):  # 600k newer ids, merged into the array many times
        seen.admit_hashes(np.arange(chunk * 10_000, (chunk + 1) * 10_000, dtype=np.int64))
    assert len(seen) == 605_000
    assert not seen.admit(first).any()
    assert not seen.admit_hashes(np.arange(0, 600_000, 7, dtype=np.int64)).any()


def test_round_trip_through_an_array() -> None:
    seen = TrainedIds()
    seen.admit(["a", "b", "c", "d"])
    again = TrainedIds.from_array(seen.to_array())
    assert again.to_array().dtype == np.int64
    assert again.admit(["b", "c", "d", "a", "e"]).tolist() == [False, False, False, False, True]
    # an array saved by the earlier bounded memory (insertion order, not sorted) loads too
    legacy = TrainedIds.from_array(id_hashes(["z", "y"]))
    assert legacy.admit(["y", "x"]).tolist() == [False, True]


def test_chunks_agree_with_one_id_at_a_time(monkeypatch: object) -> None:
    monkeypatch.setattr(idset, "MERGE_AT", 64)  # type: ignore[attr-defined]
    rng = np.random.default_rng(4)
    chunked, single = TrainedIds(), TrainedIds()
    for _ in range(300):
        low = 0 if rng.random() < 0.3 else 10_000
        ids = [str(i) for i in rng.integers(low, 10**9 if low else 120, rng.integers(1, 30))]
        got = chunked.admit(ids).tolist()
        want = [bool(single.admit([i])[0]) for i in ids]
        assert got == want
        assert len(chunked) == len(single)
    assert chunked.to_array().tolist() == single.to_array().tolist()


def test_contains_looks_without_adding() -> None:
    seen = TrainedIds()
    seen.admit(["a", "b"])
    seen.admit_hashes(np.arange(200_000, dtype=np.int64))  # "a", "b" are merged by now
    seen.admit(["c"])  # still among the newest
    got = seen.contains(id_hashes(["a", "c", "z"]))
    assert got.tolist() == [True, True, False]
    assert seen.contains(id_hashes(["z"])).tolist() == [False]  # "z" was not added
