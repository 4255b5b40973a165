"""Per history size, the scales of the neighbour parts that have ranked best (numpy only).

The learnt mix (:mod:`model.scoring.mixer`) gives each part of the score one weight for every
row. Its cross-entropy over sampled candidates keeps the neighbour parts light (co-visitation
and session-kNN: what tells apart the few items that compete for the top of a row), and rows
of short and long histories want them in other proportions (``docs/decisions.md#mix-selector``).

:class:`MixSelector` keeps, per history group (:data:`GROUP_STARTS`: 1-4 and 5+ items in the
model's window), the top-``k`` gain of each variant of the learnt weights: the co-visitation
parts' weights times one of :data:`ITEM_SCALES` and the session-kNN part's times one of
:data:`SKNN_SCALES` (the towers' and the prior's unchanged). A row's gain is NDCG@k's,
``1 / log2(rank + 2)`` when its target ranks within the top ``k``, else 0: the hits of
Recall@k weighted by how high they rank (on the real-log panel it led Recall@k itself on
both counts, ``docs/decisions.md#mix-selector``). The gains are summed on scored rows before
the model learns them (test-then-train), exactly, over every candidate
(:func:`variant_ranks`), and each group is served its leader (ties: the earlier variant, so
the learnt weights until another variant is strictly ahead). A row with no history is the cold
start's (:mod:`model.scoring.cold`). The trainer's live scoring, ``streamrec evaluate`` and the
artifact (``history_groups``) apply the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Fewest items in the model's window of each history group (1-4, 5+).
GROUP_STARTS = (1, 5)
#: Scales of the co-visitation parts' learnt weights, and of the session-kNN part's.
ITEM_SCALES = (1.0, 2.0, 4.0, 8.0)
SKNN_SCALES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: ``(rows, columns, values)`` of a part added at a few cells of ``[B, N]`` scores.
Cells = tuple[np.ndarray, np.ndarray, np.ndarray]


def history_counts(history: np.ndarray) -> np.ndarray:
    """Items in each row of a padded history matrix (item keys, 0 = padding)."""
    history = np.asarray(history)
    if history.ndim != 2:
        return np.zeros(len(history), np.int64)
    return (history != 0).sum(axis=1).astype(np.int64)


def groups_of(counts: np.ndarray, starts: Sequence[int] = GROUP_STARTS) -> np.ndarray:
    """History group of each count of window items (-1: fewer than the first start)."""
    return np.searchsorted(np.asarray(starts, np.int64), np.asarray(counts, np.int64),
                           side="right") - 1


def row_scales(scales: np.ndarray, counts: np.ndarray,
               starts: Sequence[int] = GROUP_STARTS) -> np.ndarray:
    """``[B, 2]`` (co-visitation, session-kNN) scales of rows with ``counts`` window items:
    their group's row of ``scales`` ``[G, 2]``, ones for a row in no group."""
    groups = groups_of(counts, starts)
    out = np.ones((groups.size, 2), np.float64)
    inside = groups >= 0
    out[inside] = np.asarray(scales, np.float64)[groups[inside]]
    return out


def dense_cells(part: np.ndarray, weight: float) -> Cells:
    """The non-zero cells of a dense ``[B, N]`` part, times ``weight`` (non-finite: none)."""
    part = np.asarray(part)
    rows, cols = np.nonzero(np.isfinite(part) & (part != 0))
    return rows, cols, weight * part[rows, cols].astype(np.float64)


def join_cells(cells: Sequence[Cells]) -> Cells:
    """Several parts' cells as one (a cell named twice adds up)."""
    if not cells:
        none = np.zeros(0, np.int64)
        return none, none, np.zeros(0, np.float64)
    return (np.concatenate([np.asarray(c[0], np.int64) for c in cells]),
            np.concatenate([np.asarray(c[1], np.int64) for c in cells]),
            np.concatenate([np.asarray(c[2], np.float64) for c in cells]))


