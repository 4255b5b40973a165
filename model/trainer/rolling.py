"""Test-then-train evaluation: Recall@K and NDCG@K before each training batch.

Candidate set (documented choice): every item the model knows (has its own row) at the
last candidate refresh — refreshed every ``refresh_steps`` training steps, so a few
items admitted since then are missing from the candidates (they count as misses, which
only makes the figure conservative). Each sample has one relevant item (its target), so
``recall@K = [rank < K]`` and ``NDCG@K = 1 / log2(rank + 2)`` if ``rank < K`` else 0.

The popularity baseline ranks the same candidates by how often they were a training
target so far, evaluated on the same rows.

Rolling figures cover the last ``window`` evaluated samples; lifetime figures are kept
apart (CONVENTIONS.md, metrics).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from model.scoring.covisit import ITEMKNN_ALPHA
from model.scoring.sorted_keys import add_sorted, find_sorted
from model.scoring.topk import top_k_rows


def recall_ndcg(ranked_keys: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row recall and NDCG for one relevant item; ``ranked_keys`` [B, K] best first."""
    hit = ranked_keys == targets[:, None]
    found = hit.any(axis=1)
    rank = np.argmax(hit, axis=1)
    ndcg = np.where(found, 1.0 / np.log2(rank + 2.0), 0.0)
    return found.astype(np.float64), ndcg


def target_ranks(scores: np.ndarray, target_pos: np.ndarray) -> np.ndarray:
    """Per row: how many candidates score strictly higher than the target (-1: the target
    is not a candidate, ``target_pos`` -1)."""
    rows = np.arange(scores.shape[0])
    target = scores[rows, np.maximum(target_pos, 0)]
    rank = (scores > target[:, None]).sum(axis=1)
    return np.where(target_pos >= 0, rank, -1)


def rank_metrics(
    scores: np.ndarray, target_pos: np.ndarray, k: int, ranks: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-row recall@k and NDCG@k from the target's rank (:func:`target_ranks`, or
    ``ranks`` already computed); a target not among the candidates is a miss. Same
    figures as ranking the top k, without sorting."""
    rank = target_ranks(scores, target_pos) if ranks is None else ranks
    hit = (rank >= 0) & (rank < k)
    ndcg = np.where(hit, 1.0 / np.log2(np.maximum(rank, 0) + 2.0), 0.0)
    return hit.astype(np.float64), ndcg


@dataclass(frozen=True)
class ScoredRows:
    """What the evaluation saw of one scored head, for its listeners (the quality guard):
    the model's Recall@K hits, the target's rank among ``candidates`` (-1: not one), the rows'
    own keys, and how rarely the traffic of late went to the target."""

    hits: np.ndarray
    ranks: np.ndarray
    candidates: int
    user_keys: np.ndarray
    item_keys: np.ndarray
    #: Item keys, most recent first, 0-padded ``[B, L]``.
    history: np.ndarray
    #: Event times (epoch ms; None: unknown).
    times: np.ndarray | None = None
    #: How many candidates were more popular of late than the target (the prior's ``q``,
    #: else the counts so far), over how many distinct items the last ``RECENT_TARGETS``
    #: training targets were: below 1 for the items the traffic goes to, at least 1 for an
    #: item rarer than all of them (candidates include every one-off item ever seen); NaN
    #: until the trainer saw that many targets.
    rarity: np.ndarray | None = None
    #: The distinct items of the recent targets ``rarity`` was divided by (0: unknown).
    recent_items: int = 0


@dataclass
class Rolling:
    """Sum of a per-sample figure over the last ``window`` samples plus lifetime totals."""

    window: int = 10_000

    def __post_init__(self) -> None:
        self._chunks: deque[tuple[int, float]] = deque()
        self._n = 0
        self._sum = 0.0
        self.lifetime_n = 0
        self.lifetime_sum = 0.0

    def add(self, values: np.ndarray) -> None:
        n, s = int(values.size), float(values.sum())
        if n == 0:
            return
        self._chunks.append((n, s))
        self._n += n
        self._sum += s
        self.lifetime_n += n
        self.lifetime_sum += s
        while self._chunks and self._n - self._chunks[0][0] >= self.window:
            old_n, old_s = self._chunks.popleft()
            self._n -= old_n
            self._sum -= old_s

    def to_json(self) -> dict[str, Any]:
        """The window's chunks and the lifetime totals (a checkpoint's JSON state)."""
        return {"chunks": [[n, s] for n, s in self._chunks], "lifetime_n": self.lifetime_n,
                "lifetime_sum": self.lifetime_sum}

    def load(self, data: dict[str, Any]) -> None:
        """Back to what :meth:`to_json` gave."""
        self._chunks = deque((int(n), float(s)) for n, s in data.get("chunks", []))
        self._n = sum(n for n, _ in self._chunks)
        self._sum = sum(s for _, s in self._chunks)
        self.lifetime_n = int(data.get("lifetime_n", self._n))
        self.lifetime_sum = float(data.get("lifetime_sum", self._sum))

    @property
    def value(self) -> float:
        return self._sum / self._n if self._n else 0.0

    @property
    def n(self) -> int:
        """Samples the rolling figure covers now."""
        return self._n

    @property
    def lifetime(self) -> float:
        return self.lifetime_sum / self.lifetime_n if self.lifetime_n else 0.0


#: Training targets whose distinct items scale ``ScoredRows.rarity``.
RECENT_TARGETS = 10_000


class Popularity:
    """Target counts so far, kept as sorted arrays (keys, counts): a candidate refresh looks
    up every candidate at once.

    ``observe`` only queues a batch's keys (called every batch); they are counted when the
    counts are read (``counts_of``/``total``, every candidate refresh). Not thread-safe: the
    trainer calls both from one thread (its evaluation thread, or inline), in training order."""

    def __init__(self, recent: int = RECENT_TARGETS) -> None:
        self._keys = np.zeros(0, np.int64)  # every target key so far, ascending
        self._counts = np.zeros(0, np.int64)  # each one's count
        self._queued: list[np.ndarray] = []
        #: The last ``recent`` targets (a ring; -1: empty).
        self._ring = np.full(recent, -1, np.int64)
        self._at = 0

    def observe(self, item_keys: np.ndarray) -> None:
        keys = np.asarray(item_keys, np.int64)
        self._queued.append(keys)
        ring = self._ring
        tail = keys[-ring.size:]
        idx = (self._at + np.arange(tail.size)) % ring.size
        ring[idx] = tail
        self._at = (self._at + tail.size) % ring.size

    @property
    def recent_items(self) -> int:
        """Distinct items among the last ``recent`` targets; 0 until that many were seen
        (a trainer just started or restored knows too few to say what is rare)."""
        if self._ring[-1] == -1:
            return 0
        return int(np.unique(self._ring).size)

    def _count(self) -> None:
        """Count the queued keys into the sorted arrays."""
        if not self._queued:
            return
        uniq, cnt = np.unique(np.concatenate(self._queued), return_counts=True)
        self._queued = []
        self._keys, self._counts = add_sorted(self._keys, self._counts, uniq, cnt)

    def counts_of(self, keys: np.ndarray) -> np.ndarray:
        """Each key's count so far (float64; 0 for a key never a target)."""
        self._count()
        pos, found = find_sorted(self._keys, np.asarray(keys, np.int64))
        if not found.any():  # nothing counted yet, or none of these
            return np.zeros(found.shape, np.float64)
        return np.where(found, self._counts[pos], 0).astype(np.float64)

    @property
    def total(self) -> int:
        """Targets counted so far."""
        self._count()
        return int(self._counts.sum())


