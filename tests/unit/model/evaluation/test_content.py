"""The content baseline against a plain re-implementation of its rule."""

from __future__ import annotations

import numpy as np

from model.evaluation.content import ContentBaseline
from model.scoring.sessions import recent_distinct


def _reference(tokens, counts, histories, n, window, gamma):
    out = np.zeros((len(histories), n))
    for row, history in enumerate(histories):
        items = recent_distinct(history, window)
        if not items:
            continue
        share: dict[int, float] = {}
        for i in items:
            for t in (tokens[i] if i < len(tokens) else []):
                share[t] = share.get(t, 0.0) + 1.0 / len(items)
        for c in range(n):
            s = sum(share.get(t, 0.0) for t in (tokens[c] if c < len(tokens) else []))
            out[row, c] = s * (counts[c] + 1.0) ** gamma
    return out


def test_scores_match_the_rule_and_learn_popularity() -> None:
    rng = np.random.default_rng(3)
    n_items = 40
    tokens = [sorted(set(rng.integers(0, 7, rng.integers(0, 4)).tolist())) for _ in range(n_items - 5)]
    for gamma in (0.0, 0.5, 1.0):
        base = ContentBaseline(tokens, window=4, gamma=gamma)
        counts = np.zeros(n_items)
        for _ in range(5):
            histories = [rng.integers(0, n_items, rng.integers(0, 7)).tolist() for _ in range(9)]
            got = base.scores(histories, n_items)
            want = _reference(tokens, counts, histories, n_items, 4, gamma)
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
            targets = rng.integers(0, n_items, 6)
            base.learn(targets.tolist(), histories[:6])
            np.add.at(counts, targets, 1)
        assert base.tiebreak(n_items).tolist() == counts.astype(int).tolist()


def test_items_without_categories_and_empty_windows_score_zero() -> None:
    base = ContentBaseline([[0], [], [0, 1]], window=3)
    scores = base.scores([[], [0]], 5)
    assert scores[0].tolist() == [0.0] * 5
    assert scores[1].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