def variant_ranks(base: np.ndarray, item2item: Cells, sknn: Cells, target: np.ndarray,
                  variants: np.ndarray, k: int) -> np.ndarray:
    """``[B, V]`` int64: each row's target's rank (candidates strictly above it) under the
    score ``base + a * item2item + b * sknn`` for each variant ``(a, b)`` of ``variants``
    ``[V, 2]``, where it is below ``k``; ``k`` where it is not (and for a row without a target
    or whose target is not a candidate).

    ``base`` ``[B, N]``: the rest of the score (``-inf``: not a candidate); the two parts are
    cells with values >= 0 (:func:`dense_cells`); ``target[b]`` the target's column (-1:
    none). A rank below ``k`` is a hit, as :func:`model.scoring.cold.hits_at` counts it.
    Exact, without scoring every candidate per variant: the parts only raise a cell, so a
    column outside a row's ``k`` best by ``base`` and outside the parts' cells can only pass
    the target when those ``k`` columns all do."""
    base = np.asarray(base)
    b_rows, n = base.shape
    target = np.asarray(target, np.int64)
    v = np.asarray(variants, np.float64)
    out = np.full((b_rows, len(v)), k, np.int64)
    scored = np.flatnonzero(target >= 0)
    if not scored.size or n == 0:
        return out
    base, target = base[scored], target[scored]
    slot = np.full(b_rows, -1, np.int64)
    slot[scored] = np.arange(scored.size)
    n_rows = scored.size

    def cells_of(cells: Cells) -> tuple[np.ndarray, np.ndarray]:
        row = slot[np.asarray(cells[0], np.int64)]
        keep = row >= 0
        return row[keep] * n + np.asarray(cells[1], np.int64)[keep], \
            np.asarray(cells[2], np.float64)[keep]

    (codes_a, val_a), (codes_b, val_b) = cells_of(item2item), cells_of(sknn)
    codes_t = np.arange(n_rows, dtype=np.int64) * n + target
    top = top_columns(base, min(k, n))
    codes = np.unique(np.concatenate([
        (np.arange(n_rows, dtype=np.int64)[:, None] * n + top).reshape(-1),
        codes_a, codes_b, codes_t]))
    a = np.bincount(np.searchsorted(codes, codes_a), val_a, minlength=codes.size)
    b = np.bincount(np.searchsorted(codes, codes_b), val_b, minlength=codes.size)
    rows = codes // n
    own = base[rows, codes % n].astype(np.float64)
    t_at = np.searchsorted(codes, codes_t)
    t_base, t_a, t_b = own[t_at], a[t_at], b[t_at]
    ok = np.isfinite(t_base)
    # each cell against its row's target, per variant: d_base + a_v * d_a + b_v * d_b > 0;
    # a cell above (below) the target in every variant is counted (dropped) without the
    # per-variant pass (the scales are > 0, so the extremes are the scales' corners)
    with np.errstate(invalid="ignore"):
        d_base = own - t_base[rows]
    d_a, d_b = a - t_a[rows], b - t_b[rows]
    corners = [lo * d_a + hi * d_b for lo in (v[:, 0].min(), v[:, 0].max())
               for hi in (v[:, 1].min(), v[:, 1].max())]
    with np.errstate(invalid="ignore"):
        high = d_base + np.maximum.reduce(corners)
        low = d_base + np.minimum.reduce(corners)
    always = np.bincount(rows[low > 0], minlength=n_rows)
    # a row with k cells above its target in every variant is a miss in all of them
    maybe = np.flatnonzero((high > 0) & ~(low > 0) & (always[rows] < k))
    counts = np.broadcast_to(always, (len(v), n_rows)).copy()
    if maybe.size:
        above = (d_base[maybe][None, :] + v[:, :1] * d_a[maybe] + v[:, 1:] * d_b[maybe]) > 0
        owner = rows[maybe]
        for j in range(len(v)):
            counts[j] += np.bincount(owner[above[j]], minlength=n_rows)
    out[scored] = np.where(ok[None, :], np.minimum(counts, k), k).T
    return out


def variant_hits(base: np.ndarray, item2item: Cells, sknn: Cells, target: np.ndarray,
                 variants: np.ndarray, k: int) -> np.ndarray:
    """``[B, V]`` bool: whether each row's target is in the top ``k`` of each variant
    (:func:`variant_ranks`)."""
    return variant_ranks(base, item2item, sknn, target, variants, k) < k