class Evaluator:
    """Holds the candidate set and the rolling figures of the model and two baselines.

    The model's figure scores the whole served score (towers, prior and co-visitation, with
    the trainer's current weights); next to it, popularity (target counts so far) and the
    item-to-item memory alone (the co-visitation sums; ties by popularity), on the same rows
    and candidates.
    """

    def __init__(self, k: int = 10, window: int = 10_000) -> None:
        self.k = k
        self.candidate_keys = np.zeros(0, np.int64)
        self.candidate_tower = np.zeros((0, 0), np.float32)
        self.candidate_log_q: np.ndarray | None = None
        #: The candidate keys ascending, and each one's candidate column (``positions``).
        self._sorted_keys = np.zeros(0, np.int64)
        self._sorted_columns = np.zeros(0, np.int64)
        self.popularity = Popularity()
        self._pop_top = np.zeros(0, np.int64)
        self._pop_counts = np.zeros(0, np.float64)
        #: Each candidate's popularity of late (``log q``, else its count), the same sorted,
        #: and the distinct items of the recent targets (``ScoredRows.rarity``).
        self._recent = np.zeros(0, np.float64)
        self._recent_sorted = np.zeros(0, np.float64)
        self._recent_items = 0
        self.recall = Rolling(window)
        self.ndcg = Rolling(window)
        self.pop_recall = Rolling(window)
        self.pop_ndcg = Rolling(window)
        self.i2i_recall = Rolling(window)
        self.i2i_ndcg = Rolling(window)
        self.knn_recall = Rolling(window)
        self.knn_ndcg = Rolling(window)
        #: Called with the :class:`ScoredRows` of every head scored with its keys (the quality
        #: guard, ``model.trainer.guard_rule``), on the thread that evaluates.
        self.listeners: list[Callable[[ScoredRows], None]] = []

    def set_candidates(
        self, keys: np.ndarray, tower: np.ndarray, log_q: np.ndarray | None = None
    ) -> None:
        """The candidates: keys, their item side of the towers' part, their ``log q``."""
        self.candidate_keys = np.asarray(keys, np.int64)
        self.candidate_tower = np.ascontiguousarray(tower, np.float32)
        self.candidate_log_q = None if log_q is None else np.asarray(log_q, np.float32)
        order = np.argsort(self.candidate_keys, kind="stable")
        self._sorted_keys, self._sorted_columns = self.candidate_keys[order], order
        self._pop_counts = self.popularity.counts_of(self.candidate_keys)
        self._pop_top = self.candidate_keys[top_k_rows(self._pop_counts[None, :], self.k)[0]] \
            if self.candidate_keys.size else np.zeros(0, np.int64)
        self._recent = self._pop_counts if self.candidate_log_q is None \
            else self.candidate_log_q.astype(np.float64)
        self._recent_sorted = np.sort(self._recent)
        self._recent_items = self.popularity.recent_items

    def rarity(self, target_pos: np.ndarray) -> np.ndarray:
        """Per row: how many candidates were more popular of late than the target, over the
        distinct items of the recent targets (``ScoredRows.rarity``; inf: not a candidate;
        NaN: too few targets seen yet)."""
        n = self._recent_sorted.size
        if not n or not self._recent_items:
            return np.full(target_pos.size, np.nan)
        value = self._recent[np.maximum(target_pos, 0)]
        above = n - np.searchsorted(self._recent_sorted, value, side="right")
        return np.where(target_pos >= 0, above / self._recent_items, np.inf)

    def positions(self, targets: np.ndarray) -> np.ndarray:
        """Candidate column of each target key (-1: not a candidate)."""
        pos, found = find_sorted(self._sorted_keys, np.asarray(targets, np.int64))
        if not found.any():
            return np.full(found.shape, -1, np.int64)
        return np.where(found, self._sorted_columns[pos], -1)

    def evaluate(
        self, scores: np.ndarray | None, target_pos: np.ndarray,
        item2item: np.ndarray | None = None, head: Any = None,
    ) -> None:
        """Rank rows ``[B, N]`` of scores over the candidates (before the model trains on
        them); ``item2item`` the item-to-item memory's own scores of the same rows; ``head``
        the rows' batch (``model.trainer.samples.Batch``: the listeners get its keys)."""
        n = int(target_pos.size)
        if scores is None or self.candidate_keys.size == 0 or n == 0:
            zeros = np.zeros(n)
            for r in (self.recall, self.ndcg, self.pop_recall, self.pop_ndcg):
                r.add(zeros)
            return
        ranks = target_ranks(scores, target_pos)
        rec, ndcg = rank_metrics(scores, target_pos, self.k, ranks)
        self.recall.add(rec)
        if head is not None and self.listeners:
            scored = ScoredRows(rec, ranks, int(self.candidate_keys.size), head.user_keys,
                                head.item_keys, head.history, getattr(head, "times", None),
                                self.rarity(target_pos), self._recent_items)
            for listener in self.listeners:
                listener(scored)
        self.ndcg.add(ndcg)
        pop_top = self.positions(self._pop_top)
        prec, pndcg = recall_ndcg(np.broadcast_to(pop_top, (n, pop_top.size)), target_pos)
        self.pop_recall.add(prec)
        self.pop_ndcg.add(pndcg)
        if item2item is not None:  # on its first rows (the caller picks how many)
            tie = (self._pop_counts / (self._pop_counts.max() + 1.0)).astype(np.float32) \
                if self._pop_counts.size else np.float32(0.0)
            rows = len(item2item)
            irec, indcg = rank_metrics(item2item + np.float32(1e-3) * tie,
                                       target_pos[:rows], self.k)
            self.i2i_recall.add(irec)
            self.i2i_ndcg.add(indcg)
            # item-kNN: the same sums damped by the candidate's popularity, as evaluate's
            # ``itemknn`` damps its co-occurrence sums (ties by popularity)
            damp = np.power(self._pop_counts + 1.0, -ITEMKNN_ALPHA).astype(np.float32) \
                if self._pop_counts.size else np.float32(1.0)
            krec, kndcg = rank_metrics(np.expm1(item2item) * damp + np.float32(1e-6) * tie,
                                       target_pos[:rows], self.k)
            self.knn_recall.add(krec)
            self.knn_ndcg.add(kndcg)

    def summary(self) -> dict[str, float]:
        k = self.k
        return {
            f"recall@{k}": self.recall.value,
            f"ndcg@{k}": self.ndcg.value,
            f"popularity_recall@{k}": self.pop_recall.value,
            f"popularity_ndcg@{k}": self.pop_ndcg.value,
            f"item2item_recall@{k}": self.i2i_recall.value,
            f"item2item_ndcg@{k}": self.i2i_ndcg.value,
            f"itemknn_recall@{k}": self.knn_recall.value,
            f"itemknn_ndcg@{k}": self.knn_ndcg.value,
            f"lifetime_recall@{k}": self.recall.lifetime,
            f"lifetime_ndcg@{k}": self.ndcg.lifetime,
            f"lifetime_popularity_recall@{k}": self.pop_recall.lifetime,
            "evaluated_samples": float(self.recall.lifetime_n),
        }
