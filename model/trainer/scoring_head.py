"""The scoring head: the served score's parts, the learned mix, and live evaluation.

Test-then-train (:meth:`ScoringHead.fit_batch`): a batch's head is scored against every
candidate with the whole served score before the batch trains, on the evaluation thread;
the learned mix and the co-visitation term learn there, in training order. Layer of
:class:`model.trainer.trainer.Trainer` above the step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from model.artifact.manifest import history_groups_entry
from model.scoring.cold import MIX, POPULAR, PRIOR, ColdStart, no_history
from model.scoring.covisit import term as covisit_term
from model.scoring.mixer import ScoreMixer
from model.scoring.prior import served_item_vectors
from model.scoring.rarity import RareSelector
from model.scoring.selector import MixSelector, dense_cells, history_counts, join_cells
from model.scoring.sessions import part as sknn_part
from model.trainer.rolling import Evaluator
from model.trainer.samples import Batch
from model.trainer.step import HeadVectors, Prepared, TrainerStep

#: Candidate columns a live step of the learned mix samples (plus the batch's targets).
MIX_SAMPLE = 2048
#: The live head ranks every this-many-th scored head under the selector's variants (a head
#: of 32 rows costs it ~10 ms over 20k-100k candidates, a sixth of the trainer's examples/s
#: when every head paid it; ``streamrec evaluate`` ranks every batch).
SELECT_EVERY = 4
#: The mix's parts whose weights the selector scales, by its scale column
#: (``model.scoring.selector``: co-visitation 0, session-kNN 1).
SCALED = {"covisit": 0, "covisit_last": 0, "sknn": 1}


class ScoringHead(TrainerStep):
    """Test-then-train on top of the step: the scoring of heads and the score's parts."""

    evaluator: Evaluator
    mixer: ScoreMixer
    cold: ColdStart
    selector: MixSelector | None
    rarity: RareSelector | None
    _mix_rng: np.random.Generator
    _eval_pool: ThreadPoolExecutor | None
    _eval_pending: deque[Future[None]]
    _since_refresh: int
    _full_batches: int
    _heads_scored: int
    #: Per counted part: (candidate keys, generation, column of each dense id)
    _columns: dict[str, tuple[np.ndarray, int, np.ndarray]]

    # -- the score's parts and their learned weights (model.scoring.mixer) -------------------
    def score_weights(self) -> tuple[float, float, float]:
        """(towers, prior, co-visitation) weights of the score as served now: the learned
        mix, or the config's constants (1, ``prior_weight``, ``covisit_weight``)."""
        w = self.mixer.as_dict()
        return w["tower"], w.get("prior", 0.0), w.get("covisit", 0.0)

    def last_weight(self) -> float:
        """Weight of the most recent history item's own co-visitation term (0: none)."""
        return self.mixer.as_dict().get("covisit_last", 0.0)

    def sknn_weight(self) -> float:
        """Weight of the session-kNN part (``model.scoring.sessions``; 0: none)."""
        return self.mixer.as_dict().get("sknn", 0.0)

    def group_scales(self) -> np.ndarray | None:
        """``[G, 2]``: per history group (``model.scoring.selector.GROUP_STARTS``) the
        (co-visitation, session-kNN) scales of those parts' weights served now; None: the
        weights alone for every row."""
        return None if self.selector is None else self.selector.scales()

    def history_groups(self) -> dict[str, Any] | None:
        """The served :meth:`group_scales` as the artifact's ``history_groups`` entry (None:
        none, or every scale 1)."""
        if self.selector is None:
            return None
        return history_groups_entry({"window": self.config.window,
                                     "starts": list(self.selector.starts),
                                     "scales": self.selector.scales()})

    def item_groups(self) -> dict[str, Any] | None:
        """The towers' scales served on rarely chosen items as the delta stream's
        ``item_groups`` entry (``model.scoring.rarity``; None: none, or every scale 1)."""
        return None if self.rarity is None else self.rarity.entry()

    def item_scales(self, keys: np.ndarray) -> np.ndarray | None:
        """float32 ``[N]``: the towers' scale served for each item of ``keys`` by its
        all-time positives so far (``model.scoring.rarity``; None: 1 for every item)."""
        if self.rarity is None or self.rarity.entry() is None:
            return None
        counts = self.cold.counts
        return self.rarity.item_scales(counts.of_buckets(counts.bucket(keys)))

    def item_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(keys, item side of the towers' part, log q or None) of every known item."""
        keys, rows, log_q = self._item_rows()
        return keys, self._tower_items(rows), log_q

    def _tower_items(self, rows: np.ndarray) -> np.ndarray:
        """Item side of the towers' part: normalised rows, over the temperature when the
        score has a prior (the towers' part as :meth:`item_vectors` carries it)."""
        if self.config.normalize and rows.size:
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        if self.config.prior_weight:
            rows = rows / np.float32(self.config.temperature)
        return np.ascontiguousarray(rows, np.float32)

    def score_parts(
        self, tower_users: np.ndarray, tower_items: np.ndarray, log_q: np.ndarray | None,
        history: np.ndarray, item_keys: np.ndarray, user_keys: np.ndarray,
    ) -> list[np.ndarray]:
        """``[B, N]`` parts of the score in :attr:`mixer` order: towers, prior, co-visitation
        (``log1p`` of the sums), session-kNN (``model.scoring.sessions.part``).
        ``tower_users`` are raw user tower outputs (no prior 1)."""
        parts = [tower_users @ tower_items.T]
        if self.config.prior_weight:
            q = np.zeros(len(item_keys), np.float32) if log_q is None else log_q
            parts.append(np.broadcast_to(np.asarray(q, np.float32), parts[0].shape))
        if self.covisit is not None:
            parts.append(np.log1p(self.covisit.sums(history, item_keys)))
            if "covisit_last" in self.mixer.names:
                parts.append(np.log1p(self.covisit.sums(history[:, :1], item_keys)))
        if self.sessions is not None:
            parts.append(sknn_part(self.sessions.dense(user_keys, history, item_keys)))
        return parts

    @property
    def _cold_applies(self) -> bool:
        """Whether :attr:`cold` chooses (a learned mix with a prior part)."""
        return self.config.mix == "learned" and "prior" in self.mixer.names

    def cold_start(self) -> str:
        """What a row with no history is served by (``model.scoring.cold``): the ranking that
        has hit most there, with a learned mix that has a prior; else the mix."""
        return self.cold.choice if self._cold_applies else MIX

    def cold_rows(self, history: np.ndarray, parts: list[np.ndarray], item_keys: np.ndarray
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``(rows, rankings)``: the rows of ``history`` with no item, and their scores over
        ``item_keys`` (the parts' columns) by the prior alone (its weight times ``log q``) and
        by all-time popularity, by name (``model.scoring.cold``; ``-inf`` where the towers'
        part is: not a candidate); no rows without a learned mix with a prior."""
        names = self.mixer.names
        if not self._cold_applies:
            return np.zeros(0, np.int64), {}
        rows = np.flatnonzero(no_history(history))
        w = self.mixer.weights[names.index("prior")]
        prior = w * np.asarray(parts[names.index("prior")], np.float64)[rows]
        popular = np.broadcast_to(self.cold.counts.scores(item_keys).astype(np.float64),
                                  prior.shape)
        candidate = np.isfinite(np.asarray(parts[0])[rows])
        return rows, {PRIOR: np.where(candidate, prior, -np.inf),
                      POPULAR: np.where(candidate, popular, -np.inf)}

    def selected_parts(self, parts: list[np.ndarray], history: np.ndarray,
                       item_keys: np.ndarray | None = None) -> list[np.ndarray]:
        """``[B, N]`` parts (:meth:`score_parts`) with the neighbour parts times each row's
        scales of the selector's leaders (``model.scoring.selector``) and the towers' part
        times each column's scale of the rare items' leaders (``model.scoring.rarity``;
        ``item_keys``: the columns' items): the mix of these is the served score."""
        out = list(parts)
        if self.selector is not None:
            scale = self.selector.row_scales(history_counts(history))
            out = [np.asarray(f) * scale[:, SCALED[name]:SCALED[name] + 1] if name in SCALED
                   else f for name, f in zip(self.mixer.names, out, strict=True)]
        items = None if item_keys is None else self.item_scales(item_keys)
        if items is not None:
            out[0] = np.asarray(out[0]) * items[None, :]
        return out

    def learn_selection(self, parts: list[np.ndarray], target_pos: np.ndarray,
                        history: np.ndarray, item_keys: np.ndarray | None = None) -> None:
        """Sum the selectors' variants' gains on scored rows (dense ``parts`` in
        :attr:`mixer` order, before the model learns them; ``-inf`` in the first: not a
        candidate): the history groups' (``model.scoring.selector``) with the towers' part
        at its served scales, the rare items' (``model.scoring.rarity``; ``item_keys``:
        the columns' items) with the neighbour parts at theirs."""
        names, weights = self.mixer.names, self.mixer.weights
        first = np.asarray(parts[0])
        counts = history_counts(history)
        tower = float(weights[0]) * np.where(np.isfinite(first), first, 0.0)
        items = None if item_keys is None else self.item_scales(item_keys)
        rest = np.zeros(first.shape, np.float64)
        cells: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {0: [], 1: []}
        for name, w, f in zip(names[1:], weights[1:], parts[1:], strict=True):
            if name in SCALED:
                cells[SCALED[name]].append(dense_cells(f, float(w)))
            else:
                rest += w * np.where(np.isfinite(f), f, 0.0)
        rest[~np.isfinite(first)] = -np.inf
        if self.selector is not None:
            served_tower = tower if items is None else tower * items[None, :]
            self.selector.observe(rest + served_tower, join_cells(cells[0]),
                                  join_cells(cells[1]), target_pos, counts)
        if self.rarity is not None and item_keys is not None:
            neighbours = rest.copy()
            if self.selector is not None:
                scale = self.selector.row_scales(counts)
                for column, part_cells in cells.items():
                    r, c, v = join_cells(part_cells)
                    np.add.at(neighbours, (r, c), v * scale[r, column])
            else:
                for part_cells in cells.values():
                    r, c, v = join_cells(part_cells)
                    np.add.at(neighbours, (r, c), v)
            cold = self.cold.counts
            self.rarity.observe(neighbours, tower, cold.of_buckets(cold.bucket(item_keys)),
                                target_pos)

    def learn_mix(self, parts: list[np.ndarray], target_pos: np.ndarray) -> None:
        """One step of the learned mix on scored rows (before the model learns them)."""
        if self.config.mix == "learned":
            self.mixer.update(parts, target_pos)

    def _observe_and_score(
        self, vectors: HeadVectors | None, head: Batch, trained: Batch
    ) -> None:
        """Evaluation-thread work of one trained batch, in training order: score its head
        with the whole served score (``vectors``: the head's user tower outputs before the
        batch trained, or a callable returning them; None = not evaluated), let the learned
        mix learn from those scores, count the batch's items for the popularity baseline,
        then let the counted parts learn it (``learn_counts``, off the training thread)."""
        if callable(vectors):
            vectors = vectors()
        ev = self.evaluator
        if vectors is not None and ev.candidate_keys.size:
            self._score_head(vectors, head)
        elif vectors is not None:
            ev.evaluate(None, ev.positions(head.item_keys))
        ev.popularity.observe(trained.item_keys)
        self.learn_counts(trained)

    def _score_head(self, vectors: np.ndarray, head: Batch) -> None:
        """The live figures of a head (``TrainOptions.eval_rows``) against every
        candidate, with the served score built in float32 (the co-visitation parts added at
        their non-zeros), then one step of the learned mix on a uniform sample of
        :data:`MIX_SAMPLE` candidate columns plus the targets (uniform negatives: the
        sampled softmax needs no correction)."""
        ev = self.evaluator
        keys, n = ev.candidate_keys, ev.candidate_keys.size
        history = head.history
        target_pos = ev.positions(head.item_keys)
        tower = vectors @ ev.candidate_tower.T
        w = self.mixer.as_dict()
        # the towers' part at each candidate's served scale (model.scoring.rarity)
        items = self.item_scales(keys)
        tower_w = (np.float32(w["tower"]) if items is None
                   else np.float32(w["tower"]) * items[None, :])
        score = tower * tower_w
        if "prior" in w and ev.candidate_log_q is not None:
            score += np.float32(w["prior"]) * ev.candidate_log_q[None, :]
        # per history group, the neighbour parts' weights scaled (model.scoring.selector),
        # the variants ranked on every SELECT_EVERY-th head
        select = self.selector
        counts = history_counts(history)
        observe = ((select is not None or self.rarity is not None)
                   and self._heads_scored % SELECT_EVERY == 0)
        self._heads_scored += 1
        base = score.copy() if observe else None
        scale = None if select is None else select.row_scales(counts).astype(np.float32)

        def served(added: np.ndarray, rows: np.ndarray, name: str) -> np.ndarray:
            """A part's weighted cells as served: times their rows' scales (none at 1)."""
            column = None if scale is None else scale[:, SCALED[name]]
            if column is None or (column == 1.0).all():
                return added
            return added * column[rows]

        sparse: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        # per scale column (SCALED), the parts' cells with their learnt weights, unscaled
        weighted: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {0: [], 1: []}
        item2item = None
        if self.covisit is not None:
            where = self._dense_columns("covisit", keys, self.covisit.keys,
                                        self.covisit.generation)
            sparse.extend(self._covisit_sparse(history, where, "covisit_last" in w))
            # at flat positions: a third of the cost of indexing by (row, column) pairs
            flat = [r * n + c for r, c, _ in sparse]
            cells = score.reshape(-1)
            assert cells.base is score  # a view: the additions land in ``score``
            for at, (r, c, v), name in zip(flat, sparse, ("covisit", "covisit_last"),
                                           strict=False):
                added = np.float32(w[name]) * v
                weighted[SCALED[name]].append((r, c, added))
                cells[at] += served(added, r, name)
            item2item = np.zeros(score.size, np.float32)
            item2item[flat[0]] = sparse[0][2]
            item2item = item2item.reshape(score.shape)
        if self.sessions is not None:
            # as the index is: what it holds back (a few batches) the served index lags more
            rows, ids, s = self.sessions.sums(head.user_keys, history, held=True)
            col = self._dense_columns("sknn", keys, self.sessions.items.keys,
                                      self.sessions.generation)[ids]
            ok = col >= 0
            sparse.append((rows[ok], col[ok], sknn_part(s[ok]).astype(np.float32)))
            added = np.float32(w["sknn"]) * sparse[-1][2]
            weighted[SCALED["sknn"]].append((rows[ok], col[ok], added))
            score.reshape(-1)[rows[ok] * n + col[ok]] += served(added, rows[ok], "sknn")
        if observe and select is not None and base is not None:
            select.observe(base, join_cells(weighted[0]), join_cells(weighted[1]), target_pos,
                           counts)
        if observe and self.rarity is not None:
            cold_counts = self.cold.counts
            self.rarity.observe(score - tower * tower_w, np.float32(w["tower"]) * tower,
                                cold_counts.of_buckets(cold_counts.bucket(keys)), target_pos)
        log_q = ev.candidate_log_q
        cold = np.zeros(0, np.int64)
        if self._cold_applies and log_q is not None:
            cold = np.flatnonzero(no_history(history))
        if cold.size and log_q is not None:  # no history: the mix, or a popularity alone
            shape = (cold.size, n)
            self.cold.rank(score, cold, {
                PRIOR: np.broadcast_to(np.float32(w["prior"]) * log_q, shape),
                POPULAR: np.broadcast_to(self.cold.counts.scores(keys), shape),
            }, target_pos[cold])
        ev.evaluate(score, target_pos, item2item=item2item, head=head)
        if self.config.mix != "learned":
            return
        cols = np.union1d(self._mix_rng.choice(n, min(n, MIX_SAMPLE), replace=False),
                          target_pos[target_pos >= 0])
        sub_target = np.where(target_pos >= 0, np.searchsorted(cols, target_pos), -1)
        parts = [tower[:, cols]]
        if "prior" in w:
            q = (np.zeros(cols.size, np.float32) if ev.candidate_log_q is None
                 else ev.candidate_log_q[cols])
            parts.append(np.broadcast_to(q, (len(tower), cols.size)))
        sub = np.full(n, -1, np.int64)
        sub[cols] = np.arange(cols.size)
        for r, c, v in sparse:
            part = np.zeros(len(tower) * cols.size, np.float32)
            at = sub[c]
            keep = at >= 0
            part[r[keep] * cols.size + at[keep]] = v[keep]
            parts.append(part.reshape(len(tower), cols.size))
        self.mixer.update(parts, sub_target)

    def _dense_columns(self, part: str, keys: np.ndarray, dense_keys: np.ndarray,
                       generation: int) -> np.ndarray:
        """Candidate column of each dense id of a counted part (``dense_keys``: the item key
        of each; -1: not a candidate), kept per part between candidate refreshes and
        extended by the ids added since (ids only grow until ``generation`` moves)."""
        cached = self._columns.get(part)
        if cached is None or cached[0] is not keys or cached[1] != generation:
            cached = (keys, generation, np.zeros(0, np.int64))
        if cached[2].size < dense_keys.size:
            new = self.evaluator.positions(dense_keys[cached[2].size:])
            cached = (keys, generation, np.concatenate([cached[2], new]))
        self._columns[part] = cached
        return cached[2]

    def _covisit_sparse(
        self, history: np.ndarray, where: np.ndarray, last: bool
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(row, candidate column, ``log1p`` of the co-visitation sum) of the non-zeros of
        ``history``, and with ``last`` of its most recent items' own term; ``where`` maps the
        state's dense ids to candidate columns (``positions``)."""
        assert self.covisit is not None
        out = []
        for triples in self.covisit.row_sums_and_last(history, last):
            if triples is None:
                continue
            rows, ids, s = triples
            col = where[ids]
            ok = col >= 0
            out.append((rows[ok], col[ok], np.log1p(s[ok]).astype(np.float32)))
        return out

    def item_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, scoring vectors float32) of every known item: the item tower output, with
        the popularity prior when ``ModelConfig.prior_weight`` (``model.scoring.prior``)."""
        return self._scoring_items(*self._item_rows())

    def _scoring_items(
        self, keys: np.ndarray, rows: np.ndarray, log_q: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`item_vectors` from :meth:`_item_rows` (numpy only: any thread)."""
        tower_w, prior_w, _ = self.score_weights()
        return keys, served_item_vectors(
            rows, log_q, normalize=self.config.normalize, tower_weight=tower_w,
            prior_weight=prior_w, temperature=self.config.temperature,
            item_scale=self.item_scales(keys),
        )

    def _refresh_candidates(
        self, keys: np.ndarray, rows: np.ndarray, log_q: np.ndarray | None
    ) -> None:
        self.evaluator.set_candidates(keys, self._tower_items(rows), log_q)

    def covisit_scores(self, history: np.ndarray, item_keys: np.ndarray) -> np.ndarray:
        """``[B, N]`` float32: the co-visitation term (``model.scoring.covisit``) of each history row
        (item keys, most recent first) for each of ``item_keys``; zeros without the term."""
        self.wait_evaluation()
        if self.covisit is None:
            return np.zeros((len(history), len(item_keys)), np.float32)
        out = covisit_term(self.covisit.sums(history, item_keys), self.score_weights()[2])
        last = self.last_weight()
        if last:
            out += covisit_term(self.covisit.sums(history[:, :1], item_keys), last)
        return out

    def session_scores(self, user_keys: np.ndarray, history: np.ndarray, item_keys: np.ndarray
                       ) -> np.ndarray:
        """``[B, N]`` float32: the session-kNN part (``model.scoring.sessions``) with its
        weight, of each row (user key, history of item keys) for each of ``item_keys``;
        zeros without the part."""
        self.wait_evaluation()
        if self.sessions is None:
            return np.zeros((len(history), len(item_keys)), np.float32)
        sums = self.sessions.dense(user_keys, history, item_keys)
        return (self.sknn_weight() * sknn_part(sums)).astype(np.float32)

    def fit_batch(self, batch: Batch, prepared: Prepared | None = None) -> float:
        """Test-then-train: score the first ``eval_rows`` rows of every ``eval_every``-th
        full batch and of every partial one (a stream slower than the trainer leaves CPU to
        spare) with the model as it was before this batch, then train on the batch (a
        partial one ``spare_epochs`` times); returns the training loss.

        The single-step path scores the user vectors its own forward pass computed before
        the update (ids first seen in this batch have just been admitted there, so they
        score with their fresh row rather than the default row: both are untrained).
        ``prepared``: ``batch``'s inputs from :meth:`prepare`.
        """
        opts = self.options
        ahead: dict[str, Any] = {}
        if prepared is not None:
            if prepared.batch is not batch:
                raise ValueError("prepared inputs of another batch")
            ahead["prepared"] = prepared
        full = len(batch) >= opts.batch_size
        evaluating = opts.eval_rows > 0 and (not full or self._full_batches % opts.eval_every == 0)
        self._full_batches += full
        head = batch.rows(slice(0, opts.eval_rows))
        vectors: HeadVectors | None = None
        if evaluating:
            if self._since_refresh >= opts.eval_refresh_steps:
                # the rows as the model holds them now; the scoring matrix is built on the
                # evaluation thread while this batch trains
                self._evaluation(self._refresh_candidates, *self._item_rows())
                self._since_refresh = 0
            if self._accumulates(batch):
                vectors = self.tower_users(head.user_keys, head.history)
        loss = self.train_step(batch, covisit=False, **ahead)
        if evaluating and vectors is None:
            vectors = self._head_vectors  # before the further passes replace them
        for epoch in range(1, 1 if full else opts.spare_epochs):
            if ahead:
                ahead["epoch"] = epoch
            loss = self.train_step(batch, count=False, covisit=False, **ahead)
        if evaluating:
            self._evaluation(self._observe_and_score, vectors, head, batch)
        else:
            self._evaluation(self._observe_and_score, None, head, batch)
        self._since_refresh += 1
        return loss

    def _evaluation(self, fn: Callable[..., None], *args: Any) -> None:
        """Run evaluation work (a candidate refresh; a head's scoring, then the batch's
        popularity counts) on the evaluation thread (``eval_async``), at most
        ``eval_queue`` pieces behind the training (the oldest is waited for first), else
        inline: the pieces run in training order on one thread, each batch is scored against
        the candidates of its own refresh and the popularity counts of the batches before
        it, whatever the depth (every piece's arguments are snapshots taken when it is
        handed over)."""
        if not self.options.eval_async:
            fn(*args)
            return
        pending = self._eval_pending
        while len(pending) >= self.options.eval_queue:
            pending.popleft().result()
        if self._eval_pool is None:
            self._eval_pool = ThreadPoolExecutor(1, thread_name_prefix="trainer-eval")
        pending.append(self._eval_pool.submit(fn, *args))

    def wait_evaluation(self) -> None:
        """Block until every batch handed to the evaluation is scored (errors re-raised)."""
        self._wait_scored()

    def _wait_scored(self) -> None:
        """Block until every piece handed to the evaluation thread is done (errors
        re-raised, oldest first)."""
        pending = self._eval_pending
        while pending:
            pending.popleft().result()

    def quality(self) -> dict[str, float]:
        """The evaluation's figures (``Evaluator.summary``) with every trained batch scored."""
        self.wait_evaluation()
        return self.evaluator.summary()

