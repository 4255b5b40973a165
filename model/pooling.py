"""History pooling of the user tower in numpy (no TensorFlow): the served twin of
``model.two_tower.pool_weights``.

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
