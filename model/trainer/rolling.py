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

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from model.scoring.covisit import ITEMKNN_ALPHA
from model.scoring.topk import top_k_rows


def recall_ndcg(ranked_keys: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row recall and NDCG for one relevant item; ``ranked_keys`` [B, K] best first."""
    hit = ranked_keys == targets[:, None]
    found = hit.any(axis=1)
    rank = np.argmax(hit, axis=1)
    ndcg = np.where(found, 1.0 / np.log2(rank + 2.0), 0.0)
    return found.astype(np.float64), ndcg


#: ``Popularity.first`` of the items a model knew when its process began (a restored trainer's).
KNOWN_BEFORE = -(2**40)


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
    the model's Recall@K hits, the target's rank among ``candidates`` (-1: not one), how long
    ago the target was first a training target, and the rows' own keys."""

    hits: np.ndarray
    ranks: np.ndarray
    candidates: int
    #: Training targets observed since the row's target was first one (0: not a candidate).
    target_ages: np.ndarray
    user_keys: np.ndarray
    item_keys: np.ndarray
    #: Item keys, most recent first, 0-padded ``[B, L]``.
    history: np.ndarray
    #: Event times (epoch ms; None: unknown).
    times: np.ndarray | None = None


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


class Popularity:
    """Target counts so far; ranks a candidate set by count (ties by key).

    ``observe`` only queues a batch's keys (called every batch); they are counted when the
    counts are read (``top``/``counts``, every candidate refresh). Not thread-safe: the
    trainer calls both from one thread (its evaluation thread, or inline), in training order."""

    def __init__(self) -> None:
        self._counts: Counter[int] = Counter()
        self._queued: list[np.ndarray] = []
        #: Targets observed so far, and how many had been when each key was first counted.
        self.observed = 0
        self._counted = 0
        self.first: dict[int, int] = {}

    def observe(self, item_keys: np.ndarray) -> None:
        keys = np.asarray(item_keys, np.int64)
        self._queued.append(keys)
        self.observed += int(keys.size)

    @property
    def counts(self) -> Counter[int]:
        if self._queued:
            uniq, cnt = np.unique(np.concatenate(self._queued), return_counts=True)
            self._queued = []
            keys = uniq.tolist()
            first, at = self.first, self._counted
            for key in keys:
                if key not in first:
                    first[key] = at
            self._counted = self.observed
            self._counts.update(dict(zip(keys, cnt.tolist(), strict=True)))
        return self._counts

    def top(self, candidates: np.ndarray, k: int) -> np.ndarray:
        if candidates.size == 0:
            return np.zeros(0, np.int64)
        c = np.fromiter(
            map(self.counts.get, candidates.tolist(), repeat(0)), np.float64, candidates.size
        )
        return candidates[top_k_rows(c[None, :], k)[0]]


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
        self._position: dict[int, int] = {}
        self.popularity = Popularity()
        self._pop_top = np.zeros(0, np.int64)
        self._pop_counts = np.zeros(0, np.float64)
        self._pop_first = np.zeros(0, np.int64)
        self._refreshed = False
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
        keys_list = self.candidate_keys.tolist()
        self._position = dict(zip(keys_list, range(len(keys_list)), strict=True))
        self._pop_top = self.popularity.top(self.candidate_keys, self.k)
        counts = self.popularity.counts
        self._pop_counts = np.fromiter(
            map(counts.get, keys_list, repeat(0)), np.float64, len(keys_list)
        )
        first = self.popularity.first
        if not self._refreshed:  # the model knew these before this process counted anything
            # (a restored trainer): long known, however rarely they are clicked since
            for key in keys_list:
                first.setdefault(key, KNOWN_BEFORE)
            self._refreshed = True
        self._pop_first = np.fromiter(
            map(first.get, keys_list, repeat(self.popularity.observed)), np.int64, len(keys_list)
        )

    def positions(self, targets: np.ndarray) -> np.ndarray:
        """Candidate column of each target key (-1: not a candidate)."""
        return np.fromiter(
            map(self._position.get, np.asarray(targets).tolist(), repeat(-1)), np.int64,
            len(targets),
        )

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
            first = self._pop_first[np.maximum(target_pos, 0)] if self._pop_first.size \
                else np.zeros(n, np.int64)
            ages = np.where(target_pos >= 0, self.popularity.observed - first, 0)
            scored = ScoredRows(rec, ranks, int(self.candidate_keys.size), ages, head.user_keys,
                                head.item_keys, head.history, getattr(head, "times", None))
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
