"""In-batch softmax with logQ correction and the streaming frequency estimator vs numpy."""

from __future__ import annotations

import numpy as np
import pytest

from model.towers.loss import (
    FrequencyEstimator,
    frequency_update_np,
    in_batch_softmax_loss,
    in_batch_softmax_loss_np,
)
from model.towers.tf_env import tf


def _batch(rng: np.random.Generator, b: int = 12, d: int = 8) -> tuple[np.ndarray, ...]:
    u = rng.normal(size=(b, d)).astype(np.float32)
    v = rng.normal(size=(b, d)).astype(np.float32)
    keys = rng.integers(1, 6, size=b).astype(np.int64)  # few distinct items: duplicates
    log_q = np.log(rng.uniform(0.01, 0.5, size=b)).astype(np.float32)
    w = rng.choice([1.0, 2.0, 5.0], size=b).astype(np.float32)
    return u, v, keys, log_q, w


@pytest.mark.parametrize("num_groups", [1, 3])
@pytest.mark.parametrize("temperature", [1.0, 0.1])
def test_loss_matches_numpy_reference(num_groups: int, temperature: float) -> None:
    u, v, keys, log_q, w = _batch(np.random.default_rng(num_groups))
    got = float(in_batch_softmax_loss(u, v, keys, log_q, w, temperature, num_groups))
    want = in_batch_softmax_loss_np(u, v, keys, log_q, w, temperature, num_groups)
    assert got == pytest.approx(want, rel=1e-4)


def test_logq_correction_changes_the_loss_as_a_per_column_shift() -> None:
    u, v, keys, log_q, w = _batch(np.random.default_rng(1))
    keys = np.arange(1, keys.size + 1, dtype=np.int64)
    plain = float(in_batch_softmax_loss(u, v, keys, np.zeros_like(log_q), w))
    corrected = float(in_batch_softmax_loss(u, v, keys, log_q, w))
    assert corrected != pytest.approx(plain, rel=1e-3)
    # A constant log q shifts every logit of a row equally: softmax (and the loss) unchanged.
    constant = float(in_batch_softmax_loss(u, v, keys, np.full_like(log_q, -3.0), w))
    assert constant == pytest.approx(plain, rel=1e-5)
    # Hand check of one row: logits u_i.v_j - log q_j, cross-entropy at the diagonal.
    logits = u @ v.T - log_q[None, :]
    ce = -(logits[0, 0] - np.log(np.exp(logits[0]).sum()))
    only_first = np.eye(1, keys.size, dtype=np.float32)[0]
    single = float(in_batch_softmax_loss(u, v, keys, log_q, only_first))
    assert single == pytest.approx(ce, rel=1e-4)


def test_duplicate_items_are_not_negatives() -> None:
    rng = np.random.default_rng(2)
    u = rng.normal(size=(2, 4)).astype(np.float32)
    v = rng.normal(size=(2, 4)).astype(np.float32)
    same = np.array([7, 7], np.int64)
    zeros = np.zeros(2, np.float32)
    loss = float(in_batch_softmax_loss(u, v, same, zeros, np.ones(2, np.float32)))
    # Only the positive is left in each row: softmax over one logit -> zero loss.
    assert loss == pytest.approx(0.0, abs=1e-6)


def test_sum_reduction_is_weighted_total() -> None:
    u, v, keys, log_q, w = _batch(np.random.default_rng(3))
    mean = float(in_batch_softmax_loss(u, v, keys, log_q, w))
    total = float(in_batch_softmax_loss(u, v, keys, log_q, w, reduce="sum"))
    assert total == pytest.approx(mean * w.sum(), rel=1e-5)


def test_frequency_estimator_matches_numpy_and_converges() -> None:
    buckets, alpha = 64, 0.1
    est = FrequencyEstimator(buckets=buckets, alpha=alpha)
    last = np.zeros(buckets, np.float32)
    gap = np.full(buckets, 1e6, np.float32)
    step = 0.0
    every_step, every_fifth = np.int64(3), np.int64(5)
    for t in range(200):
        batch = [every_step] + ([every_fifth] if t % 5 == 0 else [])
        keys = np.array(batch, np.int64)
        est.update(tf.constant(keys))
        step = frequency_update_np(last, gap, step, keys, alpha)
    np.testing.assert_allclose(est.gap.numpy(), gap, rtol=1e-5)
    np.testing.assert_allclose(est.last_step.numpy(), last)
    q = np.exp(est.log_q(tf.constant([every_step, every_fifth, np.int64(11)])).numpy())
    assert q[0] == pytest.approx(1.0, rel=0.02)
    assert q[1] == pytest.approx(0.2, rel=0.05)
    assert q[2] < 1e-5  # never seen


