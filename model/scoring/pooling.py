"""History pooling of the user tower in numpy (no TensorFlow): the served twin of
``model.towers.two_tower.pool_weights``.

A user's history (most recent first) is cut to the model's window; the entries the model
knows (an item row exists) are pooled with weights ``decay ** position`` (position in the
window, 0 = most recent), normalised to sum 1: the recency-weighted mean (``decay`` 1 =
plain mean). A history without known entries pools to zeros.
"""

from __future__ import annotations

import numpy as np


def pool_weights(found: np.ndarray, decay: float) -> np.ndarray:
    """Weights of the known entries (``found``: bool ``[L]`` over the window), float32, summing
    to 1 (empty when nothing is known)."""
    pos = np.flatnonzero(found)
    if decay == 1.0:
        w = np.ones(pos.size, np.float32)
    else:
        w = np.power(np.float32(decay), pos.astype(np.float32)).astype(np.float32)
    return w / np.float32(w.sum()) if w.size else w


def pool_history(positions: np.ndarray, found: np.ndarray, rows: np.ndarray, decay: float) -> np.ndarray:
    """The pooled history ``[e_h]``; ``positions[j]`` is the row in ``rows`` of window entry j
    (valid where ``found[j]``)."""
    if not found.any():
        return np.zeros(rows.shape[1], np.float32)
    return np.asarray(pool_weights(found, decay) @ rows[positions[found]], np.float32)


Layer = tuple[np.ndarray, np.ndarray, str]


def fold_pool_residual(layers: list[Layer], user_dim: int, beta: float) -> list[Layer]:
    """Dense layers computing ``MLP(x) + beta * pool`` where ``x = concat(user row [user_dim],
    pool)`` and ``MLP`` is ``layers`` (relu between, last linear): the user tower with
    ``ModelConfig.pool_residual`` in the artifact's plain layer format.

    One layer: ``W + beta * [0; I]``. More: the first layer also outputs ``pool`` and
    ``-pool``, the relu layers pass both on (identity blocks; both are >= 0 after the first
    relu), and the last one adds ``beta * (relu(pool) - relu(-pool)) = beta * pool``. Exact
    up to float rounding; the hidden layers grow by ``2 * len(pool)`` units.
    """
    out = [(np.asarray(w, np.float32), np.asarray(b, np.float32), act) for w, b, act in layers]
    if not beta:
        return out
    if not out or out[-1][2] != "linear" or any(act != "relu" for _, _, act in out[:-1]):
        raise ValueError("pool_residual needs relu hidden layers and a last linear layer")
    width = out[0][0].shape[0]
    pool_dim = width - user_dim
    if pool_dim != out[-1][0].shape[1]:
        raise ValueError(f"pool width {pool_dim} differs from the tower output {out[-1][0].shape[1]}")
    eye = np.eye(pool_dim, dtype=np.float32)
    select = np.concatenate([np.zeros((user_dim, pool_dim), np.float32), eye], axis=0)
    if len(out) == 1:
        w, b, act = out[0]
        return [(w + np.float32(beta) * select, b, act)]
    zeros = np.zeros(2 * pool_dim, np.float32)
    w, b, act = out[0]
    folded = [(np.concatenate([w, select, -select], axis=1), np.concatenate([b, zeros]), act)]
    for w, b, act in out[1:-1]:
        w2 = np.zeros((w.shape[0] + 2 * pool_dim, w.shape[1] + 2 * pool_dim), np.float32)
        w2[: w.shape[0], : w.shape[1]] = w
        w2[w.shape[0] :, w.shape[1] :] = np.eye(2 * pool_dim, dtype=np.float32)
        folded.append((w2, np.concatenate([b, zeros]), act))
    w, b, act = out[-1]
    folded.append((np.concatenate([w, np.float32(beta) * eye, -np.float32(beta) * eye], axis=0), b, act))
    return folded
