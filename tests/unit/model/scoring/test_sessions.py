"""The session-kNN index of the model's ``sknn`` part (``model.scoring.sessions``)."""

from __future__ import annotations

import numpy as np
import pytest

from model.evaluation.baselines import SessionKNNBaseline
from model.scoring import sessions
from model.scoring.sessions import SessionIndex, part


def _stream(seed: int, events: int = 1500, users: int = 120, items: int = 90):
    """Batches of (user, item, history) with each user's earlier items, most recent first."""
    rng = np.random.default_rng(seed)
    seen: dict[int, list[int]] = {}
    rows = []
    for _ in range(events):
        u = int(rng.integers(users))
        i = int(min(rng.zipf(1.3), items) - 1)
        rows.append((u, i, list(seen.get(u, []))))
        seen.setdefault(u, []).insert(0, i)
    return [rows[s:s + 40] for s in range(0, events, 40)]


def _history(histories: list[list[int]], width: int) -> np.ndarray:
    """Item keys (index + 1; 0 = padding), ``[B, width]``."""
    out = np.zeros((len(histories), width), np.int64)
    for r, h in enumerate(histories):
        out[r, : min(width, len(h))] = np.asarray(h[:width]) + 1
    return out


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("dense", [0, 1])
def test_index_by_keys_sums_as_the_baseline_scores(
    seed: int, dense: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sessions, "DENSE_RATIO", 10**9 if dense else 0)
    window, n_items = 6, 90
    base = SessionKNNBaseline(sample_size=7, window=window, k=4)
    index = SessionIndex(sample_size=7, window=window, k=4)
    compared = 0
    for batch in _stream(seed):
        users = [u for u, _, _ in batch]
        histories = [h for _, _, h in batch]
        want = base.scores(users, histories, n_items)
        # user keys differ from the baseline's indices; item keys are indices + 1, and the
        # matrix holds more than the window (the index cuts it)
        got = index.dense(np.asarray(users) * 7 + 3, _history(histories, window + 3),
                          np.arange(n_items) + 1)
        np.testing.assert_array_equal(got, want)
        compared += int((want > 0).sum())
        base.learn(users, [i for _, i, _ in batch])
        index.learn(np.asarray(users) * 7 + 3, np.asarray([i for _, i, _ in batch]) + 1)
    assert compared > 1000


def test_sums_are_sparse_by_row_and_item() -> None:
    index = SessionIndex(sample_size=5, window=4, k=None)
    index.learn(np.array([1, 1, 2, 2, 3]), np.array([10, 11, 10, 12, 11]))
    rows, ids, s = index.sums(np.array([9, 1]), np.array([[10, 0], [10, 0]]))
    # row 0 (a new user): histories 1 and 2 hold item 10, the most recent (2) first
    assert rows.tolist() == [0, 0, 0, 1, 1]
    keys = index.items.keys[ids]
    assert keys.tolist() == [10, 11, 12, 10, 12]
    # row 1 is user 1: its own history is no neighbour, user 2's is
    assert s[3] == s[4] > 0
    assert s[0] == s[1] + s[2] and s[1] > 0 and s[2] > 0
    assert part(np.zeros(1))[0] == 0.0


def test_the_least_recent_histories_are_dropped_past_the_bound() -> None:
    index = SessionIndex(sample_size=50, window=5, k=None, max_sessions=40)
    users = np.arange(1, 61)
    index.learn(users, (users % 7) + 100)
    assert index.sessions == 40  # 60 > 1.25 * 40: back to the 40 most recent
    assert sorted(index.users.keys.tolist()) == list(range(21, 61))
    history = np.array([[100, 101, 0]])
    before = index.dense(np.array([5]), history, np.arange(100, 107))
    again = SessionIndex(sample_size=50, window=5, k=None, max_sessions=40)
    again.load_arrays({k: v.copy() for k, v in index.to_arrays().items()})
    np.testing.assert_array_equal(again.dense(np.array([5]), history, np.arange(100, 107)),
                                  before)
    # an evicted user comes back as a new history; the learning goes on from the state
    index.learn(np.array([1]), np.array([103]))
    again.learn(np.array([1]), np.array([103]))
    np.testing.assert_array_equal(again.dense(np.array([5]), history, np.arange(100, 107)),
                                  index.dense(np.array([5]), history, np.arange(100, 107)))
    assert index.sessions == 41


def test_a_copy_that_learns_the_journal_equals_the_index_and_leaves_its_source() -> None:
    index = SessionIndex(sample_size=6, window=5, k=3, max_sessions=30)
    batches = _stream(3, events=600, users=50)
    for batch in batches[:5]:
        index.learn(np.array([u for u, _, _ in batch]) + 1, np.array([i for _, i, _ in batch]) + 1)
    source = SessionIndex(sample_size=6, window=5, k=3, max_sessions=30)
    source.load_arrays(index.to_arrays())
    frozen = {k: v.copy() for k, v in source.to_arrays().items()}
    index.keep_journal()
    for batch in batches[5:]:  # past the bound: histories are dropped on the way
        index.learn(np.array([u for u, _, _ in batch]) + 1, np.array([i for _, i, _ in batch]) + 1)
        index.flush()  # a call per batch (else held to the next read)
    users, items, calls = index.drain()
    assert users.size == sum(len(b) for b in batches[5:]) == calls.sum()
    assert calls.size == len(batches) - 5
    copy = source.learned_copy(users, items, calls)
    for name, value in index.to_arrays().items():
        np.testing.assert_array_equal(copy.to_arrays()[name], value, err_msg=name)
    for name, value in frozen.items():
        np.testing.assert_array_equal(source.to_arrays()[name], value, err_msg=name)
    assert index.drain()[0].size == 0
    history = np.array([[5, 9, 1, 0, 0]])
    np.testing.assert_array_equal(copy.dense(np.array([2]), history, np.arange(1, 91)),
                                  index.dense(np.array([2]), history, np.arange(1, 91)))



def test_learning_is_held_until_a_read_and_reads_see_all_of_it() -> None:
    held = SessionIndex(sample_size=6, window=5, k=3)
    each = SessionIndex(sample_size=6, window=5, k=3)
    history = np.array([[5, 9, 1, 0, 0], [2, 0, 0, 0, 0]])
    for batch in _stream(4, events=400, users=40):
        users = np.array([u for u, _, _ in batch]) + 1
        items = np.array([i for _, i, _ in batch]) + 1
        held.learn(users, items)
        each.learn(users, items)
        each.flush()
    assert held._pending_size == 400 and each._pending_size == 0
    before = held.sums(np.array([2]), history[:1], held=True)  # as it is: nothing learnt yet
    assert before[0].size == 0 and held._pending_size == 400
    np.testing.assert_array_equal(held.dense(np.array([2, 99]), history, np.arange(1, 91)),
                                  each.dense(np.array([2, 99]), history, np.arange(1, 91)))
    assert held._pending_size == 0 and held.entries == each.entries
