"""Exact top-k selection (numpy only), the one implementation serving and evaluation use.

Two shapes of the same job, each with its own tie rule (kept as they are: the evaluation's
figures and serving's answers depend on them):

* :func:`top_k_rows` — queries-major ``[B, N]`` scores, one ``argpartition``: the
  evaluation's ranking of a few thousand candidates.
* :func:`top_k_batch` / :func:`top_k` — items-major ``[N, B]`` scores with exclusions:
  serving's request path over up to ~100k items. An exact block-max pruning per column (the
  ``k`` blocks of :data:`BLOCK` rows with the largest maxima hold the top ``k``), then
  ``argpartition`` over the few candidates. Exact search is cheap next to the matrix product
  (figures: ``docs/decisions.md#serving-exact-search``); catalogues of ``serving.ann_min_items``
  items and more are ranked over an ANN index's candidates (``model.scoring.ann``), by the
  same function.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

#: Block size of the block-max pruning of :func:`top_k_batch`.
BLOCK = 64


def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best columns of each row of ``scores`` ``[B, N]``, best first:
    ``[B, min(k, N)]``. Equal scores keep ``argpartition``'s order (stable sort after it)."""
    k = min(k, scores.shape[1])
    if k == 0:
        return np.zeros((scores.shape[0], 0), np.int64)
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def _block_maxima(scores: np.ndarray, k: int) -> np.ndarray | None:
    """Per-block maxima ``[m, B]`` of items-major ``scores`` ``[N, B]``, or ``None`` if
    pruning does not pay for a top ``k``. Block ``j`` = rows ``j, j+m, j+2m, ...`` (of the
    first ``m * BLOCK`` rows), so the maxima are one vectorised pass over contiguous memory."""
    n, b = scores.shape
    m = n // BLOCK
    if m <= 4 * k:
        return None
    return scores[: m * BLOCK].reshape(BLOCK, m, b).max(axis=0)


def _candidates(maxima: np.ndarray, k: int, n: int) -> np.ndarray:
    """Row indices that surely hold the top ``k`` of a column of ``n`` rows whose block
    maxima are ``maxima`` ``[m]``. Exact: every top-k row lies in one of the ``k`` blocks
    with the largest maxima — a row outside them is beaten by ``k`` block maxima — or in
    the rows after the last whole block."""
    m = maxima.shape[0]
    blocks = np.argpartition(maxima, m - k)[m - k :]
    cand = (np.arange(BLOCK)[:, None] * m + blocks[None, :]).ravel()
    return np.concatenate([cand, np.arange(m * BLOCK, n)])


def top_k(
    vectors: np.ndarray, query: np.ndarray, k: int, exclude: Iterable[int] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """Indices and scores of the ``k`` best rows of ``vectors @ query``, best first,
    never returning an index in ``exclude``. Fewer than ``k`` if not enough rows remain."""
    return top_k_batch((vectors @ query)[:, None], [k], [exclude])[0]


def top_k_batch(
    scores: np.ndarray, ks: Sequence[int], excludes: Sequence[Iterable[int]]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For every column ``j`` of items-major ``scores`` ``[N, B]`` (overwritten where
    excluded): indices and scores of its ``ks[j]`` best rows, best first, never an index of
    ``excludes[j]``; fewer if not enough rows remain."""
    n = scores.shape[0]
    limits = []
    for j, exclude in enumerate(excludes):
        drop = np.unique(np.fromiter(exclude, dtype=np.int64))
        if drop.size:
            scores[drop, j] = -np.inf
        limits.append(min(ks[j], n - drop.size))
    maxima = _block_maxima(scores, max(limits, default=0))
    out = []
    for j, k in enumerate(limits):
        column = scores[:, j]
        if k <= 0:
            out.append((np.empty(0, np.int64), np.empty(0, np.float32)))
            continue
        if maxima is not None:
            cand = _candidates(maxima[:, j], k, n)
            sub = column[cand]
            part = cand[np.argpartition(sub, sub.size - k)[sub.size - k :]]
        elif k < n:
            part = np.argpartition(column, n - k)[n - k :]
        else:
            part = np.arange(n)
        best = column[part]
        order = np.argsort(-best, kind="stable")
        out.append((part[order], best[order]))
    return out
