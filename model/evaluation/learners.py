"""The methods of the evaluation behind ``model.evaluation.replay.Learner``.

* :class:`BaselineLearner` — a shared-score baseline (popularity, recent popularity).
* :class:`HistoryLearner` — a per-user baseline (co-occurrence, item-kNN, sequential rules,
  session-kNN) fed with each positive's point-in-time history as candidate indices.
* :class:`TwoTowerLearner` — the two-tower model, in-process (TensorFlow is imported on
  creation).
* :class:`PartLearner` — one part of the model's learned mix alone (the towers), ranked on
  the rows the model scored: a side figure that shows what each part brings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from model.evaluation.baselines import (
    CooccurrenceBaseline,
    PopularityBaseline,
    RecentPopularityBaseline,
    SequentialRulesBaseline,
    SessionKNNBaseline,
)
from model.evaluation.content import ContentBaseline
from model.evaluation.replay import Positive


class BaselineLearner:
    """Adapts a shared-score counter of ``model.evaluation.baselines`` to :class:`Learner`."""

    def __init__(self, baseline: PopularityBaseline | RecentPopularityBaseline) -> None:
        self.baseline = baseline
        self.name = baseline.name

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray:
        return self.baseline.scores(n_candidates)

    def tiebreak(self, n_candidates: int) -> np.ndarray | None:
        return None

    def learn(self, batch: Sequence[Positive]) -> None:
        self.baseline.learn([p.item for p in batch], [p.sample.ts_ms for p in batch])


class HistoryLearner:
    """Adapts the per-user baselines (co-occurrence and its subclass item-kNN, sequential
    rules, session-kNN, content) to :class:`Learner`.

    Each positive's point-in-time history (item ids, most recent first) becomes candidate
    indices; items the stream has not seen yet cannot occur (histories hold earlier items).
    """

    def __init__(
        self,
        baseline: (CooccurrenceBaseline | SequentialRulesBaseline | SessionKNNBaseline
                   | ContentBaseline),
        item_index: Mapping[str, int],
    ) -> None:
        self.baseline = baseline
        self.name = baseline.name
        self.item_index = item_index
        self.depth = baseline.window
        self._cached: tuple[Sequence[Positive], list[list[int]]] | None = None

    def _histories(self, batch: Sequence[Positive]) -> list[list[int]]:
        """The batch's history heads as candidate indices (kept from scoring for learning)."""
        if self._cached is not None and self._cached[0] is batch:
            return self._cached[1]
        index, depth = self.item_index, self.depth
        histories = [[index[i] for i in p.sample.history[:depth]] for p in batch]
        self._cached = (batch, histories)  # holds the batch: its identity stays unique
        return histories

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray:
        histories = self._histories(batch)
        if isinstance(self.baseline, SessionKNNBaseline):
            return self.baseline.scores([p.user for p in batch], histories, n_candidates)
        return self.baseline.scores(histories, n_candidates)

    def tiebreak(self, n_candidates: int) -> np.ndarray | None:
        return self.baseline.tiebreak(n_candidates)

    def learn(self, batch: Sequence[Positive]) -> None:
        targets = [p.item for p in batch]
        if isinstance(self.baseline, SessionKNNBaseline):
            self.baseline.learn([p.user for p in batch], targets)
        else:
            self.baseline.learn(targets, self._histories(batch))


