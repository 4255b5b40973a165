"""The request path: exact top-k over a version's item vectors, seen filtering, trending
padding, fallbacks, and micro-batching of concurrent requests (:class:`Recommender`).

Below ``serving.ann_min_items`` items, exact search: one BLAS matrix product for a batch of
queries, laid out items-major (``item_vectors @ queries.T``, ``[N, B]``), then
``model.scoring.topk.top_k_batch`` (exact block-max pruning per query). Why both, with the
figures: ``docs/decisions.md#serving-exact-search``. From that size on, two stages: the
version's ANN index proposes candidates, the co-visitation rows of the histories and the rows
the index cannot vouch for join them, and the union is ranked by the same exact score
(``model.scoring.ann``; figures: ``docs/decisions.md#ann-retrieval``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from feature_store.store import OnlineStore, UserFeatures
from model.artifact.files import ServingArtifact
from model.scoring.ann import AnnView, candidate_rows
from model.scoring.sorted_keys import find_sorted
from model.scoring.topk import top_k_batch
from serving import metrics as m
from serving.metrics import ServingMetrics
from serving.store_health import StoreHealth, StoreStatus

if TYPE_CHECKING:
    from serving.loader import LoadedModel

log = logging.getLogger(__name__)

MODEL = "model"
POPULAR = "popular"
DEGRADED = "degraded"


@dataclass(frozen=True, slots=True)
class Scored:
    item_id: str
    score: float


def pad(
    ranked: Sequence[Scored], trending: Sequence[tuple[str, float]], k: int, seen: set[str]
) -> list[Scored]:
    """``ranked`` followed by trending items not already listed or seen, up to ``k``."""
    out = list(ranked[:k])
    if len(out) >= k:
        return out
    taken = {s.item_id for s in out} | seen
    for item_id, score in trending:
        if item_id in taken:
            continue
        out.append(Scored(item_id, float(score)))
        taken.add(item_id)
        if len(out) >= k:
            break
    return out


def rank_with_model(
    artifact: ServingArtifact,
    user_ids: Sequence[str],
    histories: Sequence[Sequence[str]],
    ks: Sequence[int],
    exclude_seen: Sequence[bool],
    ann: AnnView | None = None,
) -> list[list[Scored]]:
    """Top ``ks[i]`` of each user by the model, in one matrix product (plus the version's
    parts added at a few rows: co-visitation, session-kNN); seen items (``histories[i]``) dropped where
    ``exclude_seen[i]``. With ``ann`` (the version's index), over the candidates of
    :func:`model.scoring.ann.candidate_rows` only."""
    index, ids = artifact.item_index, artifact.item_ids
    excludes = [[index[i] for i in hist if i in index] if excl else []
                for hist, excl in zip(histories, exclude_seen, strict=True)]
    if ann is None:
        ranked = top_k_batch(artifact.scores(user_ids, histories), ks, excludes)
    else:
        keys = artifact.request_keys(user_ids, histories)  # hashed once for every part
        queries = artifact.user_vectors_of_keys(*keys)
        sparse = artifact.sparse_scores(histories, keys)
        wanted = max(ann.index.params.candidates,
                     max(ks, default=0) + max((len(e) for e in excludes), default=0))
        rows = candidate_rows(ann, queries, wanted, [at for part in sparse for at, _ in part])
        local = []
        for exclude in excludes:
            pos, found = find_sorted(rows, np.asarray(exclude, np.int64))
            local.append(pos[found].tolist())
        ranked = [(rows[at], scores) for at, scores in top_k_batch(
            artifact.assemble(queries, sparse, histories, rows), ks, local)]
    # one fancy index and ``tolist`` per query: Python str and float, no numpy scalars
    return [[Scored(i, v) for i, v in zip(ids[idx].tolist(), scores.tolist(), strict=True)]
            for idx, scores in ranked]


def _degraded(answer: Answer, store_ok: bool, health: StoreStatus | None) -> Answer:
    """``answer`` marked degraded, with the reason, when the store failed or is not whole."""
    if not store_ok:
        return Answer(answer.items, DEGRADED, answer.version,
                      answer.reason or "feature store unavailable")
    if health is not None and health.degraded:
        return Answer(answer.items, DEGRADED, answer.version, answer.reason or health.reason)
    return answer


def popular(trending: Sequence[tuple[str, float]], k: int, seen: set[str]) -> list[Scored]:
    """Top ``k`` trending items not in ``seen``."""
    return pad((), trending, k, seen)


class StoreGuard:
    """Reads users from the store; after a failure skips the store for ``cooldown_s`` so a
    dead Redis costs one timeout per cooldown, not one per request. ``health`` says whether
    the store is whole (``serving.store_health``)."""

    def __init__(
        self,
        store: OnlineStore,
        cooldown_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        health: StoreHealth | None = None,
    ) -> None:
        self.store = store
        self.cooldown_s = cooldown_s
        self.monotonic = monotonic
        self.health = health or StoreHealth(store, monotonic=monotonic)
        self._open_until = 0.0

    def read_users(self, user_ids: Sequence[str]) -> tuple[list[UserFeatures | None], bool]:
        """``(features or None per user, store_ok)``."""
        if self.monotonic() < self._open_until:
            return [None] * len(user_ids), False
        try:
            return self.store.read_users(user_ids), True
        except Exception as exc:  # noqa: BLE001 - any store failure degrades, never 500s
            self._open_until = self.monotonic() + self.cooldown_s
            log.warning("online store read failed (%s); degraded for %.1fs", exc, self.cooldown_s)
            return [None] * len(user_ids), False


@dataclass(frozen=True, slots=True)
class Ask:
    user_id: str
    k: int
    exclude_seen: bool


@dataclass(frozen=True, slots=True)
class Answer:
    items: list[Scored]
    source: str
    version: str | None
    #: Why the answer is ``degraded`` (None otherwise).
    reason: str | None = None


class Recommender:
    """The request path, batched: concurrent requests that queue up while a batch runs are
    answered together by the next batch (one store round trip, one matrix product), so a
    lone request is never delayed and a busy server does less work per request."""

    def __init__(
        self,
        current: Callable[[], LoadedModel | None],
        trending: Callable[[], Sequence[tuple[str, float]]],
        guard: StoreGuard,
        metrics: ServingMetrics,
        max_batch: int = 32,
    ) -> None:
        self.current = current
        self.trending = trending
        self.guard = guard
        self.metrics = metrics
        self.max_batch = max_batch
        self._queue: list[tuple[Ask, asyncio.Future[Answer]]] = []
        self._draining = False
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, ask: Ask) -> Answer:
        """Answer one request (in the next batch)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        self._queue.append((ask, future))
        if not self._draining:
            self._draining = True
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
                try:
                    answers = await asyncio.to_thread(self.rank, [a for a, _ in batch])
                except Exception as exc:  # noqa: BLE001 - handed to every waiting request
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), answer in zip(batch, answers, strict=True):
                    if not future.done():
                        future.set_result(answer)
        finally:
            self._draining = False

    def rank(self, asks: Sequence[Ask]) -> list[Answer]:
        """Answer a batch synchronously; every request of the batch uses the same version."""
        model = self.current()
        trending = self.trending()
        users, store_ok = self.guard.read_users([a.user_id for a in asks])
        health = self.guard.health.status() if store_ok else None
        known = (model.artifact.known_users([a.user_id for a in asks]) if model is not None
                 else np.zeros(len(asks), bool))
        answers: list[Answer | None] = [None] * len(asks)
        todo: list[int] = []
        for i, (ask, features) in enumerate(zip(asks, users, strict=True)):
            seen = {h.item_id for h in features.history} if features and ask.exclude_seen else set()
            reason = None
            if not store_ok:
                reason = m.STORE_ERROR
            elif health is not None and health.degraded:
                reason = m.STORE_REHYDRATING
            elif model is None:
                reason = m.NO_MODEL
            if reason is not None:
                self.metrics.fallbacks.labels(reason).inc()
            # a user neither the model nor the store knows is a user with no history: the
            # model ranks them as it was measured to (its cold start, model.scoring.cold)
            if model is None or not known[i] and not store_ok:
                source = DEGRADED if not store_ok else POPULAR
                answers[i] = Answer(popular(trending, ask.k, seen), source, None)
            else:
                todo.append(i)
        if todo and model is not None:
            self._rank_model(model, asks, users, store_ok, todo, trending, answers)
        out = [a if a is not None else Answer([], DEGRADED, None) for a in answers]
        return [_degraded(a, store_ok, health) for a in out]

    def _rank_model(
        self,
        model: LoadedModel,
        asks: Sequence[Ask],
        users: Sequence[UserFeatures | None],
        store_ok: bool,
        todo: list[int],
        trending: Sequence[tuple[str, float]],
        answers: list[Answer | None],
    ) -> None:
        histories = [[h.item_id for h in u.history] if (u := users[i]) else [] for i in todo]
        try:
            ranked = rank_with_model(
                model.artifact, [asks[i].user_id for i in todo], histories,
                [asks[i].k for i in todo], [asks[i].exclude_seen for i in todo], model.ann)
        except Exception:
            log.exception("model %s failed on a batch of %d", model.version, len(todo))
            for i, hist in zip(todo, histories, strict=True):
                self.metrics.fallbacks.labels(m.MODEL_ERROR).inc()
                seen = set(hist) if asks[i].exclude_seen else set()
                answers[i] = Answer(popular(trending, asks[i].k, seen), DEGRADED, None)
            return
        source = MODEL if store_ok else DEGRADED
        for i, hist, items in zip(todo, histories, ranked, strict=True):
            k = asks[i].k
            if len(items) < k:
                self.metrics.fallbacks.labels(m.PADDED).inc()
                items = pad(items, trending, k, set(hist) if asks[i].exclude_seen else set())
            answers[i] = Answer(items, source, model.version)
