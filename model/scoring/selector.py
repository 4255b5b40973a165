"""Per history size, the scales of the neighbour parts that have hit most (numpy only).

The learnt mix (:mod:`model.scoring.mixer`) gives each part of the score one weight for every
row. Its cross-entropy over sampled candidates keeps the neighbour parts light (co-visitation
and session-kNN: what tells apart the few items that compete for the top of a row), and rows
of short and long histories want them in other proportions (``docs/decisions.md#mix-selector``).

:class:`MixSelector` keeps, per history group (:data:`GROUP_STARTS`: 1-4 and 5+ items in the
model's window), the top-``k`` hits of each variant of the learnt weights: the co-visitation
parts' weights times one of :data:`ITEM_SCALES` and the session-kNN part's times one of
:data:`SKNN_SCALES` (the towers' and the prior's unchanged). The hits are counted on scored
rows before the model learns them (test-then-train), exactly, over every candidate
(:func:`variant_hits`), and each group is served its leader (ties: the earlier variant, so the
learnt weights until another variant is strictly ahead). A row with no history is the cold
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


def variant_hits(base: np.ndarray, item2item: Cells, sknn: Cells, target: np.ndarray,
                 variants: np.ndarray, k: int) -> np.ndarray:
    """``[B, V]`` bool: whether each row's target is in the top ``k`` of the score
    ``base + a * item2item + b * sknn`` for each variant ``(a, b)`` of ``variants`` ``[V, 2]``.

    ``base`` ``[B, N]``: the rest of the score (``-inf``: not a candidate); the two parts are
    cells with values >= 0 (:func:`dense_cells`); ``target[b]`` the target's column (-1: none,
    never a hit). A hit is fewer than ``k`` candidates strictly above the target, as
    :func:`model.scoring.cold.hits_at` counts it. Exact, without scoring every candidate per
    variant: the parts only raise a cell, so a column outside a row's ``k`` best by ``base``
    and outside the parts' cells can only pass the target when those ``k`` columns all do."""
    base = np.asarray(base)
    b_rows, n = base.shape
    target = np.asarray(target, np.int64)
    out = np.zeros((b_rows, len(variants)), bool)
    scored = np.flatnonzero(target >= 0)
    if not scored.size or n == 0:
        return out
    kk = min(k, n)
    top = np.argpartition(-base, kk - 1, axis=1)[:, :kk] if kk < n else \
        np.broadcast_to(np.arange(n), (b_rows, n))
    codes_a = item2item[0].astype(np.int64) * n + item2item[1]
    codes_b = sknn[0].astype(np.int64) * n + sknn[1]
    codes_t = scored * n + target[scored]
    codes = np.unique(np.concatenate([
        (np.arange(b_rows, dtype=np.int64)[:, None] * n + top).reshape(-1),
        codes_a, codes_b, codes_t]))
    a = np.bincount(np.searchsorted(codes, codes_a), item2item[2], minlength=codes.size)
    b = np.bincount(np.searchsorted(codes, codes_b), sknn[2], minlength=codes.size)
    rows, cols = codes // n, codes % n
    v = np.asarray(variants, np.float64)
    with np.errstate(invalid="ignore"):
        scores = base[rows, cols].astype(np.float64)[None, :] + v[:, :1] * a + v[:, 1:] * b
    at_target = scores[:, np.searchsorted(codes, codes_t)]  # [V, scored]
    slot = np.full(b_rows, -1, np.int64)
    slot[scored] = np.arange(scored.size)
    mine = slot[rows] >= 0
    above = scores[:, mine] > at_target[:, slot[rows[mine]]]
    owner = rows[mine]
    for j in range(len(v)):
        count = np.bincount(owner[above[j]], minlength=b_rows)[scored]
        out[scored, j] = np.isfinite(at_target[j]) & (count < k)
    return out


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
        #: Top-``k`` hits per group and variant; rows counted per group.
        self.hits = np.zeros((len(self.starts), len(self.variants)), np.int64)
        self.rows = np.zeros(len(self.starts), np.int64)

    def scales(self) -> np.ndarray:
        """``[G, 2]``: each group's leading (co-visitation, session-kNN) scales."""
        return self.variants[np.argmax(self.hits, axis=1)]

    def row_scales(self, counts: np.ndarray) -> np.ndarray:
        """:func:`row_scales` of the leaders."""
        return row_scales(self.scales(), counts, self.starts)

    def observe(self, base: np.ndarray, item2item: Cells, sknn: Cells, target: np.ndarray,
                counts: np.ndarray) -> None:
        """Count every variant's hits on scored rows (:func:`variant_hits`'s arguments; the
        parts' cells with their learnt weights, unscaled); ``counts``: each row's window
        items. Rows in no group or without a target are not counted."""
        groups = groups_of(counts, self.starts)
        target = np.where(groups >= 0, np.asarray(target, np.int64), -1)
        if not (target >= 0).any():
            return
        hits = variant_hits(base, item2item, sknn, target, self.variants, self.k)
        scored = target >= 0
        np.add.at(self.hits, groups[scored], hits[scored].astype(np.int64))
        np.add.at(self.rows, groups[scored], 1)

    def state(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint (restored by :meth:`load_state`)."""
        return {"hits": self.hits.copy(), "rows": self.rows.copy()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        hits = np.asarray(state["hits"], np.int64)
        if hits.shape != self.hits.shape:
            raise ValueError(f"selector state has {hits.shape} counts, expected {self.hits.shape}")
        self.hits = hits.copy()
        self.rows = np.asarray(state["rows"], np.int64).copy()