class TwoTowerLearner:
    """The two-tower model behind :class:`Learner` (TensorFlow is imported on creation).

    Scores: user tower of (user, point-in-time history) against the item tower of every
    candidate the model has a row for, plus the co-visitation term (``model.scoring.covisit``, the
    trainer's state, as served); candidates without a row score ``-inf``.
    Learning: the batch's samples go through the ``samples`` wire format into a training
    :class:`model.trainer.trainer.Batch`, then ``epochs`` calls of ``Trainer.train_step`` (the
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
        self._excluded: Callable[[Positive], np.ndarray] | None = None
        #: The last scored batch, its parts by name (``[B, n]`` over the model's columns),
        #: those columns and the number of candidates.
        self._parts: tuple[Sequence[Positive], dict[str, np.ndarray], np.ndarray, int] | None = None
        #: Two-stage ranking as serving's (``model.scoring.ann``; None: every candidate).
        self.ann: Any = None
        self._view: Any = None
        self._ann_scored = [0.0, 0]  # share of the model's columns scored, summed; rows
        #: With ``ann``: the last scored batch and its scores over every candidate.
        self._exact: tuple[Sequence[Positive], np.ndarray] | None = None

    def bind(
        self, item_ids: list[str], excluded: Callable[[Positive], np.ndarray] | None = None,
        ann: Any = None,
    ) -> TwoTowerLearner:
        """The stream's candidate list (index -> item id) and the items each event's ranking
        leaves out (:meth:`EvalStream.excluded`), which the learned mix leaves out too.
        ``ann`` (``model.scoring.ann.AnnParams``, learned mix only): each event is ranked
        over what serving's two stages would score for it, not over every candidate."""
        self._item_ids = item_ids
        self._excluded = excluded
        self.ann = ann
        return self

    def _batch(self, batch: Sequence[Positive]) -> Any:
        from model.trainer.samples import decode_sample, to_batch

        samples = [decode_sample(p.sample.to_json()) for p in batch]
        return to_batch(samples, self.history_len, self.keys)

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray:
        # test-then-train: every step of earlier batches applied (a cluster trainer's steps
        # run asynchronously on its workers; a no-op in one process)
        self.trainer.sync()
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
        if self.trainer.sessions is not None:
            out[:, cols] += self.trainer.session_scores(train_batch.user_keys,
                                                        train_batch.history, keys[keep])
        return out

    def _mixed(
        self, batch: Sequence[Positive], train_batch: Any, keys: np.ndarray, tower: np.ndarray,
        log_q: np.ndarray | None, cols: np.ndarray, out: np.ndarray,
    ) -> np.ndarray:
        """Scores with the learned mix (``ModelConfig.mix``); then the mix learns from these
        rows (test, then train), over the candidates the ranking keeps."""
        trainer = self.trainer
        trainer.wait_evaluation()
        users = trainer.tower_users(train_batch.user_keys, train_batch.history)
        parts = trainer.score_parts(users, tower, log_q, train_batch.history, keys,
                                    train_batch.user_keys)
        mixed = trainer.mixer.score(trainer.selected_parts(parts, train_batch.history, keys))
        at = np.full(out.shape[1], -1, np.int64)
        at[cols] = np.arange(cols.size)
        target = np.array([at[p.item] if p.item < at.size else -1 for p in batch])
        learn = [np.array(f, np.float64) for f in parts]
        if self._excluded is not None:
            for row, pos in enumerate(batch):
                gone = self._excluded(pos)
                gone = at[gone[gone < at.size]]
                learn[0][row, gone[gone >= 0]] = -np.inf
        # the rows with no history get the ranking that has hit most there, then every
        # ranking's hits are counted over the items the ranking keeps (-inf: left out)
        cold, alone = trainer.cold_rows(train_batch.history, parts, keys)
        trainer.cold.rank(mixed, cold, alone, target[cold], kept=np.isfinite(learn[0][cold]))
        if self.ann is not None:
            exact = out.copy()
            exact[:, cols] = mixed
            self._exact = (batch, exact)
            mixed = np.where(self._retrieved(batch, users, tower, log_q, parts, keys, cols,
                                             out.shape[1]), mixed, -np.inf)
        out[:, cols] = mixed
        self._parts = (batch, dict(zip(trainer.mixer.names, parts, strict=True)), cols,
                       out.shape[1])
        trainer.learn_selection(learn, target, train_batch.history, keys)
        trainer.learn_mix(learn, target)
        return out

    def _retrieved(
        self, batch: Sequence[Positive], users: np.ndarray, tower: np.ndarray,
        log_q: np.ndarray | None, parts: list[np.ndarray], keys: np.ndarray, cols: np.ndarray,
        n_candidates: int,
    ) -> np.ndarray:
        """``[B, len(cols)]`` bool: what serving's two stages score for each row — the
        index's candidates over the served vectors (laid out by candidate column, so a row
        stays one item from batch to batch; the index followed as serving follows deltas,
        rebuilt when too much changed), the rows it cannot vouch for, the co-visitation
        and session-kNN rows of the row's history and the top of the cold-start rankings."""
        from model.scoring.ann import allowed, build, follow
        from model.scoring.prior import served_item_vectors, user_scoring_vectors

        trainer = self.trainer
        names = trainer.mixer.names
        has_prior = log_q is not None
        tower_w, prior_w, _ = trainer.score_weights()
        # the served vectors and queries (``tower`` is already normalised, over T)
        served = served_item_vectors(tower, log_q, normalize=False, tower_weight=tower_w,
                                     prior_weight=prior_w, temperature=1.0,
                                     item_scale=trainer.item_scales(keys))
        queries = user_scoring_vectors(users, trainer.config.prior_weight)
        vectors = np.zeros((n_candidates, served.shape[1]), np.float32)
        vectors[cols] = served
        popular = np.full(n_candidates, -np.inf)
        popular[cols] = trainer.cold.counts.scores(keys)
        view = None if self._view is None else follow(self._view.index, vectors, has_prior,
                                                      popular)
        if view is None:
            view = build(vectors, has_prior, self.ann, popular)
        self._view = view
        most = max((self._excluded(p).size for p in batch), default=0) if self._excluded else 0
        ok = allowed(view, queries, self.ann.candidates + most, n_candidates)[:, cols]
        for name in ("covisit", "covisit_last", "sknn"):
            if name in names:
                ok |= np.asarray(parts[names.index(name)]) > 0
        self._ann_scored[0] += float(ok.mean(axis=1).sum())
        self._ann_scored[1] += len(ok)
        return ok

    def exact_scores(self, batch: Sequence[Positive]) -> np.ndarray:
        """With ``ann``: ``[B, n_candidates]`` scores of ``batch`` (the batch :meth:`scores`
        scored last) over every candidate, as the model ranks without the two stages."""
        if self._exact is None or self._exact[0] is not batch:
            raise RuntimeError("exact scores are read after the model scored the same batch")
        return self._exact[1]

    @property
    def retrieval_share(self) -> float:
        """Mean share of the model's candidates the two stages let a row rank (1 without
        ``ann``)."""
        total, rows = self._ann_scored
        return total / rows if rows else 1.0

    def part_scores(self, batch: Sequence[Positive], part: str) -> np.ndarray:
        """``[B, n_candidates]`` scores of one part of the learned mix on ``batch``, the batch
        :meth:`scores` scored last (``-inf``: no row for the candidate)."""
        if self._parts is None or self._parts[0] is not batch:
            raise RuntimeError("part scores are read after the model scored the same batch")
        _, parts, cols, n_candidates = self._parts
        out = np.full((len(batch), n_candidates), -np.inf, np.float32)
        out[:, cols] = parts[part]
        return out

    def tiebreak(self, n_candidates: int) -> np.ndarray | None:
        return None

    def learn(self, batch: Sequence[Positive]) -> None:
        train_batch = self._batch(batch)
        for epoch in range(self.epochs):
            self.trainer.train_step(train_batch, count=epoch == 0)


class PartLearner:
    """One part of the model's learned mix alone (``ModelConfig.mix`` learned), e.g. the
    towers: ranked by that part's scores of the rows :class:`TwoTowerLearner` scored just
    before it (the evaluation scores its learners in order). Learns nothing itself."""

    def __init__(self, model: TwoTowerLearner, part: str = "tower") -> None:
        self.model = model
        self.part = part
        self.name = f"model-{part}"

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray:
        return self.model.part_scores(batch, self.part)

    def tiebreak(self, n_candidates: int) -> np.ndarray | None:
        return None

    def learn(self, batch: Sequence[Positive]) -> None:
        return None


class ExactLearner(PartLearner):
    """With ``--retrieval ann``: the same model ranking every candidate (``model-exact``),
    from the rows :class:`TwoTowerLearner` scored just before it, so one run gives what
    the two stages cost."""

    def __init__(self, model: TwoTowerLearner) -> None:
        super().__init__(model, "exact")

    def scores(self, batch: Sequence[Positive], n_candidates: int) -> np.ndarray:
        return self.model.exact_scores(batch)
