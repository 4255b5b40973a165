"""Test-then-train replay evaluation of a historical log (``streamrec evaluate``).

Protocol (the default; every number below is an :class:`EvalOptions` field):

1. The log is read and ordered exactly as ``streamrec replay`` sends it
   (``stream.replay.runner.build_plan``: same readers, same schema, order by event time, then file
   order, then line). Each event goes through the feature definitions the Flink job runs
   (``feature_store.features.update_user``), which yields the point-in-time training
   sample of every *positive* event (weight > 0: its history holds the user's earlier
   interactions). For MovieLens formats the positives are the ratings >= ``like_threshold``
   (4.0): the reader makes them ``like`` events and the other ratings ``rating`` events,
   which the evaluation gives weight 0 (they are interactions, not positives: they enter
   the history, ``features.history_event_types``, but are never a target or scored).
2. The first ``warmup_fraction`` (10%) of the positive events are a warm-up: learned
   from, not scored.
3. Every later positive event, in order, is scored: each method ranks the candidates for
   the event's user — every item seen in any event before the event's micro-batch, minus
   the items the user interacted with (any event type) before the event — and the event
   counts a hit at K if its item is among the first K. One relevant item per event, so
   ``recall@K = [rank < K]`` and ``NDCG@K = 1 / log2(rank + 2)`` if ``rank < K``.
4. Then the methods learn from it. Learning happens in micro-batches of
   ``batch_size`` (128) consecutive positives: the batch is scored with every method as it
   was before the batch, then every method learns from the batch. The model takes
   ``epochs`` optimizer steps on the batch (``model.trainer.core.Trainer.train_step``, the live
   trainer's step, fed through the ``samples`` wire format: ``Sample.to_json`` ->
   ``model.trainer.samples.decode_sample`` -> ``to_batch``).

Methods: the two-tower model (in-process, the same ``Trainer`` as ``streamrec train``),
the popularity baseline and the recent-popularity baseline (``model.evaluation.baselines``), all on
the same stream, the same micro-batches, the same candidates and exclusions.

Figures: overall (all scored events) and per chunk (the scored events split into
``chunks`` consecutive, near-equal parts, in time order).

Why B = 128: a larger B scores more events of a user's session before the model saw any of
it, a smaller one costs more time (``docs/decisions.md#evaluation-batch``). Within a batch
the history features are still exact (point-in-time).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import orjson

from feature_store.features import Event, FeatureParams, Sample, UserState, update_user
from model.evaluation.baselines import PopularityBaseline, RecentPopularityBaseline
from model.scoring.topk import top_k_rows
from model.trainer.rolling import recall_ndcg

log = logging.getLogger(__name__)

MOVIELENS_FORMATS = ("movielens", "ml-1m", "ml-100k")


@dataclass(frozen=True)
class EvalOptions:
    batch_size: int = 128
    warmup_fraction: float = 0.1
    ks: tuple[int, ...] = (10, 20)
    chunks: int = 10

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.chunks < 1 or not self.ks:
            raise ValueError("batch_size and chunks must be >= 1, ks non-empty")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError("warmup_fraction must be in [0, 1)")


@dataclass(frozen=True, slots=True)
class Positive:
    """One positive event of the stream with what scoring it needs."""

    sample: Sample
    user: int  # user index (first appearance order)
    item: int  # candidate index of the target item
    #: Items the user interacted with before this event: ``user_items[user][:seen]``.
    seen: int
    #: Items that appeared in any event before this one (candidate indices ``< n_items``).
    n_items: int


@dataclass
class EvalStream:
    """The ordered log, reduced to what the evaluation needs."""

    positives: list[Positive] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    #: Per user: candidate indices of the items they interacted with, first time first.
    user_items: list[np.ndarray] = field(default_factory=list)
    events: int = 0
    duplicates: int = 0


def evaluation_weights(weights: Mapping[str, float], fmt: str) -> dict[str, float]:
    """Event weights of the evaluation: MovieLens ``rating`` events (< threshold) are not positive."""
    out = dict(weights)
    if fmt in MOVIELENS_FORMATS:
        out["rating"] = 0.0
    return out


def build_stream(wire_events: Iterable[Mapping[str, Any]], params: FeatureParams) -> EvalStream:
    """Run ordered wire-format events through the feature definitions (see the module doc)."""
    stream = EvalStream()
    item_index: dict[str, int] = {}
    user_index: dict[str, int] = {}
    states: list[UserState] = []
    user_lists: list[list[int]] = []
    user_sets: list[set[int]] = []
    for wire in wire_events:
        stream.events += 1
        event = Event(
            event_id=wire["event_id"],
            user_id=wire["user_id"],
            item_id=wire["item_id"],
            event_type=wire["event_type"],
            ts_ms=int(wire["ts"]),
            value=wire.get("value"),
            context=wire.get("context"),
        )
        u = user_index.get(event.user_id)
        if u is None:
            u = user_index[event.user_id] = len(states)
            states.append(UserState())
            user_lists.append([])
            user_sets.append(set())
        outcome = update_user(states[u], event, params)
        if outcome.duplicate:
            stream.duplicates += 1
            continue
        n_items = len(item_index)
        i = item_index.get(event.item_id)
        if i is None:
            i = item_index[event.item_id] = n_items
            stream.item_ids.append(event.item_id)
        if outcome.sample is not None:
            stream.positives.append(Positive(outcome.sample, u, i, len(user_lists[u]), n_items))
        if i not in user_sets[u]:
            user_sets[u].add(i)
            user_lists[u].append(i)
    stream.user_items = [np.asarray(items, np.int64) for items in user_lists]
    return stream


def stream_from_plan(rows: Sequence[tuple[Any, ...]], params: FeatureParams) -> EvalStream:
    """:func:`build_stream` over the rows of ``stream.replay.runner.build_plan`` (value = wire JSON)."""
    return build_stream((orjson.loads(row[4]) for row in rows), params)


class Learner(Protocol):
    """A method under evaluation.

    ``scores`` returns ``[n_candidates]`` (one score list shared by the batch's users) or
    ``[len(batch), n_candidates]``; higher is better; ``-inf`` means "cannot recommend".
    """

    name: str

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray: ...

    def learn(self, batch: Sequence[Positive]) -> None: ...


class BaselineLearner:
    """Adapts a ``model.evaluation.baselines`` counter to :class:`Learner`."""

    def __init__(self, baseline: PopularityBaseline | RecentPopularityBaseline) -> None:
        self.baseline = baseline
        self.name = baseline.name

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray:
        return self.baseline.scores(n_candidates)

    def learn(self, batch: Sequence[Positive]) -> None:
        self.baseline.learn([p.item for p in batch], [p.sample.ts_ms for p in batch])


def recommend(
    scores: np.ndarray,
    batch: Sequence[Positive],
    user_items: Sequence[np.ndarray],
    k: int,
) -> np.ndarray:
    """Top ``k`` candidate indices per row, best first, ``-1``-padded: ``[len(batch), k]``.

    Candidates the user interacted with before the event are removed and ``-inf`` scores
    are never recommended. Shared scores (``[N]``, the baselines): ties go to the lower
    candidate index (the item seen first). Per-row scores (the model):
    ``model.scoring.topk.top_k_rows`` on the masked scores.
    """
    n = scores.shape[-1]
    out = np.full((len(batch), k), -1, np.int64)
    if n == 0 or k == 0:
        return out
    if scores.ndim == 1:
        order = np.lexsort((np.arange(n), -scores))
        order = order[np.isfinite(scores[order])]
        for row, pos in enumerate(batch):
            excluded = user_items[pos.user][: pos.seen]
            head = order[: k + excluded.size]
            if excluded.size:
                head = head[~np.isin(head, excluded)]
            head = head[:k]
            out[row, : head.size] = head
        return out
    masked = np.array(scores, np.float64)
    for row, pos in enumerate(batch):
        excluded = user_items[pos.user][: pos.seen]
        masked[row, excluded[excluded < n]] = -np.inf
    best = top_k_rows(masked, k)
    best = np.where(np.isfinite(np.take_along_axis(masked, best, axis=1)), best, -1)
    out[:, : best.shape[1]] = best
    return out


@dataclass
class EvalResult:
    """Per-method, per-figure values of every scored event (in order) and their event times."""

    ks: tuple[int, ...]
    events: int
    warmup: int
    ts_ms: np.ndarray
    #: method -> figure name (``recall@K``, ``ndcg@K``) -> value per scored event.
    values: dict[str, dict[str, np.ndarray]]

    @property
    def scored(self) -> int:
        return int(self.ts_ms.size)

    def overall(self, method: str) -> dict[str, float]:
        return _means(self.values[method], slice(None))

    def chunks(self, method: str, n: int) -> list[dict[str, float]]:
        """Figures of ``n`` consecutive near-equal parts of the scored events, in time order."""
        out = []
        for part in np.array_split(np.arange(self.scored), min(n, max(self.scored, 1))):
            if part.size == 0:
                continue
            row: dict[str, float] = {
                "first_ts": int(self.ts_ms[part[0]]),
                "last_ts": int(self.ts_ms[part[-1]]),
                "scored": int(part.size),
            }
            row.update(_means(self.values[method], slice(int(part[0]), int(part[-1]) + 1)))
            out.append(row)
        return out

    def report(self, model: str, chunks: int) -> dict[str, Any]:
        """The ``--json`` document: model figures at the top, baselines under ``baselines``."""
        doc: dict[str, Any] = dict(self.overall(model))
        doc.update({"events": self.events, "scored": self.scored, "warmup": self.warmup})
        doc["baselines"] = {
            name: {**self.overall(name), "events": self.events, "scored": self.scored}
            for name in self.values
            if name != model
        }
        doc["over_time"] = {name: self.chunks(name, chunks) for name in self.values}
        return doc


def _means(values: Mapping[str, np.ndarray], part: slice) -> dict[str, float]:
    return {name: float(v[part].mean()) if v[part].size else 0.0 for name, v in values.items()}


def evaluate(
    stream: EvalStream,
    learners: Sequence[Learner],
    options: EvalOptions,
    progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Run the protocol of the module doc over ``stream`` for every learner."""
    positives = stream.positives
    warmup = int(math.floor(options.warmup_fraction * len(positives)))
    max_k = max(options.ks)
    names = [f"{f}@{k}" for k in options.ks for f in ("recall", "ndcg")]
    parts: dict[str, dict[str, list[np.ndarray]]] = {
        m.name: {name: [] for name in names} for m in learners
    }
    ts: list[int] = []
    starts = list(range(0, warmup, options.batch_size)) + list(
        range(warmup, len(positives), options.batch_size)
    )
    for n, start in enumerate(starts):
        end = min(start + options.batch_size, warmup if start < warmup else len(positives))
        batch = positives[start:end]
        if start >= warmup:
            n_candidates = batch[0].n_items
            targets = np.fromiter((p.item for p in batch), np.int64, len(batch))
            for method in learners:
                scores = method.scores(batch, n_candidates)
                ranked = recommend(scores, batch, stream.user_items, max_k)
                for k in options.ks:
                    recall, ndcg = recall_ndcg(ranked[:, :k], targets)
                    parts[method.name][f"recall@{k}"].append(recall)
                    parts[method.name][f"ndcg@{k}"].append(ndcg)
            ts.extend(p.sample.ts_ms for p in batch)
        for method in learners:
            method.learn(batch)
        if progress is not None:
            progress(n + 1, len(starts))
    return EvalResult(
        ks=tuple(options.ks),
        events=stream.events,
        warmup=warmup,
        ts_ms=np.asarray(ts, np.int64),
        values={
            method: {name: np.concatenate(v) if v else np.zeros(0) for name, v in figs.items()}
            for method, figs in parts.items()
        },
    )


class TwoTowerLearner:
    """The two-tower model behind :class:`Learner` (TensorFlow is imported on creation).

    Scores: user tower of (user, point-in-time history) against the item tower of every
    candidate the model has a row for, plus the co-visitation term (``model.scoring.covisit``, the
    trainer's state, as served); candidates without a row score ``-inf``.
    Learning: the batch's samples go through the ``samples`` wire format into a training
    :class:`model.trainer.core.Batch`, then ``epochs`` calls of ``Trainer.train_step`` (the
    item-frequency estimate counts the batch once).
    """

    name = "model"

    def __init__(self, trainer: Any, history_len: int, epochs: int = 1) -> None:
        from model.trainer.samples import KeyCache

        self.trainer = trainer
        self.history_len = history_len
        self.epochs = epochs
        self.keys = KeyCache()
        self._key_pos: dict[int, int] = {}
        self._item_ids: list[str] = []
        self._user_items: list[np.ndarray] = []

    def bind(
        self, item_ids: list[str], user_items: Sequence[np.ndarray] | None = None
    ) -> TwoTowerLearner:
        """The stream's candidate list (index -> item id) and each user's items (first time
        first), which the learned mix leaves out of what it learns to rank against."""
        self._item_ids = item_ids
        self._user_items = list(user_items or [])
        return self

    def _batch(self, batch: Sequence[Positive]) -> Any:
        from model.trainer.samples import decode_sample, to_batch

        samples = [decode_sample(p.sample.to_json()) for p in batch]
        return to_batch(samples, self.history_len, self.keys)

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray:
        for pos in range(len(self._key_pos), n_candidates):
            self._key_pos[self.keys.item(self._item_ids[pos])] = pos
        train_batch = self._batch(batch)
        learned = self.trainer.config.mix == "learned"
        if learned:
            keys, tower, log_q = self.trainer.item_parts()
        else:
            keys, vectors = self.trainer.item_vectors()
        out = np.full((len(batch), n_candidates), -np.inf, np.float32)
        if keys.size == 0:
            return out
        where = np.fromiter((self._key_pos.get(int(k), -1) for k in keys), np.int64, keys.size)
        keep = (where >= 0) & (where < n_candidates)
        cols = where[keep]
        if learned:
            return self._mixed(batch, train_batch, keys[keep], tower[keep],
                               None if log_q is None else log_q[keep], cols, out)
        users = self.trainer.user_vectors(train_batch.user_keys, train_batch.history)
        out[:, cols] = users @ vectors[keep].T
        if self.trainer.covisit is not None:
            out[:, cols] += self.trainer.covisit_scores(train_batch.history, keys[keep])
        return out

    def _mixed(
        self, batch: Sequence[Positive], train_batch: Any, keys: np.ndarray, tower: np.ndarray,
        log_q: np.ndarray | None, cols: np.ndarray, out: np.ndarray,
    ) -> np.ndarray:
        """Scores with the learned mix; then the mix learns from these rows (test, then
        train), over the candidates the ranking keeps (the user's earlier items removed)."""
        trainer = self.trainer
        trainer.wait_evaluation()
        parts = trainer.score_parts(
            trainer.tower_users(train_batch.user_keys, train_batch.history),
            tower, log_q, train_batch.history, keys,
        )
        out[:, cols] = trainer.mixer.score(parts)
        at = np.full(out.shape[1], -1, np.int64)
        at[cols] = np.arange(cols.size)
        learn = [np.array(f, np.float64) for f in parts]
        for row, pos in enumerate(batch):
            if self._user_items:
                seen = self._user_items[pos.user][: pos.seen]
                seen = at[seen[seen < at.size]]
                learn[0][row, seen[seen >= 0]] = -np.inf
        trainer.learn_mix(learn, np.array([at[p.item] if p.item < at.size else -1 for p in batch]))
        return out

    def learn(self, batch: Sequence[Positive]) -> None:
        train_batch = self._batch(batch)
        for epoch in range(self.epochs):
            self.trainer.train_step(train_batch, count=epoch == 0)


def load_stream(
    paths: Sequence[Any],
    fmt: str | None,
    features: Any,
    now_ms: int,
    *,
    mapping: Mapping[str, str] | None = None,
    like_threshold: float = 4.0,
    event_type: str | None = None,
    limit: int | None = None,
) -> tuple[EvalStream, dict[str, Any]]:
    """Read and order ``paths`` like ``streamrec replay`` and build the :class:`EvalStream`.

    ``features`` is the ``settings.features`` section; ``now_ms`` bounds "future" event
    times (the schema rule). Returns the stream and the replay report (rejected rows).
    """
    from pathlib import Path

    from stream.replay.runner import ReplayOptions, ReplayReport, ReplaySource, build_plan

    sources = [ReplaySource.of(Path(p), fmt) for p in paths]
    options = ReplayOptions(
        limit=limit,
        like_threshold=like_threshold,
        mapping=dict(mapping or {}),
        event_type=event_type,
    )
    report = ReplayReport()
    rows = build_plan(sources, options, list(features.event_weights), now_ms, report)
    weights = features.event_weights
    for source in sources:
        weights = evaluation_weights(weights, source.fmt)
    params = FeatureParams.from_settings(features, event_weights=weights)
    stream = stream_from_plan(rows, params)
    log.info(
        "%d events, %d positives, %d items, %d rejected rows",
        stream.events,
        len(stream.positives),
        len(stream.item_ids),
        report.rejected_total,
    )
    return stream, report.as_dict()
