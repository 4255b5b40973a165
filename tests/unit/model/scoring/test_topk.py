"""Exact top-k (``model.scoring.topk``): serving's pruned search and the evaluation's ranking."""

from __future__ import annotations

import numpy as np
import pytest

from model.scoring.topk import _block_maxima, _candidates, top_k, top_k_batch, top_k_rows


@pytest.mark.parametrize("n,k", [(1000, 10), (1000, 1), (50, 50), (50, 80), (20_000, 500), (100_003, 20), (100_000, 1)])
def test_top_k_equals_brute_force(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    vectors = rng.normal(size=(n, 16)).astype(np.float32)
    query = rng.normal(size=16).astype(np.float32)
    idx, scores = top_k(vectors, query, k)
    brute = np.argsort(-(vectors.astype(np.float64) @ query), kind="stable")[: min(k, n)]
    assert idx.tolist() == brute.tolist()
    np.testing.assert_allclose(scores, vectors[idx] @ query, rtol=1e-5)
    assert np.all(np.diff(scores) <= 0)


def test_excluded_rows_never_returned() -> None:
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(300, 8)).astype(np.float32)
    query = rng.normal(size=8).astype(np.float32)
    best = top_k(vectors, query, 30)[0]
    exclude = best[::2].tolist() + [5, 5]
    idx, _ = top_k(vectors, query, 30, exclude)
    assert not set(idx.tolist()) & set(exclude)
    allowed = [i for i in np.argsort(-(vectors @ query)).tolist() if i not in set(exclude)]
    assert idx.tolist() == allowed[:30]
    # the block-pruned path: exclude whole best blocks
    big = rng.normal(size=(50_000, 8)).astype(np.float32)
    best = top_k(big, query, 200)[0]
    exclude = best[:150].tolist()
    allowed = [i for i in np.argsort(-(big @ query)).tolist() if i not in set(exclude)]
    assert top_k(big, query, 10, exclude)[0].tolist() == allowed[:10]
    # excluding all but 3 rows leaves 3 answers
    idx, _ = top_k(vectors, query, 10, range(297))
    assert sorted(idx.tolist()) == [297, 298, 299]


def test_block_pruning_is_used_for_large_catalogues() -> None:
    scores = np.random.default_rng(3).normal(size=100_000).astype(np.float32)
    maxima = _block_maxima(scores[:, None], 20)
    assert maxima is not None
    cand = _candidates(maxima[:, 0], 20, scores.size)
    assert cand.size < 5_000
    assert set(np.argsort(-scores)[:20].tolist()) <= set(cand.tolist())
    assert _block_maxima(scores[:1000, None], 20) is None


@pytest.mark.parametrize("n", [300, 100_003])
def test_batch_equals_one_query_at_a_time(n: int) -> None:
    rng = np.random.default_rng(n)
    vectors = rng.normal(size=(n, 8)).astype(np.float32)
    queries = rng.normal(size=(5, 8)).astype(np.float32)
    ks = [20, 1, 50, 7, 20]
    excludes = [[], [3, 3, 9], rng.integers(n, size=40).tolist(), range(n - 5), [0]]
    batch = top_k_batch(vectors @ queries.T, ks, excludes)
    for j in range(5):
        idx, scores = top_k(vectors, queries[j], ks[j], excludes[j])
        assert batch[j][0].tolist() == idx.tolist()
        np.testing.assert_allclose(batch[j][1], scores, rtol=1e-5)
    assert len(batch[3][0]) == 5  # only five rows left to rank


def test_top_k_rows_ranks_each_row_best_first() -> None:
    rng = np.random.default_rng(5)
    scores = rng.normal(size=(6, 500))
    best = top_k_rows(scores, 10)
    assert best.shape == (6, 10)
    for row, idx in zip(scores, best, strict=True):
        assert idx.tolist() == np.argsort(-row, kind="stable")[:10].tolist()
    assert top_k_rows(scores, 900).shape == (6, 500)  # k beyond N: every column, ranked
    assert top_k_rows(scores, 0).shape == (6, 0)


def test_top_k_rows_keeps_its_tie_rule() -> None:
    """Equal scores: argpartition's order, then a stable sort (the evaluation's figures depend
    on it; the trainer's popularity baseline ranks integer counts, full of ties)."""
    counts = np.array([[3.0, 1.0, 3.0, 2.0, 3.0, 0.0, 2.0, 3.0]])
    part = np.argpartition(-counts, 2, axis=1)[:, :3]
    order = np.argsort(-np.take_along_axis(counts, part, axis=1), axis=1, kind="stable")
    assert top_k_rows(counts, 3).tolist() == np.take_along_axis(part, order, axis=1).tolist()
    assert set(top_k_rows(counts, 4)[0].tolist()) == {0, 2, 4, 7}
