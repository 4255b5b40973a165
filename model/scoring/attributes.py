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

#: Items per block of :func:`parts_of`.
BLOCK = 4096


def attribute_parts(tokens: np.ndarray, weights: np.ndarray, table_keys: np.ndarray,
                    table_rows: np.ndarray) -> np.ndarray:
    """``[n, d]`` float32: per item (a row of ``tokens`` ``[n, T]`` int64 and ``weights``
    ``[n, T]``), the sum of its tokens' rows times their weights, token by token in order.
    ``table_keys`` sorted, ``table_rows`` ``[a, d]`` theirs; a token with weight 0, or
    without a row, adds nothing. :func:`token_rows` then :func:`parts_of`."""
    return parts_of(*token_rows(tokens, weights, table_keys), table_rows)


def token_rows(tokens: np.ndarray, weights: np.ndarray, table_keys: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(pos, w)`` ``[n, T]``: each token's row in the table of sorted ``table_keys`` and
    its weight in the sum (0: weight 0, or no row). They hold while the table's keys do, so
    a caller keeps them across moves of its rows (``model.delta.state.Attributes``)."""
    tokens = np.asarray(tokens, np.int64)
    weights = np.asarray(weights, np.float32)
    if not table_keys.size:
        return np.zeros(tokens.shape, np.int64), np.zeros(tokens.shape, np.float32)
    pos, found = find_sorted(table_keys, tokens)
    return pos, np.where(found & (weights > 0), weights, np.float32(0.0))


def parts_of(pos: np.ndarray, w: np.ndarray, table_rows: np.ndarray) -> np.ndarray:
    """``[n, d]`` float32 of :func:`token_rows`' ``(pos, w)`` over ``table_rows``: per item,
    ``sum_j w[:, j] * table_rows[pos[:, j]]`` in the order of ``j``. One dense pass per token
    position (an unused entry adds ``0 * row``; fancy-indexed updates of the used entries
    only took ~3x as long), over blocks of :data:`BLOCK` items, so a block's sum and term
    stay in cache across the positions (half the time of whole-column passes at 120k
    items); the sums are the same either way, element by element."""
    n = pos.shape[0]
    d = table_rows.shape[1] if table_rows.ndim == 2 else 0
    out = np.zeros((n, d), np.float32)
    used = np.flatnonzero(w.any(axis=0)) if n else np.zeros(0, np.int64)
    if not used.size:
        return out
    rows = np.ascontiguousarray(table_rows, np.float32)
    term = np.empty((min(n, BLOCK), d), np.float32)
    for lo in range(0, n, BLOCK):
        hi = min(n, lo + BLOCK)
        t, o = term[: hi - lo], out[lo:hi]
        for j in range(int(used[-1]) + 1):
            np.take(rows, pos[lo:hi, j], axis=0, out=t)
            t *= w[lo:hi, j, None]
            o += t
    return out
