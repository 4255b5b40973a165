"""Per item count group, the scale of the towers' part that has ranked best (numpy only).

The learnt mix (:mod:`model.scoring.mixer`) weighs the towers' part by one weight for every
item. The neighbour parts (co-visitation, session-kNN) and the prior carry most of the
weight, and they know nothing of an item few people chose: such an item reaches the top 10
through the towers alone, whose part is then too light to lift it (on MovieLens with its
catalogue, the towers alone rank the right rare item in the top 10 twice as often as the
mix does; ``docs/decisions.md#item-attributes``).

:class:`RareSelector` keeps, for each variant of the towers' scale on the items with fewer
than :data:`RARE_BELOW` all-time positives so far (one scale for never-chosen items, one
for 1-4: :data:`RARE_SCALES` each; items with more keep scale 1), the top-``k`` gain of the
served score, NDCG@k's ``1 / log2(rank + 2)`` for a target ranked within the top ``k``, as
:mod:`model.scoring.selector` sums it. Gains are summed on scored rows before the model
learns them (test-then-train), exactly, over every candidate (:func:`variant_ranks`), and
the leader is served (ties: the earlier variant, so scale 1 until another is strictly
ahead). An item's count is its all-time positives by the prior's hash bucket
(``model.scoring.cold.ItemCounts``, which the delta stream already carries), so serving
scales the towers' block of each item's vector by its group's scale
(:func:`item_scales`) with no change to the request path. The trainer's live scoring,
``streamrec evaluate``, the export and the delta stream (``item_groups``) apply one rule. On
with attribute slots, off with ids only (``ModelConfig.rare_select``; the real-log panel,
``docs/decisions.md#item-attributes``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from model.scoring.selector import gains, top_columns

#: Fewest all-time positives of each scaled item group: never chosen, 1-4; an item with
#: :data:`RARE_BELOW` or more keeps scale 1.
GROUP_STARTS = (0, 1)
RARE_BELOW = 5
#: Scales of the towers' part tried per scaled group (1 first: the learnt mix).
RARE_SCALES = (1.0, 1.1, 1.2, 1.35, 1.5, 2.0, 3.0)


def item_groups(counts: np.ndarray, starts: Sequence[int] = GROUP_STARTS,
                below: int = RARE_BELOW) -> np.ndarray:
    """Scaled group of each item with ``counts`` all-time positives (-1: ``below`` or more,
    unscaled)."""
    counts = np.asarray(counts, np.float64)
    groups = np.searchsorted(np.asarray(starts, np.float64), counts, side="right") - 1
    return np.where(counts >= below, -1, groups).astype(np.int64)


def item_scales(scales: Sequence[float], counts: np.ndarray,
                starts: Sequence[int] = GROUP_STARTS, below: int = RARE_BELOW) -> np.ndarray:
    """float32 ``[N]``: the towers' scale of each item with ``counts`` positives (its group's
    of ``scales``, 1 for an unscaled item)."""
    groups = item_groups(counts, starts, below)
    table = np.append(np.asarray(scales, np.float32), np.float32(1.0))
    return table[groups]  # -1: the appended 1


def item_groups_entry(starts: Sequence[int], below: int, scales: Sequence[float]
                      ) -> dict[str, Any] | None:
    """The delta stream's ``item_groups`` entry (None when every scale is 1: no entry)."""
    scales = [float(s) for s in scales]
    if all(s == 1.0 for s in scales):
        return None
    return {"starts": [int(s) for s in starts], "below": int(below), "scales": scales}


