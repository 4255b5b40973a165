"""The live figures of the test-then-train evaluation (model.trainer.rolling): the damped
item-kNN beside the raw item-to-item memory, equal to a plain re-implementation."""

from __future__ import annotations

import numpy as np

from model.scoring.covisit import ITEMKNN_ALPHA
from model.trainer.rolling import Evaluator


def test_live_item_knn_damps_the_co_visitation_sums_by_popularity() -> None:
    rng = np.random.default_rng(0)
    n, rows = 50, 400
    ev = Evaluator(k=5, window=10_000)
    keys = np.arange(1, n + 1, dtype=np.int64)
    counts = rng.integers(0, 200, n)
    ev.popularity.observe(np.repeat(keys, counts))
    ev.set_candidates(keys, np.zeros((n, 4), np.float32))
    sums = rng.gamma(0.5, 3.0, (rows, n)) * (rng.random((rows, n)) < 0.3)
    # targets that popularity damping favours: rare items with a fair co-visitation sum
    target_pos = np.argmax(sums / (counts + 1.0) ** ITEMKNN_ALPHA, axis=1)
    item2item = np.log1p(sums).astype(np.float32)
    ev.evaluate(np.zeros((rows, n), np.float32), target_pos, item2item=item2item)

    def plain(score: np.ndarray) -> float:
        hits = [(score[r] > score[r, target_pos[r]]).sum() < 5 for r in range(rows)]
        return float(np.mean(hits))

    tie = counts / (counts.max() + 1.0)
    knn = plain(sums / (counts + 1.0) ** ITEMKNN_ALPHA + 1e-6 * tie)
    raw = plain(item2item + 1e-3 * tie)
    summary = ev.summary()
    assert summary["itemknn_recall@5"] == knn == 1.0
    assert summary["item2item_recall@5"] == raw < knn