def gains(ranks: np.ndarray, k: int) -> np.ndarray:
    """NDCG@k's gain of each rank: ``1 / log2(rank + 2)`` below ``k``, else 0."""
    ranks = np.asarray(ranks)
    return np.where(ranks < k, 1.0 / np.log2(np.minimum(ranks, k) + 2.0), 0.0)


#: Columns per block of :func:`top_columns`.
BLOCK = 256


def top_columns(scores: np.ndarray, k: int, block: int = BLOCK) -> np.ndarray:
    """``[B, k]`` columns of each row's ``k`` highest ``scores`` (any order; ties broken
    arbitrarily), by blocks: the ``k`` blocks of highest maxima hold them, so one pass of
    maxima and a partition of those blocks' columns replace a partition of whole rows."""
    b_rows, n = scores.shape
    blocks = n // block
    if blocks <= 2 * k:
        return np.argpartition(scores, n - k, axis=1)[:, n - k:]
    maxima = scores[:, : blocks * block].reshape(b_rows, blocks, block).max(axis=2)
    best = np.argpartition(maxima, blocks - k, axis=1)[:, blocks - k:]
    cols = (best[:, :, None] * block + np.arange(block)).reshape(b_rows, -1)
    if n > blocks * block:  # the last, partial block always competes
        cols = np.concatenate([cols, np.broadcast_to(np.arange(blocks * block, n),
                                                     (b_rows, n - blocks * block))], axis=1)
    values = np.take_along_axis(scores, cols, axis=1)
    pick = np.argpartition(values, values.shape[1] - k, axis=1)[:, values.shape[1] - k:]
    return np.take_along_axis(cols, pick, axis=1)


class MixSelector:
    """Per history group, the leading scales of the neighbour parts' weights (module doc).
    ``item_scales`` / ``sknn_scales`` ``(1.0,)`` for a model without that part."""

    def __init__(self, k: int = 10, item_scales: Sequence[float] = ITEM_SCALES,
                 sknn_scales: Sequence[float] = SKNN_SCALES,
                 starts: Sequence[int] = GROUP_STARTS) -> None:
        if list(starts) != sorted(set(starts)) or not starts or starts[0] < 1:
            raise ValueError("group starts must be increasing and >= 1")
        self.k = int(k)
        self.starts = tuple(int(s) for s in starts)
        self.variants = np.array([(a, b) for a in item_scales for b in sknn_scales], np.float64)
        if self.variants.size == 0 or (self.variants <= 0).any():
            raise ValueError("scales must be > 0")
        #: Top-``k`` gains (:func:`gains`) summed per group and variant; rows counted per
        #: group.
        self.gains = np.zeros((len(self.starts), len(self.variants)), np.float64)
        self.rows = np.zeros(len(self.starts), np.int64)

    def scales(self) -> np.ndarray:
        """``[G, 2]``: each group's leading (co-visitation, session-kNN) scales."""
        return self.variants[np.argmax(self.gains, axis=1)]

    def row_scales(self, counts: np.ndarray) -> np.ndarray:
        """:func:`row_scales` of the leaders."""
        return row_scales(self.scales(), counts, self.starts)

    def observe(self, base: np.ndarray, item2item: Cells, sknn: Cells, target: np.ndarray,
                counts: np.ndarray) -> None:
        """Sum every variant's gains on scored rows (:func:`variant_ranks`'s arguments; the
        parts' cells with their learnt weights, unscaled); ``counts``: each row's window
        items. Rows in no group or without a target are not counted."""
        groups = groups_of(counts, self.starts)
        target = np.where(groups >= 0, np.asarray(target, np.int64), -1)
        if not (target >= 0).any():
            return
        ranks = variant_ranks(base, item2item, sknn, target, self.variants, self.k)
        scored = target >= 0
        np.add.at(self.gains, groups[scored], gains(ranks[scored], self.k))
        np.add.at(self.rows, groups[scored], 1)

    def state(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint (restored by :meth:`load_state`)."""
        return {"gains": self.gains.copy(), "rows": self.rows.copy()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        found = np.asarray(state["gains"], np.float64)
        if found.shape != self.gains.shape:
            raise ValueError(f"selector state has {found.shape} sums, expected {self.gains.shape}")
        self.gains = found.copy()
        self.rows = np.asarray(state["rows"], np.int64).copy()
