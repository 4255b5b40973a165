"""Streaming item-frequency estimate by decayed counts (``TrainOptions.logq_estimator="count"``).

The estimate serves twice: as ``log q`` of the logQ correction (``model.towers.loss``) and as
the popularity prior (``model.scoring.prior``); both want ``q_i`` = expected occurrences of
item i per training step. Yi et al.'s gap estimator keeps an item seen a few times near its
first-sighting gap, so items that appeared early look popular whatever their count; decayed
counts per hash bucket (half-life in samples, so it means the same at any batch size) avoid
that. The update rule: docs/internals.md. :class:`CountFrequencyNp` is the numpy reference
the TF code is tested against.
"""

from __future__ import annotations

import numpy as np

from model.towers.tf_env import tf

#: Count given to a bucket never seen (a small probability, as loss.INITIAL_GAP gives).
MIN_COUNT = 1e-6


class CountFrequencyEstimator(tf.Module):
    """Decayed-count estimate of each item's occurrences per batch (see the module doc)."""

    def __init__(
        self, buckets: int = 1 << 20, half_life: float = 0.0, name: str = "freq_count"
    ) -> None:
        super().__init__(name=name)
        if buckets < 1 or half_life < 0.0:
            raise ValueError("buckets must be >= 1 and half_life >= 0")
        self.buckets = int(buckets)
        self.half_life = float(half_life)
        self.count = tf.Variable(tf.zeros([self.buckets], tf.float32), trainable=False, name="C")
        self.last = tf.Variable(tf.zeros([self.buckets], tf.float32), trainable=False, name="A")
        self.batches = tf.Variable(0.0, trainable=False, name="S")
        self.time = tf.Variable(0.0, trainable=False, name="t")

    def _bucket(self, keys: tf.Tensor) -> tf.Tensor:
        return tf.math.floormod(tf.cast(keys, tf.int64), tf.constant(self.buckets, tf.int64))

    def _decay(self, dt: tf.Tensor) -> tf.Tensor:
        if not self.half_life:
            return tf.ones_like(dt)
        return tf.pow(2.0, -dt / self.half_life)

    def log_q(self, keys: tf.Tensor) -> tf.Tensor:
        """log of the estimated occurrences per batch of each key, float32, shape of ``keys``."""
        b = self._bucket(keys)
        c = tf.gather(self.count, b) * self._decay(self.time - tf.gather(self.last, b))
        return tf.math.log(tf.maximum(c, MIN_COUNT)) - tf.math.log(tf.maximum(self.batches, 1.0))

    def update(self, keys: tf.Tensor) -> tf.Tensor:
        """Record one batch of keys; returns the new time (samples recorded so far)."""
        flat = tf.reshape(self._bucket(keys), [-1])
        n = tf.cast(tf.size(flat), tf.float32)
        t = self.time.assign_add(n)
        self.batches.assign(self.batches * self._decay(n) + 1.0)
        buckets, _, occurrences = tf.unique_with_counts(flat)
        c = tf.gather(self.count, buckets) * self._decay(t - tf.gather(self.last, buckets))
        self.count.scatter_nd_update(buckets[:, None], c + tf.cast(occurrences, tf.float32))
        self.last.scatter_nd_update(buckets[:, None], tf.fill(tf.shape(c), t))
        return t


class CountFrequencyNp:
    """Numpy reference of :class:`CountFrequencyEstimator`."""

    def __init__(self, buckets: int, half_life: float) -> None:
        self.half_life = half_life
        self.count = np.zeros(buckets)
        self.last = np.zeros(buckets)
        self.batches = 0.0
        self.time = 0.0

    def _decay(self, dt: np.ndarray | float) -> np.ndarray:
        dt = np.asarray(dt, np.float64)
        return 2.0 ** (-dt / self.half_life) if self.half_life else np.ones_like(dt)

    def update(self, keys: np.ndarray) -> None:
        flat = np.mod(np.asarray(keys, np.int64).reshape(-1), self.count.shape[0])
        self.time += flat.size
        self.batches = self.batches * float(self._decay(flat.size)) + 1.0
        buckets, occurrences = np.unique(flat, return_counts=True)
        self.count[buckets] = self.count[buckets] * self._decay(self.time - self.last[buckets]) + occurrences
        self.last[buckets] = self.time

    def log_q(self, keys: np.ndarray) -> np.ndarray:
        b = np.mod(np.asarray(keys, np.int64), self.count.shape[0])
        c = self.count[b] * self._decay(self.time - self.last[b])
        return np.log(np.maximum(c, MIN_COUNT)) - np.log(max(self.batches, 1.0))
