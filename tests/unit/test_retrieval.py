"""Exact top-k, seen filtering and trending padding."""

from __future__ import annotations

import numpy as np
import pytest

from serving.retrieval import Scored, pad, popular, top_k, top_k_batch


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


def test_pad_with_trending_skips_taken_and_seen() -> None:
    ranked = [Scored("a", 3.0), Scored("b", 2.0)]
    trending = [("b", 9.0), ("c", 8.0), ("s", 7.0), ("d", 6.0), ("e", 5.0)]
    out = pad(ranked, trending, 4, seen={"s"})
    assert [s.item_id for s in out] == ["a", "b", "c", "d"]
    assert out[2].score == 8.0
    assert [s.item_id for s in pad(ranked, trending, 1, set())] == ["a"]
    assert [s.item_id for s in pad(ranked, trending[:2], 10, set())] == ["a", "b", "c"]


def test_popular_filters_seen() -> None:
    trending = [("x", 3.0), ("y", 2.0), ("z", 1.0)]
    assert [s.item_id for s in popular(trending, 2, {"x"})] == ["y", "z"]
    assert popular((), 5, set()) == []


def test_block_pruning_is_used_for_large_catalogues() -> None:
    from serving.retrieval import _block_maxima, _candidates

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
