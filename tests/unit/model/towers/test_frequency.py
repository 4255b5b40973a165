"""Decayed-count item-frequency estimate (``model.towers.frequency``) and the uniform negative sampler."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model.towers.frequency import CountFrequencyEstimator, CountFrequencyNp
from model.towers.tf_env import tf
from model.trainer.negatives import NegativeSampler


@pytest.mark.parametrize("half_life", [0.0, 40.0])
def test_count_estimator_matches_numpy(half_life: float) -> None:
    rng = np.random.default_rng(1)
    est, ref = CountFrequencyEstimator(64, half_life), CountFrequencyNp(64, half_life)
    probe = np.array([3, 5, 11, -7, 2**62 + 1], np.int64)
    for _ in range(60):
        keys = rng.choice(probe[:4], size=int(rng.integers(1, 9)))
        est.update(tf.constant(keys))
        ref.update(keys)
        np.testing.assert_allclose(est.log_q(tf.constant(probe)).numpy(), ref.log_q(probe), rtol=1e-4, atol=1e-4)


def test_count_estimate_is_occurrences_per_batch_and_forgets() -> None:
    est = CountFrequencyEstimator(1024, half_life=0.0)
    for t in range(100):
        est.update(tf.constant([3, 3] + ([5] if t % 4 == 0 else []), tf.int64))
    q = np.exp(est.log_q(tf.constant([3, 5, 9], tf.int64)).numpy())
    assert q[0] == pytest.approx(2.0, rel=1e-4)
    assert q[1] == pytest.approx(0.25, rel=1e-4)
    assert q[2] < 1e-6  # never seen
    decayed = CountFrequencyEstimator(1024, half_life=20.0)
    for _ in range(50):
        decayed.update(tf.constant([3], tf.int64))
    for _ in range(50):
        decayed.update(tf.constant([5], tf.int64))
    q3, q5 = np.exp(decayed.log_q(tf.constant([3, 5], tf.int64)).numpy())
    assert q5 > 0.8 and q3 < 0.2 * q5  # the recent item dominates


def test_negative_sampler_draws_distinct_known_keys_uniformly() -> None:
    sampler = NegativeSampler(4, seed=3)
    assert sampler.draw()[0].size == 0
    sampler.add(np.array([10, 11, 10]))
    keys, log_p = sampler.draw()
    assert sorted(keys.tolist()) == [10, 11] and log_p == 0.0  # smaller corpus: all of it
    sampler.add(np.arange(100, 120))
    assert len(sampler) == 22
    seen = np.zeros(22)
    for _ in range(2000):
        keys, log_p = sampler.draw()
        assert keys.size == 4 and np.unique(keys).size == 4
        assert log_p == pytest.approx(math.log(4 / 22))
        seen[np.searchsorted(np.sort(sampler.keys), keys)] += 1
    assert seen.min() > 0.7 * seen.mean() and seen.max() < 1.3 * seen.mean()
    sampler.reset(np.array([7, 8]))
    assert sorted(sampler.keys.tolist()) == [7, 8]
