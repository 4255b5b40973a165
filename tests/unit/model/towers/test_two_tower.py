"""Two-tower model: export round trip, admission, default rows, test-then-train metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model.artifact.files import load_artifact
from model.scoring.selector import history_counts
from model.scoring.topk import top_k_rows
from model.towers.tf_env import tf
from model.towers.two_tower import DEFAULT_KEY, ModelConfig, TwoTower
from model.trainer.export import write_version
from model.trainer.rolling import rank_metrics, recall_ndcg
from model.trainer.samples import KeyCache, to_batch
from model.trainer.trainer import Trainer, TrainOptions
from streamrec.ids import item_key, user_key
from tests.unit.conftest_model import BATCH, HISTORY_LEN, Trained, shared_trainer


@pytest.fixture(scope="module")
def trained() -> Trained:
    return shared_trainer()


def test_export_then_load_gives_identical_scores(trained: Trained, tmp_path: Path) -> None:
    trainer = trained.trainer
    assert trainer.selector is not None
    trainer.wait_evaluation()  # every scored head counted before the gains are set
    gains = trainer.selector.gains.copy()
    trainer.selector.gains[:] = 0  # the learnt weights for every row (scales: the next test)
    try:
        manifest = write_version(tmp_path / "v1", trainer, trained.item_ids, "v1")
    finally:
        trainer.selector.gains[:] = gains
    art = load_artifact(tmp_path / "v1")
    assert manifest["dims"]["items"] == len(set(trained.item_ids.values()))

    # Known users with their histories, an unknown user, and a history with unknown items.
    picked = trained.samples[-40:]
    user_ids = [s.user_id for s in picked] + ["nobody", picked[0].user_id]
    histories = [list(s.history) for s in picked] + [[picked[1].item_id], ["no-such-item", picked[2].item_id]]
    keys = KeyCache()
    hist = np.zeros((len(user_ids), HISTORY_LEN), np.int64)
    for i, h in enumerate(histories):
        if h:
            hist[i, : len(h)] = [keys.item(x) for x in h[:HISTORY_LEN]]
    ukeys = np.array([user_key(u) for u in user_ids], np.int64)

    served = art.user_vectors(user_ids, histories)
    trained_vecs = trainer.user_vectors(ukeys, hist)
    np.testing.assert_allclose(served, trained_vecs, atol=2e-5)

    vkeys, vecs = trainer.item_vectors()
    order = {int(k): i for i, k in enumerate(vkeys)}
    rows = [order[item_key(i)] for i in art.item_ids.tolist()]
    np.testing.assert_allclose(art.item_vectors, vecs[rows], atol=1e-6)
    scores_served = served @ art.item_vectors.T
    scores_trained = trained_vecs @ vecs[rows].T
    np.testing.assert_allclose(scores_served, scores_trained, atol=5e-5)
    assert not art.known_users(["nobody"])[0]
    assert art.known_users([picked[0].user_id])[0]

    # the co-visitation term (model.scoring.covisit) as served equals the trainer's
    assert art.manifest["format_version"] == 9  # with the session-kNN part
    served_cv = np.zeros_like(scores_served)
    for r, (cols, added) in enumerate(art.covisit_scores(histories)):
        served_cv[r, cols] = added
    trained_cv = trainer.covisit_scores(hist, vkeys[rows])
    assert served_cv.max() > 0
    np.testing.assert_allclose(served_cv, trained_cv, rtol=1e-5, atol=1e-6)

    # so does the session-kNN part (model.scoring.sessions), and the whole served score
    # adds it (known users' own histories are not their neighbours)
    assert art.manifest["sessions"]["weight"] == pytest.approx(trainer.sknn_weight())
    served_sk = np.zeros_like(scores_served)
    keyed = art.request_keys(user_ids, histories)
    for r, (cols, added) in enumerate(art.sparse_scores(histories, keyed)[1]):
        served_sk[r, cols] = added
    trained_sk = trainer.session_scores(ukeys, hist, vkeys[rows])
    assert (served_sk > 0).sum(axis=1).min() > 0
    np.testing.assert_allclose(served_sk, trained_sk, rtol=1e-6, atol=1e-6)
    whole = art.scores(user_ids, histories).T
    np.testing.assert_allclose(whole, scores_served + served_cv + served_sk, rtol=1e-5,
                               atol=1e-5)


def test_a_version_serves_the_selectors_scales_per_history_group(
    trained: Trained, tmp_path: Path
) -> None:
    """Leaders other than the learnt weights (``model.scoring.selector``) reach the version:
    its whole score is the towers plus each part times its row's group scale, as the trainer
    scales them."""
    trainer = trained.trainer
    selector = trainer.selector
    assert selector is not None and selector.rows.sum() > 0
    trainer.wait_evaluation()  # every scored head counted before the gains are set
    gains = selector.gains.copy()
    try:
        selector.gains[:] = 0
        for group, lead in enumerate([(4.0, 2.0), (2.0, 16.0)]):
            selector.gains[group, np.flatnonzero((selector.variants == lead).all(axis=1))] = 1
        write_version(tmp_path / "v", trainer, trained.item_ids, "v")
        art = load_artifact(tmp_path / "v")
        assert art.manifest["format_version"] == 10
        picked = trained.samples[-30:]
        user_ids = [s.user_id for s in picked]
        histories = [list(s.history)[: 1 + i % 8] for i, s in enumerate(picked)]
        keys = KeyCache()
        hist = np.zeros((len(user_ids), HISTORY_LEN), np.int64)
        for i, h in enumerate(histories):
            hist[i, : len(h)] = [keys.item(x) for x in h]
        ukeys = np.array([user_key(u) for u in user_ids], np.int64)
        scale = selector.row_scales(history_counts(hist))
        assert sorted({tuple(r) for r in scale.tolist()}) == [(2.0, 16.0), (4.0, 2.0)]
        vkeys, vecs = trainer.item_vectors()
        order = {int(k): i for i, k in enumerate(vkeys)}
        rows = [order[item_key(i)] for i in art.item_ids.tolist()]
        expected = (trainer.user_vectors(ukeys, hist) @ vecs[rows].T
                    + scale[:, :1] * trainer.covisit_scores(hist, vkeys[rows])
                    + scale[:, 1:] * trainer.session_scores(ukeys, hist, vkeys[rows]))
        np.testing.assert_allclose(art.scores(user_ids, histories).T, expected, rtol=1e-5,
                                   atol=5e-5)
    finally:
        selector.gains[:] = gains


def test_model_beats_popularity_on_planted_preferences(trained: Trained) -> None:
    summary = trained.trainer.quality()
    assert summary["evaluated_samples"] > 0
    # Rolling window covers the last 2000 evaluated samples (the second half of the run).
    assert summary["recall@10"] > summary["popularity_recall@10"] + 0.1
    assert summary["ndcg@10"] > summary["popularity_ndcg@10"]


def test_admission_uses_default_row_until_n_sightings() -> None:
    model = TwoTower(ModelConfig(admit_after=3, user_layers=(8,), embedding_dim=8), tag="admit")
    model.init_default_rows()
    user = tf.constant([11, 12], tf.int64)
    item = tf.constant([21, 21], tf.int64)  # item 21 twice per batch
    hist = tf.constant([[21, 0], [22, 0]], tf.int64)

    u1, i1, h1, known1 = model.prepare(user, item, hist, tf.constant(1))
    assert u1.numpy().tolist() == [DEFAULT_KEY, DEFAULT_KEY]
    assert i1.numpy().tolist() == [DEFAULT_KEY, DEFAULT_KEY]  # 2 sightings < 3
    assert not known1.numpy().any()
    assert h1.numpy()[0, 0] == DEFAULT_KEY

    u2, i2, h2, known2 = model.prepare(user, item, hist, tf.constant(2))
    assert u2.numpy().tolist() == [DEFAULT_KEY, DEFAULT_KEY]  # 2 sightings each
    assert i2.numpy().tolist() == [21, 21]  # 4 sightings
    # Item 21 became known in this batch: its history entry pools; 22 (never a target) not.
    assert known2.numpy().tolist() == [[True, False], [False, False]]
    assert h2.numpy()[1, 0] == DEFAULT_KEY

    stats = model.users.stats.lookup(tf.constant([11], tf.int64)).numpy()[0]
    assert stats.tolist() == [2, 2]  # (sightings, last step)


def test_unknown_user_gets_the_zero_default_row_not_a_random_one() -> None:
    model = TwoTower(ModelConfig(user_layers=(8,), embedding_dim=8), tag="unknown")
    model.init_default_rows()
    hist = tf.zeros([2, 3], tf.int64)
    first = model.user_vectors(tf.constant([5, 6], tf.int64), hist).numpy()
    again = model.user_vectors(tf.constant([5, 6], tf.int64), hist).numpy()
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(model.default_row(model.users), 0.0)


def test_batch_decoding_truncates_and_pads_history(trained: Trained) -> None:
    sample = next(s for s in trained.samples if len(s.history) > 3)
    batch = to_batch([sample], history_len=3)
    assert batch.history.shape == (1, 3)
    assert batch.history[0].tolist() == [item_key(x) for x in sample.history[:3]]
    short = to_batch([trained.samples[0]], history_len=4)
    assert short.history[0].tolist() == [0, 0, 0, 0]  # first sample has no history


def test_rank_based_metrics_equal_top_k_ranking() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(60, 300)).astype(np.float32)
    keys = np.arange(300, dtype=np.int64) * 7 + 1
    target = rng.integers(0, 300, 60)
    target[10:30] = np.argsort(-scores[10:30], axis=1)[:, 3]  # rank 3: a hit, NDCG 1/log2(5)
    pos = target.copy()
    pos[:5] = -1  # not among the candidates
    rec, ndcg = rank_metrics(scores, pos, 10)
    target_keys = keys[target]
    target_keys[:5] = -99
    rec_ref, ndcg_ref = recall_ndcg(keys[top_k_rows(scores, 10)], target_keys)
    np.testing.assert_array_equal(rec, rec_ref)
    np.testing.assert_allclose(ndcg, ndcg_ref)
    assert rec[10:30].sum() == 20
    np.testing.assert_allclose(ndcg[10:30], 1 / np.log2(5))
    assert rec[:5].sum() == 0


def test_service_export_checkpoints_then_publishes(trained: Trained, tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from model.trainer.service import TrainerService
    from streamrec.settings import load_settings

    base = load_settings()
    settings = base.model_copy(update={"trainer": base.trainer.model_copy(update={
        "registry_dir": tmp_path / "models", "checkpoint_dir": tmp_path / "ckpt",
    })})
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    service = TrainerService(settings, trained.trainer, clock=lambda: at)
    service.item_ids = dict(trained.item_ids)
    service.item_ids.update({-i: f"evicted-{i}" for i in range(1, 3000)})  # no rows any more
    service.state.offsets = {"t.samples:0": 7, "t.samples:1": 5}
    service.state.samples_trained = 12
    service.state.trained_through_ms = 1_767_225_600_000

    version = service.export()
    assert version == "20260102T030405Z-000001"
    assert service.registry.current() == version
    manifest = load_artifact(service.registry.path(version)).manifest
    assert manifest["kafka_offsets"] == {"t.samples:0": 7, "t.samples:1": 5}
    assert manifest["samples_trained"] == 12
    assert manifest["created_at"] == at.isoformat()
    assert "recall@10" in manifest["metrics"]
    assert set(service.item_ids) == set(trained.item_ids)  # stale ids pruned

    restored = service.checkpoints.restore()  # same process: checks files, not TF tables
    assert restored is not None
    assert restored.state["offsets"] == manifest["kafka_offsets"]
    assert restored.state["last_version"] == version
    assert len(restored.arrays["item_ids"]) == len(trained.item_ids)
    # the co-visitation state rides in the checkpoint: a restored copy scores the same
    from model.scoring.covisit import CoVisitation

    cv = trained.trainer.covisit
    assert cv is not None and cv.samples > 0
    copy = CoVisitation(cv.window, cv.decay, cv.half_life, cv.max_pairs)
    copy.load_arrays(restored.arrays)
    hist = np.array([[item_key(i) for i in s.history[:HISTORY_LEN]] + [0] * (HISTORY_LEN - len(s.history[:HISTORY_LEN]))
                     for s in trained.samples[-8:]], np.int64)
    keys = np.array(list(trained.item_ids), np.int64)
    np.testing.assert_allclose(copy.sums(hist, keys), cv.sums(hist, keys))
    assert copy.sums(hist, keys).max() > 0
    # so does the cold start's: its hits and the all-time counts it ranks by
    from model.scoring.cold import ColdStart

    cold = trained.trainer.cold
    again = ColdStart(buckets=cold.counts.buckets)
    again.load_state({k[len("cold_"):]: v for k, v in restored.arrays.items()
                      if k.startswith("cold_")})
    assert again.hits.tolist() == cold.hits.tolist() and again.rows == cold.rows
    np.testing.assert_array_equal(again.counts.counts, cold.counts.counts)
    assert again.counts.counts.sum() >= len(trained.samples)


def _top20_moves(trained: Trained, trainer: Trainer, n: int = 200) -> float:
    """Mean number of a user's top-20 items replaced when one click is added to the front
    of their history (a random item they have not clicked), over ``n`` recent samples."""
    rng = np.random.default_rng(5)
    keys, vectors = trainer.item_vectors()
    items = sorted(set(trained.item_ids.values()))
    cache = KeyCache()
    moved = []
    for sample in trained.samples[-n:]:
        hist = list(sample.history)[:HISTORY_LEN]
        click = str(rng.choice([i for i in items if i not in hist]))
        tops = []
        for h in (hist, [click, *hist][:HISTORY_LEN]):
            row = np.zeros((1, HISTORY_LEN), np.int64)
            row[0, : len(h)] = [cache.item(x) for x in h]
            user = trainer.user_vectors(np.array([user_key(sample.user_id)], np.int64), row)[0]
            scores = vectors @ user
            scores[np.isin(keys, row[0])] = -np.inf  # seen items are never recommended
            tops.append(set(np.argsort(-scores)[:20].tolist()))
        moved.append(len(tops[0] - tops[1]))
    return float(np.mean(moved))


def test_one_click_moves_the_top_20_more_than_under_mean_pooling(trained: Trained) -> None:
    """The recency-weighted pool (``ModelConfig`` defaults) gives the newest click a weight
    of ``1 / sum(decay ** p)`` instead of ``1 / n``: a trained model's top 20 reacts more."""
    assert ModelConfig().history_decay < 1.0
    mean_pool = Trainer(
        ModelConfig(history_len=HISTORY_LEN, history_decay=1.0),
        TrainOptions(batch_size=BATCH, eval_rows=0),
        tag="meanpool",
    )
    for batch in trained.batches:
        mean_pool.train_step(batch)
    recency, mean = _top20_moves(trained, trained.trainer), _top20_moves(trained, mean_pool)
    assert recency > 1.3 * mean, (recency, mean)
