"""Learned weights of the parts of the retrieval score (numpy only).

The served score is ``score(u, i) = sum_k w_k * f_k(u, i)`` over parts such as
``(<u, v_i> / T, log q_i, log1p(covisit s_i))``. :class:`ScoreMixer` learns the weights from
the stream by the towers' rule (softmax cross-entropy of the true next item) on scores
computed before the model learns from the events (test-then-train), so it fits how the parts
generalise, not how they memorise: per scored row ``p = softmax(sum_k w_k f_k)``, gradient
``sum_n p_n f_k[n] - f_k[target]``, averaged, one Adagrad step. Weights start at the former
constants and stay within ``[min_weight, max_weight]``: a part can be turned (nearly) off,
never into its opposite.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ScoreMixer:
    """Weights of named score parts, learned online by softmax cross-entropy (module doc)."""

    def __init__(
        self,
        names: Sequence[str],
        initial: Sequence[float],
        lr: float = 0.05,
        max_weight: float = 10.0,
        min_weight: float = 1e-3,
        learn: Sequence[bool] | None = None,
    ) -> None:
        if len(names) != len(initial) or not names:
            raise ValueError("one initial weight per part name is required")
        if lr <= 0 or not 0 <= min_weight < max_weight:
            raise ValueError("lr must be > 0 and 0 <= min_weight < max_weight")
        self.names = tuple(names)
        self.weights = np.asarray(initial, np.float64).copy()
        self.learn_mask = np.ones(len(names), bool) if learn is None else np.asarray(learn, bool)
        self.lr = float(lr)
        self.max_weight = float(max_weight)
        self.min_weight = float(min_weight)
        self.accum = np.full(len(names), 1e-8)
        self.updates = 0

    def as_dict(self) -> dict[str, float]:
        return {name: float(w) for name, w in zip(self.names, self.weights, strict=True)}

    def score(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """``sum_k w_k * parts[k]`` (all of one shape); ``-inf`` in the first part stays."""
        out = np.zeros(np.shape(parts[0]), np.float64)
        for w, f in zip(self.weights, parts, strict=True):
            out += w * np.where(np.isfinite(f), f, 0.0)
        return np.where(np.isfinite(parts[0]), out, -np.inf)

    def update(self, parts: Sequence[np.ndarray], target_pos: np.ndarray) -> float | None:
        """One Adagrad step on rows ``[B, N]`` of candidate parts; ``target_pos[b]`` is the
        target's column (-1: not a candidate, the row is skipped). Candidates whose first
        part is not finite are not candidates. Returns the mean loss, or None (no row)."""
        target_pos = np.asarray(target_pos, np.int64)
        rows = np.flatnonzero(target_pos >= 0)
        if rows.size == 0:
            return None
        cols = target_pos[rows]
        valid = np.isfinite(np.asarray(parts[0])[rows])
        keep = valid[np.arange(rows.size), cols]
        if not keep.any():
            return None
        rows, cols, valid = rows[keep], cols[keep], valid[keep]
        # the parts as one [K, B, N] array: one gather per part, then whole-array passes
        feats = np.empty((len(parts), rows.size, valid.shape[1]))
        for k, f in enumerate(parts):
            feats[k] = np.asarray(f)[rows]
        np.copyto(feats, 0.0, where=~(np.isfinite(feats) & valid))
        r = np.arange(cols.size)
        logits = np.tensordot(self.weights, feats, axes=1)
        logits[~valid] = -np.inf
        top = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - top)
        z = e.sum(axis=1, keepdims=True)
        p = e / z
        loss = float(np.mean(np.log(z[:, 0]) + top[:, 0] - logits[r, cols]))
        flat = feats.reshape(len(parts), -1)
        grad = (flat @ p.reshape(-1) - feats[:, r, cols].sum(axis=1)) / cols.size
        grad = np.where(self.learn_mask, grad, 0.0)
        self.accum += grad * grad
        self.weights = np.clip(self.weights - self.lr * grad / np.sqrt(self.accum),
                               self.min_weight, self.max_weight)
        self.updates += 1
        return loss

    def state(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint (restored by :meth:`load_state`)."""
        return {"weights": self.weights.copy(), "accum": self.accum.copy(),
                "updates": np.asarray(self.updates, np.int64)}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        weights = np.asarray(state["weights"], np.float64)
        if weights.shape != self.weights.shape:
            raise ValueError(f"mixer state has {weights.size} weights, expected {self.weights.size}")
        self.weights = weights.copy()
        self.accum = np.asarray(state["accum"], np.float64).copy()
        self.updates = int(state["updates"])
