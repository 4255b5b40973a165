"""What a row with no history is ranked by (model.scoring.cold): the learnt mix until the prior
alone or all-time popularity has hit strictly more rows with no history, counted
test-then-train; the all-time counts by the prior's hash buckets."""

from __future__ import annotations

import numpy as np
import pytest

from model.scoring.cold import (
    MIX,
    POPULAR,
    PRIOR,
    ColdStart,
    ItemCounts,
    hits_at,
    no_history,
    popularity_scores,
)


def test_no_history_is_a_row_of_padding_only() -> None:
    history = np.array([[0, 0, 0], [5, 0, 0], [0, 0, 7], [0, 0, 0]])
    assert no_history(history).tolist() == [True, False, False, True]
    assert no_history(np.zeros((2, 0), np.int64)).tolist() == [True, True]


def test_hits_count_candidates_strictly_above_the_target() -> None:
    scores = np.array([[5.0, 4.0, 3.0, 2.0], [1.0, 1.0, 1.0, 0.5], [0.0, -np.inf, 1.0, 2.0]])
    assert hits_at(scores, np.array([1, 3, 1]), k=2).tolist() == [True, False, False]
    assert hits_at(scores, np.array([2, 1, -1]), k=2).tolist() == [False, True, False]
    assert hits_at(scores[:0], np.zeros(0, np.int64), k=2).size == 0


def test_the_leader_serves_ties_going_to_the_mix_then_the_prior() -> None:
    cold = ColdStart(k=1, buckets=8)
    assert cold.choice == MIX
    # the mix ranks item 0 first, the prior item 2, popularity item 1
    mix = np.tile([3.0, 2.0, 1.0], (2, 1))
    prior = np.tile([1.0, 2.0, 3.0], (2, 1))
    popular = np.tile([1.0, 3.0, 2.0], (2, 1))
    both = {MIX: mix, PRIOR: prior, POPULAR: popular}
    cold.observe(both, np.array([0, 2]))
    assert cold.hits.tolist() == [1, 1, 0] and cold.rows == 2 and cold.choice == MIX  # a tie
    cold.observe({k: v[:1] for k, v in both.items()}, np.array([2]))
    assert cold.choice == PRIOR
    cold.observe(both, np.array([1, 1]))
    assert cold.hits.tolist() == [1, 2, 2] and cold.choice == PRIOR  # a tie: the prior stays
    cold.observe({k: v[:1] for k, v in both.items()}, np.array([1]))
    assert cold.choice == POPULAR
    cold.observe({k: v[:1] for k, v in both.items()}, np.array([-1]))  # not a candidate
    assert cold.rows == 6


def test_all_time_counts_rank_by_bucket_and_the_state_round_trips() -> None:
    cold = ColdStart(k=1, buckets=8)
    cold.counts.observe(np.array([3, 3, 11, 5, 3]))  # 11 shares bucket 3 with key 3
    assert cold.counts.of_buckets(np.array([3, 5, 0])).tolist() == [4.0, 1.0, 0.0]
    scores = cold.counts.scores(np.array([3, 5, 6]))
    np.testing.assert_array_equal(scores, popularity_scores(np.array([4.0, 1.0, 0.0])))
    assert scores[0] > scores[1] > scores[2] == 0.0 and scores.dtype == np.float32
    cold.hits[:] = (1, 2, 3)
    cold.rows = 6
    again = ColdStart(k=1, buckets=8)
    again.load_state(cold.state())
    assert again.hits.tolist() == [1, 2, 3] and again.rows == 6 and again.choice == POPULAR
    np.testing.assert_array_equal(again.counts.counts, cold.counts.counts)
    # a checkpoint from before the popularity ranking: two hit counts, no counts
    old = ColdStart(k=1, buckets=8)
    old.load_state({"hits": np.array([4, 5]), "rows": np.asarray(9)})
    assert old.hits.tolist() == [4, 5, 0] and old.choice == PRIOR and not old.counts.counts.any()
    with pytest.raises(ValueError, match="counts"):
        again.load_state({"hits": np.zeros(4, np.int64), "rows": np.asarray(0)})
    with pytest.raises(ValueError, match="buckets"):
        again.load_state({"hits": np.zeros(3, np.int64), "rows": np.asarray(0),
                          "count_buckets": np.array([9]), "count_values": np.array([1.0])})
    with pytest.raises(ValueError):
        ItemCounts(0)


def test_rank_serves_the_leader_on_rows_without_history_and_counts_every_ranking() -> None:
    cold = ColdStart(k=1, buckets=8)
    cold.hits[:] = (0, 0, 1)  # popularity leads
    scores = np.array([[3.0, 2.0, 1.0], [0.0, 9.0, 0.0], [3.0, 2.0, 1.0]])
    rows = np.array([0, 2])
    popular = np.tile([1.0, 3.0, 2.0], (2, 1))
    prior = np.tile([1.0, 2.0, 3.0], (2, 1))
    kept = np.array([[True, True, True], [True, False, True]])  # row 2 leaves item 1 out
    cold.rank(scores, rows, {PRIOR: prior, POPULAR: popular}, np.array([0, 1]), kept=kept)
    np.testing.assert_array_equal(scores[[0, 2]], popular)  # served by the leader
    np.testing.assert_array_equal(scores[1], [0.0, 9.0, 0.0])  # a row with history: untouched
    # row 0 (target 0): the mix hits; row 2 (target 1, left out): nobody hits
    assert cold.hits.tolist() == [1, 0, 1] and cold.rows == 2
    before = scores.copy()
    cold.rank(scores, np.zeros(0, np.int64), {}, np.zeros(0, np.int64))
    np.testing.assert_array_equal(scores, before)
