"""What a row with no history is ranked by (model.scoring.cold): the learnt mix until the prior
alone has hit strictly more rows with no history, counted test-then-train."""

from __future__ import annotations

import numpy as np
import pytest

from model.scoring.cold import MIX, PRIOR, ColdStart, hits_at, no_history


def test_no_history_is_a_row_of_padding_only() -> None:
    history = np.array([[0, 0, 0], [5, 0, 0], [0, 0, 7], [0, 0, 0]])
    assert no_history(history).tolist() == [True, False, False, True]
    assert no_history(np.zeros((2, 0), np.int64)).tolist() == [True, True]


def test_hits_count_candidates_strictly_above_the_target() -> None:
    scores = np.array([[5.0, 4.0, 3.0, 2.0], [1.0, 1.0, 1.0, 0.5], [0.0, -np.inf, 1.0, 2.0]])
    assert hits_at(scores, np.array([1, 3, 1]), k=2).tolist() == [True, False, False]
    assert hits_at(scores, np.array([2, 1, -1]), k=2).tolist() == [False, True, False]
    assert hits_at(scores[:0], np.zeros(0, np.int64), k=2).size == 0


def test_the_prior_serves_once_strictly_ahead_and_the_state_round_trips() -> None:
    cold = ColdStart(k=1)
    assert cold.choice == MIX
    # the mix ranks item 0 first, the prior item 2
    mix = np.tile([3.0, 2.0, 1.0], (2, 1))
    prior = np.tile([1.0, 2.0, 3.0], (2, 1))
    cold.observe(mix, prior, np.array([0, 2]))
    assert cold.hits.tolist() == [1, 1] and cold.rows == 2 and cold.choice == MIX  # a tie
    cold.observe(mix[:1], prior[:1], np.array([2]))
    assert cold.choice == PRIOR
    cold.observe(mix[:1], prior[:1], np.array([-1]))  # not a candidate: not counted
    assert cold.rows == 3
    again = ColdStart(k=1)
    again.load_state(cold.state())
    assert again.hits.tolist() == [1, 2] and again.rows == 3 and again.choice == PRIOR
    with pytest.raises(ValueError, match="counts"):
        again.load_state({"hits": np.zeros(3, np.int64), "rows": np.asarray(0)})