def test_frequency_estimator_hashes_negative_keys_into_range() -> None:
    est = FrequencyEstimator(buckets=16, alpha=0.5)
    keys = tf.constant([-(2**63) + 1, -5, 2**62 + 2], tf.int64)  # buckets 1, 11, 2
    est.update(keys)
    assert np.isfinite(est.log_q(keys).numpy()).all()
    assert int((est.last_step.numpy() > 0).sum()) == 3


@pytest.mark.parametrize("temperature", [1.0, 0.1])
def test_mixed_negatives_and_own_user_mask_match_numpy_reference(temperature: float) -> None:
    rng = np.random.default_rng(7)
    u, v, keys, log_q, w = _batch(rng)
    users = rng.integers(0, 3, size=keys.size).astype(np.int64)
    neg_v = rng.normal(size=(9, u.shape[1])).astype(np.float32)
    neg_keys = np.concatenate([keys[:2], rng.integers(10, 20, size=7)]).astype(np.int64)
    neg_lq = np.full(9, np.log(9 / 40), np.float32)
    valid = np.array([True] * 8 + [False])
    extra = dict(user_keys=users, neg_vecs=neg_v, neg_keys=neg_keys, neg_log_q=neg_lq, neg_valid=valid)
    got = float(in_batch_softmax_loss(u, v, keys, log_q, w, temperature, **extra))
    want = in_batch_softmax_loss_np(u, v, keys, log_q, w, temperature, **extra)
    assert got == pytest.approx(want, rel=1e-4)
    # Each part changes the loss: the negatives add terms, the mask removes some.
    plain = in_batch_softmax_loss_np(u, v, keys, log_q, w, temperature)
    assert want != pytest.approx(plain, rel=1e-3)
    masked_only = in_batch_softmax_loss_np(u, v, keys, log_q, w, temperature, user_keys=users)
    assert masked_only < plain


def test_sampled_negative_equal_to_the_positive_or_invalid_is_ignored() -> None:
    u, v, keys, log_q, w = _batch(np.random.default_rng(2))
    base = float(in_batch_softmax_loss(u, v, keys, log_q, w))
    big = np.full((2, u.shape[1]), 50.0, np.float32)  # would dominate every row if counted
    lq = np.zeros(2, np.float32)
    all_hits = float(
        in_batch_softmax_loss(
            u, v, keys, log_q, w, neg_vecs=big, neg_keys=np.array([99, 98]),
            neg_log_q=lq, neg_valid=np.array([False, False]),
        )
    )
    assert all_hits == pytest.approx(base, rel=1e-5)
    same = np.full(keys.size, keys[0])
    one_row = float(
        in_batch_softmax_loss(
            u[:1], v[:1], keys[:1], log_q[:1], w[:1], neg_vecs=big[:1], neg_keys=same[:1],
            neg_log_q=lq[:1],
        )
    )
    assert one_row == pytest.approx(0.0, abs=1e-6)


def test_stacked_query_sets_sum_the_separate_losses() -> None:
    """Two query sets stacked in one call (``[2B, d]``) give the sum of the two calls."""
    rng = np.random.default_rng(11)
    b, d, s = 12, 6, 5
    u1, u2 = rng.normal(size=(b, d)), rng.normal(size=(b, d))
    v, negs = rng.normal(size=(b, d)), rng.normal(size=(s, d))
    keys = rng.integers(1, 6, size=b).astype(np.int64)
    users = rng.integers(1, 4, size=b).astype(np.int64)
    neg_keys = rng.integers(1, 8, size=s).astype(np.int64)
    log_q = rng.normal(size=b)
    w1, w2 = rng.uniform(0.5, 2.0, size=b), rng.uniform(0.0, 2.0, size=b)
    extra = {
        "user_keys": users,
        "neg_vecs": negs.astype(np.float32),
        "neg_keys": neg_keys,
        "neg_log_q": np.full(s, -1.5, np.float32),
        "neg_valid": np.arange(s) != 2,
    }

    def call(u: np.ndarray, w: np.ndarray) -> float:
        return float(
            in_batch_softmax_loss(
                u.astype(np.float32), v.astype(np.float32), keys, log_q.astype(np.float32),
                w.astype(np.float32), 0.5, 2, "sum", **extra,
            )
        )

    separate = call(u1, w1) + call(u2, w2)
    stacked = call(np.concatenate([u1, u2]), np.concatenate([w1, w2]))
    assert stacked == pytest.approx(separate, rel=1e-5)
    assert call(u2, w2) > 0.1  # the second set contributes
