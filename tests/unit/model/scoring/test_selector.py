"""The mix selector: exact ranks per variant, groups by history size, the leader served."""

from __future__ import annotations

import numpy as np
import pytest

from model.scoring.selector import (
    MixSelector,
    dense_cells,
    gains,
    groups_of,
    history_counts,
    join_cells,
    row_scales,
    top_columns,
    variant_hits,
    variant_ranks,
)


def _brute(base, a_dense, b_dense, target, variants, k):
    """Ranks capped at ``k`` by scoring every candidate per variant."""
    out = []
    for va, vb in variants:
        scores = base + va * a_dense + vb * b_dense
        at = scores[np.arange(len(target)), np.maximum(target, 0)]
        rank = (scores > at[:, None]).sum(axis=1)
        out.append(np.where((target >= 0) & np.isfinite(at), np.minimum(rank, k), k))
    return np.stack(out, axis=1)


@pytest.mark.parametrize(("seed", "n"), [(0, 300), (1, 300), (2, 300), (3, 9000)])
def test_variant_hits_equal_ranking_every_candidate(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    b, k = 40, 10
    base = rng.normal(size=(b, n))
    base[rng.random((b, n)) < 0.05] = -np.inf  # not candidates
    a_dense = np.where(rng.random((b, n)) < 0.08, rng.random((b, n)) * 3, 0.0)
    b_dense = np.where(rng.random((b, n)) < 0.05, rng.random((b, n)) * 2, 0.0)
    # targets: often among the parts' cells, sometimes not, sometimes none or -inf
    target = rng.integers(0, n, b)
    target[:10] = np.argmax(a_dense[:10], axis=1)
    target[10:14] = -1
    target[14:16] = np.argmax(np.where(np.isfinite(base[14:16]), base[14:16], -9), axis=1)
    variants = np.array([(1, 1), (2, 1), (1, 8), (8, 32), (0.5, 0.25)], float)
    cells = dense_cells(a_dense, 1.0), dense_cells(b_dense, 1.0)
    ranks = variant_ranks(base, *cells, target, variants, k)
    np.testing.assert_array_equal(ranks, _brute(base, a_dense, b_dense, target, variants, k))
    hits = variant_hits(base, *cells, target, variants, k)
    np.testing.assert_array_equal(hits, ranks < k)
    assert hits.any() and not hits.all() and len(set(ranks[hits].tolist())) > 1


@pytest.mark.parametrize(("n", "block"), [(1000, 7), (5000, 64), (300, 256)])
def test_top_columns_are_each_rows_highest(n: int, block: int) -> None:
    rng = np.random.default_rng(n)
    scores = rng.normal(size=(12, n)).astype(np.float32)
    scores[:, ::3] = -np.inf
    scores[0, :] = 1.0  # ties: any k columns of the highest value
    got = top_columns(scores, 10, block)
    kth = -np.sort(-scores, axis=1)[:, 9]
    picked = np.take_along_axis(scores, got, axis=1)
    assert got.shape == (12, 10) and all(len(set(r)) == 10 for r in got.tolist())
    assert (picked >= kth[:, None]).all()


def test_cells_named_twice_add_up_and_small_catalogues_rank_all() -> None:
    base = np.array([[0.0, 1.0, 2.0]])
    one = (np.array([0]), np.array([0]), np.array([1.5]))
    twice = join_cells([one, one])  # 3.0 at column 0: above column 2
    hits = variant_hits(base, twice, join_cells([]), np.array([0]), np.array([[1.0, 1.0]]), 1)
    assert hits.tolist() == [[True]]
    hits = variant_hits(base, one, join_cells([]), np.array([0]), np.array([[1.0, 1.0]]), 1)
    assert hits.tolist() == [[False]]


def test_groups_by_window_items() -> None:
    history = np.array([[0, 0, 0], [5, 0, 0], [5, 6, 7]])
    assert history_counts(history).tolist() == [0, 1, 3]
    assert groups_of(np.array([0, 1, 4, 5, 10])).tolist() == [-1, 0, 0, 1, 1]
    scales = np.array([[2.0, 4.0], [8.0, 16.0]])
    assert row_scales(scales, np.array([0, 3, 7])).tolist() == [[1, 1], [2, 4], [8, 16]]


def test_ranks_below_k_are_exact_and_gains_weigh_them() -> None:
    base = np.array([[3.0, 2.0, 1.0, 0.0]])
    one = (np.array([0]), np.array([3]), np.array([2.5]))
    ranks = variant_ranks(base, one, join_cells([]), np.array([3]),
                          np.array([[1.0, 1.0], [2.0, 1.0], [0.1, 1.0]]), 2)
    assert ranks.tolist() == [[1, 0, 2]]  # 2.5 below 3; 5.0 above all; 0.25: not in the top 2
    assert gains(ranks, 2).tolist() == [[pytest.approx(1 / np.log2(3)), 1.0, 0.0]]


def test_selector_serves_each_groups_leader_ties_to_the_learnt_weights() -> None:
    sel = MixSelector(k=1, item_scales=(1.0, 4.0), sknn_scales=(1.0,))
    assert sel.scales().tolist() == [[1.0, 1.0], [1.0, 1.0]]
    # row 0 (2 items): the co-visitation cell wins only scaled by 4; row 1 (6 items): the
    # base's best is the target, scaling the part up loses it
    base = np.array([[1.0, 0.0], [1.0, 0.0]])
    cells = (np.array([0, 1]), np.array([1, 1]), np.array([0.5, 0.5]))
    sel.observe(base, cells, join_cells([]), np.array([1, 0]), np.array([2, 6]))
    assert sel.gains.tolist() == [[0, 1], [1, 0]]
    assert sel.scales().tolist() == [[4.0, 1.0], [1.0, 1.0]]
    assert sel.row_scales(np.array([0, 2, 9])).tolist() == [[1, 1], [4, 1], [1, 1]]
    # rows with no history are not counted
    sel.observe(base, cells, join_cells([]), np.array([1, 1]), np.array([0, 0]))
    assert sel.rows.tolist() == [1, 1]
    again = MixSelector(k=1, item_scales=(1.0, 4.0), sknn_scales=(1.0,))
    again.load_state(sel.state())
    assert again.scales().tolist() == sel.scales().tolist()
    with pytest.raises(ValueError):
        MixSelector(item_scales=(1.0,), sknn_scales=(1.0,)).load_state(sel.state())
