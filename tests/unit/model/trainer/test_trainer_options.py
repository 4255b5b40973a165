"""Each large-scale training option changes the computation as its flag says."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
from model.towers.tf_env import tf
from model.towers.two_tower import DEFAULT_KEY, ModelConfig
from model.trainer.checkpoint import CheckpointStore
from model.trainer.samples import (
    KeyCache,
    SampleError,
    decode_sample,
    encode_sample,
    sample_digest,
    to_batch,
)
from model.trainer.trainer import Batch, Trainer, TrainOptions

HIST = 5
CFG = ModelConfig(embedding_dim=8, user_layers=(16, 8), history_len=HIST)


def _batches(n: int, size: int, seed: int = 3) -> list[Batch]:
    stream = SyntheticStream(SyntheticConfig(users=60, items=40, clusters=4, history_len=HIST, seed=seed))
    keys = KeyCache()
    return [to_batch(stream.take(size), HIST, keys) for _ in range(n)]


def _table(trainer: Trainer, which: str) -> dict[int, np.ndarray]:
    table = trainer.model.users if which == "user" else trainer.model.items
    keys, rows = table.params.export()
    return {int(k): r for k, r in zip(keys.numpy(), rows.numpy(), strict=True) if k != DEFAULT_KEY}


def _seed_state(trainer: Trainer, batch: Batch, rng_seed: int = 0) -> None:
    """Give every key of ``batch`` the same initial row in every trainer, and same dense weights."""
    rng = np.random.default_rng(rng_seed)
    users = np.unique(batch.user_keys)
    items = np.unique(np.concatenate([batch.item_keys, batch.history.reshape(-1)]))
    items = items[items != 0]
    trainer.model.users.params.upsert(
        tf.constant(users), tf.constant(rng.normal(0, 0.1, (users.size, CFG.embedding_dim)), tf.float32)
    )
    trainer.model.items.params.upsert(
        tf.constant(items), tf.constant(rng.normal(0, 0.1, (items.size, CFG.embedding_dim)), tf.float32)
    )
    for v in trainer.model.dense_variables:
        v.assign(rng.normal(0, 0.2, v.shape.as_list()).astype(np.float32))
    # Items of the history count as known (as after earlier training).
    trainer.model.items.observe(tf.constant(items), tf.constant(0, tf.int64))


@pytest.mark.parametrize("aux_weight", [0.0, 1.5])
def test_grad_accumulation_equals_one_big_batch(aux_weight: float) -> None:
    batch = _batches(1, 96)[0]
    opts = TrainOptions(eval_rows=0, learning_rate=0.1, aux_weight=aux_weight)
    tag = f"{int(aux_weight * 10)}"
    accum = Trainer(CFG, replace(opts, grad_accum_steps=4), tag=f"acc{tag}")
    big = Trainer(CFG, replace(opts, loss_groups=4), tag=f"big{tag}")
    for t in (accum, big):
        _seed_state(t, batch)
    before = _table(big, "item")
    loss_a = accum.train_step(batch)
    loss_b = big.train_step(batch)
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    for which in ("user", "item"):
        ta, tb = _table(accum, which), _table(big, which)
        assert ta.keys() == tb.keys()
        for k in ta:
            np.testing.assert_allclose(ta[k], tb[k], atol=1e-6)
    for va, vb in zip(accum.model.dense_variables, big.model.dense_variables, strict=True):
        np.testing.assert_allclose(va.numpy(), vb.numpy(), atol=1e-6)
    # The step did move the weights (the comparison is not between two untouched states).
    after = _table(big, "item")
    assert max(np.abs(after[k] - before[k]).max() for k in before) > 1e-3


def test_mixed_precision_computes_in_bfloat16_with_float32_master_weights() -> None:
    batch = _batches(1, 64)[0]
    mixed = Trainer(CFG, TrainOptions(mixed_precision=True, eval_rows=0), tag="bf16")
    full = Trainer(CFG, TrainOptions(eval_rows=0), tag="fp32")
    for t in (mixed, full):
        _seed_state(t, batch)
    assert mixed.model.compute_dtype == tf.bfloat16
    u_eff, i_eff, h_eff, known = mixed.model.prepare(
        tf.constant(batch.user_keys), tf.constant(batch.item_keys), tf.constant(batch.history), None
    )
    rows = mixed.model.read_rows(mixed.model.users, u_eff), mixed.model.read_rows(mixed.model.items, i_eff)
    h_rows = mixed.model.read_rows(mixed.model.items, h_eff)
    uv_bf, iv_bf = mixed.model.towers(rows[0], rows[1], h_rows, known)
    uv_32, iv_32 = full.model.towers(rows[0], rows[1], h_rows, known)
    assert uv_bf.dtype == tf.bfloat16 and iv_bf.dtype == tf.bfloat16
    assert uv_32.dtype == tf.float32
    diff = np.abs(tf.cast(uv_bf, tf.float32).numpy() - uv_32.numpy())
    assert 0 < diff.max() < 0.05  # bfloat16 rounding: close, not identical

    loss_bf = mixed.train_step(batch)
    loss_32 = full.train_step(batch)
    assert loss_bf == pytest.approx(loss_32, rel=0.05)
    assert loss_bf != loss_32
    assert all(v.dtype == tf.float32 for v in mixed.model.dense_variables)
    keys, values = mixed.model.items.params.export()
    assert values.dtype == tf.float32


def test_per_table_learning_rates() -> None:
    batch = _batches(1, 64)[0]
    trainer = Trainer(
        CFG, TrainOptions(user_lr=0.0, item_lr=0.2, dense_lr=0.0, eval_rows=0), tag="lr"
    )
    _seed_state(trainer, batch)
    users0, items0 = _table(trainer, "user"), _table(trainer, "item")
    dense0 = [v.numpy().copy() for v in trainer.model.dense_variables]
    trainer.train_step(batch)
    users1, items1 = _table(trainer, "user"), _table(trainer, "item")
    for k in users0:
        np.testing.assert_array_equal(users1[k], users0[k])
    for v, v0 in zip(trainer.model.dense_variables, dense0, strict=True):
        np.testing.assert_array_equal(v.numpy(), v0)
    moved = [np.abs(items1[k] - items0[k]).max() for k in np.unique(batch.item_keys).tolist()]
    assert min(moved) > 1e-4


def test_eviction_interval_bounds_tables_every_n_steps() -> None:
    batches = _batches(4, 64)
    trainer = Trainer(
        CFG,
        TrainOptions(evict_every_steps=2, max_user_rows=10, max_item_rows=12, eval_rows=0),
        tag="evict",
    )
    trainer.train_step(batches[0])
    sizes = trainer.table_sizes()
    assert sizes["user_rows"] > 11 and sizes["item_rows"] > 13  # step 1: no eviction yet
    trainer.train_step(batches[1])
    sizes = trainer.table_sizes()
    assert sizes["user_rows"] <= 11 and sizes["item_rows"] <= 13  # + the default row
    # Kept rows are the most recently trained ones: every user of the last batch that fits.
    kept = set(_table(trainer, "user"))
    assert kept <= set(np.unique(np.concatenate([batches[0].user_keys, batches[1].user_keys])).tolist())
    last_seen = trainer.model.users.stats.lookup(tf.constant(sorted(kept), tf.int64)).numpy()[:, 1]
    assert (last_seen == 2).sum() >= min(10, len(kept))
    # Evicted keys left the optimizer slots and the stats too.
    slot = trainer.opt_user.get_slot(trainer.model.users.shadow, "accumulator").params
    assert int(slot.size()) <= 11
    # Every second step only: step 3 grows the tables again, step 4 evicts.
    trainer.train_step(batches[2])
    assert trainer.table_sizes()["user_rows"] > 11
    trainer.train_step(batches[3])
    assert trainer.table_sizes()["user_rows"] <= 11


def test_frozen_history_rows_learn_only_as_targets() -> None:
    b = 32
    rng = np.random.default_rng(5)
    batch = Batch(
        user_keys=np.arange(1, b + 1, dtype=np.int64),
        item_keys=np.arange(101, 101 + b, dtype=np.int64),
        history=rng.integers(201, 241, size=(b, HIST)).astype(np.int64),  # never a target
        weights=np.ones(b, np.float32),
    )
    # No sampled negatives: those would move history rows too (as negatives, by design).
    opts = TrainOptions(eval_rows=0, learning_rate=0.2, sampled_negatives=0)
    trainer = Trainer(replace(CFG, train_history=False), opts, tag="frozen")
    _seed_state(trainer, batch)
    before = _table(trainer, "item")
    trainer.train_step(batch)
    after = _table(trainer, "item")
    targets = set(np.unique(batch.item_keys).tolist())
    history_only = set(np.unique(batch.history).tolist()) - targets - {0}
    assert history_only
    for k in history_only:
        np.testing.assert_array_equal(after[k], before[k])
    assert max(np.abs(after[k] - before[k]).max() for k in targets) > 1e-4


def test_checkpoint_store_is_atomic_and_keeps_the_newest(tmp_path: Path) -> None:
    var = tf.Variable([1.0, 2.0])
    store = CheckpointStore(tmp_path, {"v": var}, keep=2)
    assert store.restore() is None
    for i in range(3):
        var.assign([float(i), float(i)])
        store.save({"offsets": {"t:0": i}}, {"ids": np.array([f"x{i}"])})
    (tmp_path / ".tmp-9-dead").mkdir()  # a crash mid-save leaves a temp dir: ignored
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-"))
    assert len(names) == 2
    assert (tmp_path / "LATEST").read_text().strip() == names[-1]
    var.assign([-1.0, -1.0])
    restored = store.restore()
    assert restored is not None
    assert restored.state == {"offsets": {"t:0": 2}}
    assert restored.arrays["ids"].tolist() == ["x2"]
    np.testing.assert_array_equal(var.numpy(), [2.0, 2.0])


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{nope", "not JSON"),
        (b"[1]", "not a JSON object"),
        (json.dumps({"sample_id": "s", "user_id": "u", "item_id": "i", "event_type": "click",
                     "weight": 0, "ts": 1, "history": []}).encode(), "weight"),
        (json.dumps({"sample_id": "s", "user_id": "u", "item_id": "i", "event_type": "click",
                     "weight": 1.0, "ts": "x", "history": []}).encode(), "ts"),
        (json.dumps({"sample_id": "s", "user_id": "", "item_id": "i", "event_type": "click",
                     "weight": 1.0, "ts": 1, "history": []}).encode(), "user_id"),
        (json.dumps({"sample_id": "s", "user_id": "u", "item_id": "i", "event_type": "click",
                     "weight": 1.0, "ts": 1, "history": [3]}).encode(), "history"),
    ],
)
def test_undecodable_samples_name_the_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(SampleError, match=reason):
        decode_sample(raw)


def test_sample_round_trip_and_digest_detects_duplicates() -> None:
    stream = SyntheticStream(SyntheticConfig(users=5, items=5, history_len=HIST))
    samples = stream.take(20)
    assert [decode_sample(encode_sample(s)) for s in samples] == samples
    ids = [s.sample_id for s in samples]
    assert sample_digest(ids) == sample_digest(list(reversed(ids)))
    assert sample_digest(ids + ids[:1]) != sample_digest(ids)
    assert sample_digest(ids[1:]) != sample_digest(ids)


def test_decodes_the_samples_the_feature_job_writes() -> None:
    from feature_store.features import Sample as WireSample

    wire = WireSample("e1", "u1", "i9", "like", 2.0, 1_767_225_600_123, ("i3", "i2"))
    sample = decode_sample(wire.to_json())
    assert (sample.sample_id, sample.user_id, sample.item_id, sample.weight, sample.ts_ms) == (
        "e1", "u1", "i9", 2.0, 1_767_225_600_123
    )
    assert sample.history == ("i3", "i2")


def _slot(trainer: Trainer, which: str) -> dict[int, np.ndarray]:
    table = trainer.model.users if which == "user" else trainer.model.items
    opt = trainer.opt_user if which == "user" else trainer.opt_item
    keys, rows = opt.get_slot(table.shadow, "accumulator").params.export()
    return {int(k): r for k, r in zip(keys.numpy(), rows.numpy(), strict=True) if k != DEFAULT_KEY}


def _assert_train_alike(trainers: list[Trainer], batches: list[Batch]) -> None:
    """Train both ``trainers`` on ``batches``: the same losses, head vectors, rows,
    accumulators and dense weights, to float rounding."""
    losses = [[t.train_step(b) for b in batches] for t in trainers]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    np.testing.assert_allclose(trainers[0]._head_vectors, trainers[1]._head_vectors, atol=1e-6)
    for which in ("user", "item"):
        for read in (_table, _slot):
            ref, new = read(trainers[0], which), read(trainers[1], which)
            assert ref.keys() == new.keys()
            for k, row in ref.items():
                np.testing.assert_allclose(new[k], row, rtol=1e-5, atol=1e-5, err_msg=f"{which} {k}")
    for va, vb in zip(trainers[0].model.dense_variables, trainers[1].model.dense_variables, strict=True):
        np.testing.assert_allclose(va.numpy(), vb.numpy(), atol=1e-5)


@pytest.mark.parametrize(
    ("train_history", "decay", "aux"),
    [
        (True, 1.0, 0.0),
        (False, 1.0, 0.0),
        (True, 0.5, 0.0),
        (False, 0.7, 0.0),
        (True, 0.9, 1.5),
        (False, 0.9, 1.5),
        (True, 0.7, 1.5),
    ],
)
def test_deduplicated_step_equals_the_reference_step(
    train_history: bool, decay: float, aux: float
) -> None:
    batches = _batches(3, 24, seed=11)
    assert any(len(np.unique(b.user_keys)) < len(b) for b in batches)  # repeated users
    assert any(np.isin(b.item_keys, b.history).any() for b in batches)  # targets in histories
    cfg = replace(CFG, train_history=train_history, history_decay=decay)
    tag = f"{int(train_history)}{int(decay * 10)}{int(aux * 10)}"
    opts = TrainOptions(eval_rows=4, learning_rate=0.3, aux_weight=aux)
    trainers = [
        Trainer(cfg, replace(opts, dedup_lookups=d), tag=f"dedup{int(d)}{tag}")
        for d in (False, True)
    ]
    for t in trainers:
        _seed_state(t, batches[0])
    unknown = np.int64(987_654_321)  # never observed: skipped in every history
    for b in batches:
        b.history[::3, -1] = unknown
        b.history[1::4, 0] = unknown  # the most recent entry unknown: the pool starts later
    before = _table(trainers[0], "item")
    _assert_train_alike(trainers, batches)
    after = _table(trainers[1], "item")
    assert max(np.abs(after[k] - before[k]).max() for k in before) > 1e-3  # it trained
    assert unknown not in after


@pytest.mark.parametrize(("dedup", "aux", "negatives"), [(True, 8.0, 8), (False, 1.5, 0)])
def test_fused_loss_trains_as_the_op_by_op_loss(dedup: bool, aux: float, negatives: int) -> None:
    """Full batches take the XLA-compiled loss, partial ones the op-by-op loss: every step
    (a partial batch last) leaves the same rows, accumulators and dense weights as the
    op-by-op loss everywhere, to float rounding."""
    batches = _batches(3, 24, seed=7)
    batches.append(batches[0].rows(slice(0, 17)))  # a partial batch: the op-by-op loss
    opts = TrainOptions(batch_size=24, eval_rows=4, learning_rate=0.3, aux_weight=aux,
                        sampled_negatives=negatives, dedup_lookups=dedup)
    trainers = [Trainer(CFG, replace(opts, fused_loss=f), tag=f"fused{int(f)}{int(dedup)}")
                for f in (False, True)]
    for t in trainers:
        _seed_state(t, batches[0])
    before = _table(trainers[0], "item")
    _assert_train_alike(trainers, batches)
    after = _table(trainers[1], "item")
    assert max(np.abs(after[k] - before[k]).max() for k in before) > 1e-3  # it trained


def test_sampled_negatives_are_trained_and_repeats_count_once() -> None:
    batches = _batches(2, 24, seed=5)
    opts = TrainOptions(eval_rows=0, learning_rate=0.3, sampled_negatives=8)
    trainer = Trainer(CFG, opts, tag="negs")
    trainer.train_step(batches[0])
    corpus = set(trainer.negatives.keys.tolist())
    assert corpus == set(np.unique(batches[0].item_keys).tolist())
    # Only items outside the second batch: rows that move were sampled negatives.
    outside = corpus - set(batches[1].item_keys.tolist()) - set(batches[1].history.ravel().tolist())
    assert outside
    before = {k: v for k, v in _table(trainer, "item").items() if k in outside}
    probe = tf.constant(sorted(corpus), tf.int64)
    q_before = trainer.freq.log_q(probe).numpy()
    trainer.train_step(batches[1])
    q_counted = trainer.freq.log_q(probe).numpy()
    trainer.train_step(batches[1], count=False)
    np.testing.assert_array_equal(trainer.freq.log_q(probe).numpy(), q_counted)
    assert not np.array_equal(q_before, q_counted)
    after = _table(trainer, "item")
    assert max(np.abs(after[k] - before[k]).max() for k in before) > 1e-4
    without = Trainer(CFG, replace(opts, sampled_negatives=0), tag="nonegs")
    without.train_step(batches[0])
    rows0 = {k: v for k, v in _table(without, "item").items() if k in outside}
    without.train_step(batches[1])
    rows1 = _table(without, "item")
    assert max(np.abs(rows1[k] - rows0[k]).max() for k in rows0) == 0.0


@pytest.mark.parametrize("dedup", [True, False])
def test_auxiliary_loss_adds_the_history_pool_softmax(dedup: bool) -> None:
    """``aux_weight`` adds ``weight * sum(w * ce) / sum(w)`` over the rows with a known
    history, ``ce`` being the main softmax with the normalised history pool (the user
    tower's, decay ``history_decay``) as the query; computed here in numpy from the seeded
    state."""
    from model.towers.loss import in_batch_softmax_loss_np

    batch = _batches(3, 24, seed=13)[2]
    batch.history[::5] = 0  # rows without history: no auxiliary term
    opts = TrainOptions(
        eval_rows=0, learning_rate=0.3, sampled_negatives=0, dedup_lookups=dedup, aux_weight=0.0
    )
    cfg = replace(CFG, history_decay=0.5)
    plain = Trainer(cfg, opts, tag=f"aux0{int(dedup)}")
    aux = Trainer(cfg, replace(opts, aux_weight=2.5), tag=f"aux1{int(dedup)}")
    for t in (plain, aux):
        _seed_state(t, batch)
    rows = _table(aux, "item")
    hist = batch.history[:, :HIST]
    known = hist != 0
    w_pos = np.where(known, 0.5 ** np.arange(HIST)[None, :], 0.0)
    w_pos /= np.maximum(w_pos.sum(axis=1, keepdims=True), 1e-12)
    dim = CFG.embedding_dim
    hrows = np.array([[rows[k] if k else np.zeros(dim) for k in r] for r in hist])
    query = (w_pos[..., None] * hrows).sum(axis=1)
    query /= np.maximum(np.linalg.norm(query, axis=1, keepdims=True), 1e-12)
    targets = np.array([rows[k] for k in batch.item_keys])
    targets /= np.linalg.norm(targets, axis=1, keepdims=True)
    loss_plain = plain.train_step(batch)
    loss_aux = aux.train_step(batch)
    log_q = aux.freq.log_q(tf.constant(batch.item_keys)).numpy()
    has = known.any(axis=1).astype(np.float64)
    assert 0 < has.sum() < len(has)
    w = batch.weights.astype(np.float64)
    ce_mean = in_batch_softmax_loss_np(
        query, targets, batch.item_keys, log_q, w * has, CFG.temperature, user_keys=batch.user_keys
    )
    expected = 2.5 * ce_mean * (w * has).sum() / w.sum()
    assert expected > 0.1
    assert loss_aux - loss_plain == pytest.approx(expected, rel=1e-4)


def test_auxiliary_weight_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="aux_weight"):
        TrainOptions(aux_weight=-1.0)


def test_evaluation_on_its_thread_scores_the_same_as_inline() -> None:
    """``eval_async``: each batch's head is scored on the evaluation thread against the
    candidates of its own refresh, however many pieces wait for it (``eval_queue``); the
    figures, the learnt mix and the co-visitation counts equal the inline evaluation's."""
    batches = _batches(6, 48, seed=17)
    opts = TrainOptions(eval_rows=16, eval_every=1, eval_refresh_steps=2, learning_rate=0.3)
    variants = [{"eval_async": False}, {"eval_async": True, "eval_queue": 1},
                {"eval_async": True, "eval_queue": 3}]
    trainers = [Trainer(CFG, replace(opts, **v), tag=f"evalasync{i}") for i, v in enumerate(variants)]
    for t in trainers:
        for b in batches:
            t.fit_batch(b)
    inline, *threaded = (t.quality() for t in trainers)
    assert threaded == [inline, inline]
    assert inline["evaluated_samples"] == 6 * 16
    assert inline["recall@10"] > 0.0  # something was hit: the comparison is not of zeros
    weights = [t.mixer.as_dict() for t in trainers]
    assert trainers[0].mixer.updates > 0  # the mix learnt: the comparison is not of its start
    assert weights[1] == weights[0] and weights[2] == weights[0]
    covisit = [t.covisit.row_sums(batches[-1].history) for t in trainers if t.covisit]
    assert len(covisit) == 3 and covisit[0][0].size > 0
    for other in covisit[1:]:
        for a, b in zip(covisit[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="eval_queue"):
        TrainOptions(eval_queue=0)


def test_partial_batches_get_spare_epochs_full_ones_one_step() -> None:
    """``spare_epochs=3``: a partial batch is trained by three optimizer steps, a full one
    by one; the further passes count no frequency and teach the co-visitation nothing, and
    the head is scored with the vectors from before the first pass (the same figures as one
    pass)."""
    batches = _batches(3, 48, seed=23)
    opts = TrainOptions(batch_size=64, eval_rows=16, eval_every=1, learning_rate=0.3)
    one, three = (Trainer(CFG, replace(opts, spare_epochs=n), tag=f"spare{n}") for n in (1, 3))
    for t in (one, three):
        t.fit_batch(batches[0])  # 48 < 64: partial
    assert (int(one.step.numpy()), int(three.step.numpy())) == (1, 3)
    assert one.quality() == three.quality()  # scored before any pass
    keys = tf.constant(batches[0].item_keys, tf.int64)
    np.testing.assert_array_equal(one.freq.log_q(keys).numpy(), three.freq.log_q(keys).numpy())
    assert one.covisit is not None and three.covisit is not None
    for a, b in zip(one.covisit.row_sums(batches[1].history),
                    three.covisit.row_sums(batches[1].history), strict=True):
        np.testing.assert_array_equal(a, b)
    rows = [t.user_vectors(batches[1].user_keys, batches[1].history) for t in (one, three)]
    assert not np.allclose(rows[0], rows[1])  # the further passes moved the model
    full = Trainer(CFG, replace(opts, batch_size=48, spare_epochs=3), tag="spare_full")
    full.fit_batch(batches[0])
    assert int(full.step.numpy()) == 1
    with pytest.raises(ValueError, match="spare_epochs"):
        TrainOptions(spare_epochs=0)


def test_eval_every_scores_every_nth_batch_and_still_counts_all() -> None:
    """``eval_every=3`` over 6 full batches scores the heads of batches 0 and 3 only, while
    the popularity baseline and the co-visitation still learn every batch; a partial batch
    (a slow stream) is always scored."""
    batches = _batches(6, 48, seed=17)
    t = Trainer(CFG, TrainOptions(batch_size=48, eval_rows=16, eval_every=3,
                                  eval_refresh_steps=2, learning_rate=0.3), tag="evalevery")
    for b in batches:
        t.fit_batch(b)
    assert t.quality()["evaluated_samples"] == 2 * 16
    t.fit_batch(batches[0].rows(slice(0, 20)))
    assert t.quality()["evaluated_samples"] == 2 * 16 + 16
    assert t.evaluator.popularity.total == sum(len(b) for b in batches) + 20
    with pytest.raises(ValueError, match="eval_every"):
        TrainOptions(eval_every=0)
