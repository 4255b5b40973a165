"""History pooling of the user tower in numpy (no TensorFlow): the served twin of
``model.two_tower.pool_weights`` / ``last_weights``.

A user's history (most recent first) is cut to the model's window; the entries the model
knows (an item row exists) are pooled with weights ``decay ** position`` (position in the
window, 0 = most recent), normalised to sum 1: the recency-weighted mean (``decay`` 1 =
plain mean). With ``last_item`` the row of the most recent known entry is a second input.
Rows without known entries pool to zeros.
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


def pool_history(
    positions: np.ndarray,
    found: np.ndarray,
    rows: np.ndarray,
    decay: float,
    last_item: bool,
) -> list[np.ndarray]:
    """Pooled inputs of one history: ``[pool]`` or ``[pool, last row]`` (each ``[e_h]``).

    ``positions[j]`` is the row in ``rows`` of window entry j (valid where ``found[j]``).
    """
    dim = rows.shape[1]
    if not found.any():
        return [np.zeros(dim, np.float32) for _ in range(2 if last_item else 1)]
    known = rows[positions[found]]
    out = [pool_weights(found, decay) @ known]
    if last_item:
        out.append(known[0])
    return [np.asarray(x, np.float32) for x in out]