def check_item_groups(entry: Any, where: str = "") -> None:
    """Raise ``ValueError`` unless ``entry`` is an ``item_groups`` entry
    (:func:`item_groups_entry`)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}item_groups must be an object")
    starts, scales, below = entry.get("starts"), entry.get("scales"), entry.get("below")
    if (not isinstance(starts, list) or not isinstance(scales, list)
            or len(starts) != len(scales) or not starts
            or any(not isinstance(s, int) or isinstance(s, bool) for s in starts)
            or starts != sorted(set(starts)) or starts[0] < 0
            or not isinstance(below, int) or isinstance(below, bool) or below <= starts[-1]):
        raise ValueError(f"{where}item_groups needs increasing int starts >= 0, an int below "
                         "above them and one scale per start")
    if any(not isinstance(s, (int, float)) or isinstance(s, bool) or not s > 0
           for s in scales):
        raise ValueError(f"{where}item_groups scales must be numbers > 0")


def scales_of(entry: Mapping[str, Any] | None, counts: np.ndarray) -> np.ndarray | None:
    """:func:`item_scales` of an ``item_groups`` entry (None: no entry, every scale 1)."""
    if entry is None:
        return None
    return item_scales(entry["scales"], counts, entry["starts"], entry["below"])


def _top_values(values: np.ndarray, k: int) -> np.ndarray:
    """``[B, k]`` each row's ``k`` highest ``values`` (any order; ``-inf`` padding)."""
    rows, n = values.shape
    if n <= k:
        return np.concatenate([values, np.full((rows, k - n), -np.inf, values.dtype)], axis=1)
    return np.take_along_axis(values, top_columns(values, k), axis=1)


def variant_ranks(rest: np.ndarray, tower: np.ndarray, groups: np.ndarray,
                  target: np.ndarray, variants: np.ndarray, k: int) -> np.ndarray:
    """``[B, V]`` int64: each row's target's rank (candidates strictly above it), capped at
    ``k``, under the score ``rest + s * tower`` where ``s`` is the variant's scale of the
    column's group (``variants`` ``[V, G]``; group -1: scale 1); ``k`` for a row without a
    target (-1) or whose target is not a candidate (``rest`` ``-inf``).

    Exact without scoring every column per variant: the unscaled columns' ``k`` best are
    compared once per variant, and a scaled cell is compared per variant only when it can
    lie above its row's target in some variant (the score is linear in ``s``, so the
    extremes are the group's smallest and largest scales): a few whole-array passes in the
    inputs' dtype, then work on those cells alone."""
    rest = np.asarray(rest)
    tower = np.asarray(tower)
    b_rows, n = rest.shape
    v = np.asarray(variants, np.float64)
    target = np.asarray(target, np.int64)
    out = np.full((b_rows, len(v)), k, np.int64)
    rows = np.flatnonzero(target >= 0)
    if not rows.size or n == 0:
        return out
    if rows.size < b_rows:
        rest, tower, target = rest[rows], tower[rows], target[rows]
    r = np.arange(rows.size)
    groups = np.asarray(groups, np.int64)
    table = np.concatenate([v, np.ones((len(v), 1))], axis=1)  # column -1: scale 1
    t_rest = rest[r, target].astype(np.float64)[:, None]
    t_tower = tower[r, target].astype(np.float64)[:, None]
    t_score = t_rest + table[:, groups[target]].T * t_tower  # [R, V]
    ok = np.isfinite(t_score[:, 0])
    scaled_col = groups >= 0
    dtype = np.result_type(rest.dtype, tower.dtype, np.float32)
    # the unscaled columns' k best, compared once per variant
    full = np.add(rest, tower, dtype=dtype)
    full[:, scaled_col] = -np.inf
    fixed = _top_values(full, k)
    counts = (fixed[:, None, :] > t_score[:, :, None]).sum(axis=2)  # [R, V]
    if scaled_col.any():
        # per column the smallest and largest scale of its group (1, 1 unscaled)
        lo_s = np.ones(n, dtype)
        hi_s = np.ones(n, dtype)
        lo_s[scaled_col] = v.min(axis=0)[groups[scaled_col]]
        hi_s[scaled_col] = v.max(axis=0)[groups[scaled_col]]
        np.multiply(tower, hi_s, out=full)
        full = np.maximum(full, tower * lo_s, out=full)
        full += rest  # the cell's highest score over the variants
        t_lo = t_score.min(axis=1)
        with np.errstate(invalid="ignore"):
            mr, mc = np.nonzero((full > t_lo.astype(dtype)[:, None]) & scaled_col[None, :])
        # a row with k unscaled columns above its target in every variant is a miss anyway
        live = counts.min(axis=1)[mr] < k
        mr, mc = mr[live], mc[live]
        if mr.size:
            cell_rest = rest[mr, mc].astype(np.float64)
            cell_tower = tower[mr, mc].astype(np.float64)
            cell_s = v[:, groups[mc]]  # [V, M]
            above = cell_rest[None, :] + cell_s * cell_tower[None, :] > t_score[mr].T
            for j in range(len(v)):
                counts[:, j] += np.bincount(mr[above[j]], minlength=rows.size)
    out[rows] = np.where(ok[:, None], np.minimum(counts, k), k)
    return out


