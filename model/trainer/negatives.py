"""Uniform item sampler of the mixed negative sampling (``TrainOptions.sampled_negatives``).

Reference: J. Yang et al., "Mixed Negative Sampling for Learning Two-tower Neural Networks
in Recommendations", WWW 2020. In-batch negatives are drawn by popularity (and, in a stream
of sessions, mostly from the few users of the batch); a second set of negatives drawn
uniformly from the item corpus lets the model contrast each positive with the long tail.

The corpus is every item key the trainer has trained on as a target (the trainer resets it
from the item table after a restart or an eviction). Each step draws ``count`` distinct keys
uniformly (all keys when the corpus is smaller); a key is then in the sample with
probability ``count / corpus size``, whose log is the logQ correction of those columns
(``model.towers.loss.in_batch_softmax_loss``). Numpy only; the random generator is seeded.
"""

from __future__ import annotations

import math

import numpy as np


class NegativeSampler:
    """A growing set of item keys and a uniform draw of ``count`` of them per step."""

    def __init__(self, count: int, seed: int = 0) -> None:
        if count < 0:
            raise ValueError("count must be >= 0")
        self.count = int(count)
        self._rng = np.random.default_rng(seed)
        self._keys = np.zeros(1024, np.int64)
        self._size = 0
        self._seen: set[int] = set()
        self.ready = False

    def __len__(self) -> int:
        return self._size

    @property
    def keys(self) -> np.ndarray:
        return self._keys[: self._size]

    def reset(self, keys: np.ndarray) -> None:
        """Replace the corpus by ``keys`` (distinct item keys)."""
        keys = np.unique(np.asarray(keys, np.int64))
        self._keys = np.zeros(max(1024, 2 * keys.size), np.int64)
        self._keys[: keys.size] = keys
        self._size = int(keys.size)
        self._seen = set(keys.tolist())
        self.ready = True

    def add(self, keys: np.ndarray) -> None:
        """Add the keys not in the corpus yet (in first-seen order)."""
        if not self.count:
            return
        self.ready = True
        values = np.asarray(keys, np.int64).tolist()
        if self._seen.issuperset(values):  # the usual batch once the corpus is warm
            return
        fresh = [k for k in dict.fromkeys(values) if k not in self._seen]
        if not fresh:
            return
        need = self._size + len(fresh)
        if need > self._keys.size:
            grown = np.zeros(max(need, 2 * self._keys.size), np.int64)
            grown[: self._size] = self._keys[: self._size]
            self._keys = grown
        self._keys[self._size : need] = fresh
        self._size = need
        self._seen.update(fresh)

    def draw(self) -> tuple[np.ndarray, float]:
        """(distinct keys, log of each key's probability of being drawn this step)."""
        n = self._size
        if not self.count or n == 0:
            return np.zeros(0, np.int64), 0.0
        if n <= self.count:
            return self.keys.copy(), 0.0
        picked = self._rng.choice(n, self.count, replace=False)
        return self._keys[picked], math.log(self.count / n)
