"""An item's attribute part (``model.scoring.attributes``): the blocked sum equals the sum
of whole columns bit for bit, and positions found once serve later rows of the table."""

from __future__ import annotations

import numpy as np

from model.scoring import attributes
from model.scoring.attributes import BLOCK, attribute_parts, parts_of, token_rows


def _column_sums(tokens: np.ndarray, weights: np.ndarray, keys: np.ndarray,
                 rows: np.ndarray) -> np.ndarray:
    """The plain rule: per token position in order, ``out += w * row`` over every item."""
    out = np.zeros((tokens.shape[0], rows.shape[1]), np.float32)
    for j in range(tokens.shape[1]):
        pos = np.minimum(np.searchsorted(keys, tokens[:, j]), keys.size - 1)
        w = np.where((keys[pos] == tokens[:, j]) & (weights[:, j] > 0), weights[:, j],
                     np.float32(0))
        out += rows[pos] * w[:, None]
    return out


def _case(n: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(1, 10_000, 300)).astype(np.int64)
    rows = rng.normal(size=(keys.size, 8)).astype(np.float32)
    tokens = rng.choice(keys, size=(n, 6))
    tokens[rng.random((n, 6)) < 0.1] = 10_001 + rng.integers(0, 50)  # keys without a row
    weights = (1.0 / rng.integers(1, 5, (n, 6))).astype(np.float32)
    weights[rng.random((n, 6)) < 0.2] = 0.0
    weights[:, 5] = 0.0  # a position no item uses
    return tokens, weights, keys, rows


def test_blocked_sums_equal_whole_columns_bit_for_bit() -> None:
    for n, seed in ((2 * BLOCK + 17, 1), (BLOCK, 2), (5, 3)):
        tokens, weights, keys, rows = _case(n, seed)
        got = attribute_parts(tokens, weights, keys, rows)
        assert got.dtype == np.float32 and got.shape == (n, 8)
        np.testing.assert_array_equal(got.view(np.int32),
                                      _column_sums(tokens, weights, keys, rows).view(np.int32))


def test_positions_serve_moved_rows_and_nothing_adds_nothing(monkeypatch) -> None:
    tokens, weights, keys, rows = _case(300, 4)
    monkeypatch.setattr(attributes, "BLOCK", 64)  # several blocks on a small case
    pos, w = token_rows(tokens, weights, keys)
    moved = rows + np.float32(0.5)
    np.testing.assert_array_equal(parts_of(pos, w, moved),
                                  _column_sums(tokens, weights, keys, moved))
    assert not parts_of(pos, np.zeros_like(w), rows).any()
    empty = np.zeros(0, np.int64)
    assert not attribute_parts(tokens, weights, empty, np.zeros((0, 8), np.float32)).any()
    assert attribute_parts(tokens[:0], weights[:0], keys, rows).shape == (0, 8)