class RareSelector:
    """The leading scales of the towers' part on rarely chosen items (module doc)."""

    def __init__(self, k: int = 10, scales: Sequence[float] = RARE_SCALES,
                 starts: Sequence[int] = GROUP_STARTS, below: int = RARE_BELOW) -> None:
        if list(starts) != sorted(set(starts)) or not starts or starts[0] < 0:
            raise ValueError("group starts must be increasing and >= 0")
        if below <= starts[-1]:
            raise ValueError("below must be above the last group start")
        if not scales or min(scales) <= 0:
            raise ValueError("scales must be > 0")
        self.k = int(k)
        self.starts = tuple(int(s) for s in starts)
        self.below = int(below)
        grids = np.meshgrid(*[np.asarray(scales, np.float64)] * len(self.starts),
                            indexing="ij")
        self.variants = np.stack([g.reshape(-1) for g in grids], axis=1)
        #: Top-``k`` gains summed per variant; rows counted.
        self.gains = np.zeros(len(self.variants), np.float64)
        self.rows = 0

    def scales(self) -> np.ndarray:
        """``[G]``: the leading scale of each group."""
        return self.variants[int(np.argmax(self.gains))]

    def entry(self) -> dict[str, Any] | None:
        """The leaders as the delta stream's ``item_groups`` entry (None: every scale 1)."""
        return item_groups_entry(self.starts, self.below, self.scales().tolist())

    def item_scales(self, counts: np.ndarray) -> np.ndarray:
        """:func:`item_scales` of the leaders for items with ``counts`` positives."""
        return item_scales(self.scales().tolist(), counts, self.starts, self.below)

    def groups(self, counts: np.ndarray) -> np.ndarray:
        return item_groups(counts, self.starts, self.below)

    def observe(self, rest: np.ndarray, tower: np.ndarray, counts: np.ndarray,
                target: np.ndarray) -> None:
        """Sum every variant's gains on scored rows: ``rest`` ``[B, N]`` the served score
        without the towers' part (``-inf``: not a candidate), ``tower`` the towers' part
        with its learnt weight, unscaled, ``counts`` each column's all-time positives,
        ``target`` each row's target column (-1: none; not counted)."""
        target = np.asarray(target, np.int64)
        if not (target >= 0).any():
            return
        ranks = variant_ranks(rest, tower, self.groups(counts), target, self.variants, self.k)
        scored = target >= 0
        self.gains += gains(ranks[scored], self.k).sum(axis=0)
        self.rows += int(scored.sum())

    def state(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint (restored by :meth:`load_state`)."""
        return {"gains": self.gains.copy(), "rows": np.asarray(self.rows, np.int64)}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        found = np.asarray(state["gains"], np.float64)
        if found.shape != self.gains.shape:
            raise ValueError(f"rare selector state has {found.shape} sums, expected "
                             f"{self.gains.shape}")
        self.gains = found.copy()
        self.rows = int(state["rows"])
