"""An item's attribute part, as versions, deltas and serving compute it (numpy only).

With attribute slots (``ModelConfig.attr_tokens``) an item's row is its id row (the item
table's shared default row for an item without one) plus its attribute part: the sum of its
attribute keys' rows, each times its weight (``feature_store.catalogue.attribute_row``: 1/n
per slot token, 0 on the padding). The trainer's export and serving's delta state compose
with this one function, in the same float32 order, so what serving holds equals a full
version bit for bit; the training step composes the same sum in TensorFlow
(``TwoTower.attr_compose``).
"""

from __future__ import annotations

import numpy as np

from model.scoring.sorted_keys import find_sorted


def attribute_parts(tokens: np.ndarray, weights: np.ndarray, table_keys: np.ndarray,
                    table_rows: np.ndarray) -> np.ndarray:
    """``[n, d]`` float32: per item (a row of ``tokens`` ``[n, T]`` int64 and ``weights``
    ``[n, T]``), the sum of its tokens' rows times their weights, token by token in order.
    ``table_keys`` sorted, ``table_rows`` ``[a, d]`` theirs; a token with weight 0, or
    without a row, adds nothing. One dense pass per token position (an unused entry adds
    ``0 * row``): fancy-indexed updates of the used entries only took ~3x as long."""
    tokens = np.asarray(tokens, np.int64)
    weights = np.asarray(weights, np.float32)
    n = tokens.shape[0]
    d = table_rows.shape[1] if table_rows.ndim == 2 else 0
    out = np.zeros((n, d), np.float32)
    if not n or not table_keys.size:
        return out
    pos, found = find_sorted(table_keys, tokens)
    w = np.where(found & (weights > 0), weights, np.float32(0.0))
    used = np.flatnonzero(w.any(axis=0))
    rows = np.ascontiguousarray(table_rows, np.float32)
    term = np.empty((n, d), np.float32)
    for j in range(int(used[-1]) + 1 if used.size else 0):
        np.take(rows, pos[:, j], axis=0, out=term)
        term *= w[:, j, None]
        out += term
    return out
