"""The incremental trainer core: compiled train step, options, test-then-train, eviction.

Kafka, checkpoints and exports live in ``model.trainer.service``; this module trains on
in-memory :class:`Batch` objects, so tests and benchmarks drive it directly.

Options: :class:`model.trainer.options.TrainOptions` (each documented there).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from model.scoring.covisit import CoVisitation
from model.scoring.covisit import term as covisit_term
from model.scoring.mixer import ScoreMixer
from model.scoring.prior import served_item_vectors, user_scoring_vectors
from model.towers.frequency import CountFrequencyEstimator
from model.towers.loss import (
    FrequencyEstimator,
    fused_softmax_loss,
    group_ids,
    history_pool_query,
    in_batch_softmax_loss,
)
from model.towers.tf_env import de, flat_caller, tf, tf_keras
from model.towers.two_tower import DEFAULT_KEY, ModelConfig, TwoTower
from model.trainer.negatives import NegativeSampler
from model.trainer.options import TrainOptions
from model.trainer.rolling import Evaluator
from model.trainer.samples import Batch

log = logging.getLogger(__name__)

__all__ = ["Batch", "HeadVectors", "Prepared", "Trainer", "TrainOptions"]

#: A batch's head vectors, or a callable returning them once its step ran.
HeadVectors = np.ndarray | Callable[[], np.ndarray]


@dataclass(frozen=True)
class Prepared:
    """A batch's step inputs made ahead of its turn (:meth:`Trainer.prepare`): the tensors
    of the batch, and per pass of :meth:`Trainer.fit_batch` the sampled negatives (numpy,
    for ``on_step``, and as tensors), drawn in training order; None = drawn at the step."""

    batch: Batch
    tensors: tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]
    negatives: tuple[tuple[np.ndarray, tf.Tensor, tf.Tensor], ...] | None


_SIG = [
    tf.TensorSpec([None], tf.int64),
    tf.TensorSpec([None], tf.int64),
    tf.TensorSpec([None, None], tf.int64),
    tf.TensorSpec([None], tf.float32),
    tf.TensorSpec([None], tf.int64),  # sampled negative item keys
    tf.TensorSpec([], tf.float32),  # log of their per-step sampling probability
    tf.TensorSpec([], tf.bool),  # record the batch's items in the frequency estimate first
]


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value


#: Candidate columns a live step of the learned mix samples (plus the batch's targets).
MIX_SAMPLE = 2048


def _mixer(config: ModelConfig, covisit: bool) -> ScoreMixer:
    """The score's parts (towers, then the prior and co-visitation where the model has
    them) with their initial weights; the weights learn only with ``config.mix`` learned."""
    names, initial = ["tower"], [1.0]
    if config.prior_weight:
        names.append("prior")
        initial.append(config.prior_weight)
    if covisit:
        names.append("covisit")
        initial.append(config.covisit_weight)
        if config.mix == "learned":  # the most recent item's own term, learnt from 0
            names.append("covisit_last")
            initial.append(0.0)
    return ScoreMixer(names, initial, lr=config.mix_lr)


def _adagrad(lr: float) -> Any:
    return tf_keras.optimizers.legacy.Adagrad(learning_rate=lr)


class Trainer:
    """A TwoTower model with its optimizers, logQ estimator and evaluation state."""

    def __init__(
        self, config: ModelConfig, options: TrainOptions | None = None, tag: str = ""
    ) -> None:
        """``tag`` names the TFRA tables (distinct per trainer in one process; see TwoTower)."""
        self.options = options or TrainOptions()
        opts = self.options
        if opts.mixed_precision and config.compute_dtype != "bfloat16":
            config = replace(config, compute_dtype="bfloat16")
        self.config = config
        self.model = TwoTower(config, tag=tag)
        self.freq: FrequencyEstimator | CountFrequencyEstimator
        if opts.logq_estimator == "count":
            self.freq = CountFrequencyEstimator(opts.logq_buckets, opts.logq_half_life)
        else:
            self.freq = FrequencyEstimator(opts.logq_buckets, opts.logq_alpha)
        lr = opts.learning_rate
        self.opt_user = de.DynamicEmbeddingOptimizer(_adagrad(_pick(opts.user_lr, lr)))
        self.opt_item = de.DynamicEmbeddingOptimizer(_adagrad(_pick(opts.item_lr, lr)))
        self.opt_dense = _adagrad(_pick(opts.dense_lr, lr))
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.model.init_default_rows()
        self.evaluator = Evaluator(opts.eval_k, opts.eval_window)
        self._eval_pool: ThreadPoolExecutor | None = None
        self._evict_in: int | None = None
        self._eval_pending: deque[Future[None]] = deque()
        self._since_refresh = opts.eval_refresh_steps
        self._full_batches = 0
        #: (candidate keys, co-visitation generation, ids mapped, column of each id)
        self._columns: tuple[np.ndarray, int, int, np.ndarray] | None = None
        #: The last step's head vectors (test-then-train), or a callable that returns them
        #: once the step ran (a cluster step in flight; called on the evaluation thread).
        self._head_vectors: HeadVectors | None = None
        self.negatives = NegativeSampler(opts.sampled_negatives, config.seed)
        self.covisit = (
            CoVisitation(
                config.covisit_window,
                config.covisit_decay,
                config.covisit_half_life,
                config.covisit_max_pairs,
                reverse=config.covisit_reverse,
            )
            if config.covisit_weight
            else None
        )
        self.mixer = _mixer(config, self.covisit is not None)
        self._mix_rng = np.random.default_rng(config.seed)
        single = self._dedup_step if opts.dedup_lookups else self._single_step
        self._step_fn = tf.function(single, input_signature=_SIG)
        self._step_call: Any = None
        self._accum_fn = tf.function(self._accum_step, input_signature=_SIG)
        #: Called with (batch, sampled negatives) before each optimizer update: the keys
        #: whose rows it moves (``model.trainer.deltas``); None = nobody listens.
        self.on_step: Callable[[Batch, np.ndarray], None] | None = None
        #: The model's tables hold the trained rows at every step (False: they are copied in
        #: only by :meth:`sync`, e.g. from parameter servers), which deltas read.
        self.rows_local = True
        #: Rows removed by eviction so far (a delta rescans its tables when this moves).
        self.evicted_rows = 0
        self._user_vec_fn = tf.function(
            self.model.user_vectors,
            input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, None], tf.int64)],
        )

    # -- checkpointable state ---------------------------------------------------------------
    def trackables(self) -> dict[str, object]:
        """Objects a tf.train.Checkpoint must hold to resume exactly (slots included)."""
        return {
            "model": self.model,
            "freq": self.freq,
            "opt_user": self.opt_user,
            "opt_item": self.opt_item,
            "opt_dense": self.opt_dense,
            "step": self.step,
        }

    def restored(self, prefix: str) -> None:
        """Called once the trackables are read from the checkpoint at ``prefix`` (a
        ``tf.train.Checkpoint`` path), before training: state saved in an earlier layout is
        brought forward here. Nothing to do for one process."""

    # -- the compiled steps -------------------------------------------------------------------
    def _apply(self, g_user: tf.Tensor, g_item: tf.Tensor, g_dense: list[tf.Tensor]) -> None:
        self.opt_user.apply_gradients([(g_user, self.model.users.shadow)])
        self.opt_item.apply_gradients([(g_item, self.model.items.shadow)])
        self.opt_dense.apply_gradients(zip(g_dense, self.model.dense_variables, strict=True))

    def _begin(
        self, uk: tf.Tensor, ik: tf.Tensor, hist: tf.Tensor, count: tf.Tensor
    ) -> tuple[tf.Tensor, ...]:
        # the update runs before log_q reads the estimate (automatic control dependencies);
        # a tf.cond written out, so a step traced without autograph has it too
        tf.cond(count, lambda: self.freq.update(ik), lambda: tf.constant(0.0))
        step = self.step.assign_add(1)
        u_eff, i_eff, h_eff, known = self.model.prepare(uk, ik, hist, step)
        return u_eff, i_eff, h_eff, known, self.freq.log_q(ik)

    def _negatives(self, neg: tf.Tensor, neg_lq: tf.Tensor) -> dict[str, tf.Tensor]:
        """Loss arguments of the sampled negatives except their vectors (``neg_vecs``):
        ids without an own row read the default row and are masked."""
        valid = self.model.items.sightings(neg) >= self.config.admit_after
        keys = tf.where(valid, neg, tf.constant(DEFAULT_KEY, tf.int64))
        return {
            "neg_keys": keys,
            "neg_valid": valid,
            "neg_log_q": tf.fill(tf.shape(neg), neg_lq),
        }

    def _loss_extra(self, uk: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"user_keys": uk} if self.options.mask_same_user else {}

    def _loss(
        self,
        uv: tf.Tensor,
        pooled: tf.Tensor,
        known: tf.Tensor,
        targets: tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor],
        neg_vecs: tf.Tensor,
        negs: dict[str, tf.Tensor],
        uk: tf.Tensor,
        total_w: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """The training loss: the in-batch softmax plus ``TrainOptions.aux_weight`` times
        the history-pool term (``model.towers.loss.history_pool_query``: its queries are stacked
        below the user vectors, one softmax for both). ``targets`` is
        ``(item vectors, item keys, log q, weights)``. ``total_w`` given: a micro-batch's
        share (``sum(w * ce) / total_w``, own block negatives), else the mean over the batch
        with ``loss_groups`` blocks."""
        iv, ik, log_q, w = targets
        accum = total_w is not None
        groups = 1 if accum else self.options.loss_groups
        total = total_w if accum else tf.maximum(tf.reduce_sum(w), 1e-12)
        kwargs = {"neg_vecs": neg_vecs, **negs, **self._loss_extra(uk)}
        if self.options.aux_weight:
            query, w_aux = history_pool_query(pooled, self.model.pool_mask(known), w, uv.dtype)
            uv = tf.concat([uv, query], axis=0)
            w = tf.concat([tf.cast(w, tf.float32), self.options.aux_weight * w_aux], axis=0)
        temp = self.config.temperature
        args = (uv, iv, ik, log_q, w, temp, groups, "sum")
        if accum or not self.options.fused_loss:
            return in_batch_softmax_loss(*args, **kwargs) / total
        # XLA compiles per shape: the fused loss on full batches (one shape), the op-by-op
        # one on the partial batches of a slow stream
        full = tf.equal(tf.shape(iv)[0], self.options.batch_size)
        loss = tf.cond(full, lambda: fused_softmax_loss(*args, **kwargs),
                       lambda: in_batch_softmax_loss(*args, **kwargs))
        return loss / total

    def _single_step(
        self,
        uk: tf.Tensor,
        ik: tf.Tensor,
        hist: tf.Tensor,
        w: tf.Tensor,
        neg: tf.Tensor,
        neg_lq: tf.Tensor,
        count: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Returns the loss and the user vectors of the first ``eval_rows`` rows as computed
        before the update (the test-then-train vectors, at no extra lookup cost)."""
        u_eff, i_eff, h_eff, known, log_q = self._begin(uk, ik, hist, count)
        negs = self._negatives(neg, neg_lq)
        with tf.GradientTape() as tape:
            u_rows, i_rows, h_rows, n_rows = self.model.lookup(
                u_eff, i_eff, h_eff, negs["neg_keys"]
            )
            pooled = self.model.history_pool(h_rows, known)
            uv = self.model.user_mlp(u_rows, pooled, self.model.attend(h_rows, known))
            iv = self.model.item_tower(i_rows)
            targets = (iv, ik, log_q, w)
            loss = self._loss(uv, pooled, known, targets, self.model.item_tower(n_rows), negs, uk)
        dense = self.model.dense_variables
        grads = tape.gradient(loss, [self.model.users.shadow, self.model.items.shadow, *dense])
        self._apply(grads[0], grads[1], grads[2:])
        return loss, tf.cast(uv[: max(self.options.eval_rows, 0)], tf.float32)

    def _dedup_step(
        self,
        uk: tf.Tensor,
        ik: tf.Tensor,
        hist: tf.Tensor,
        w: tf.Tensor,
        neg: tf.Tensor,
        neg_lq: tf.Tensor,
        count: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """:meth:`_single_step` with one read per distinct key (see ``dedup_lookups``)."""
        u_eff, i_eff, _, known, log_q = self._begin(uk, ik, hist, count)
        negs = self._negatives(neg, neg_lq)
        model = self.model
        plan = model.plan(u_eff, i_eff, hist, known)
        # The plan's distinct item keys stay first (tf.unique keeps first occurrences).
        n_plan = tf.size(plan.item_keys)
        all_keys, all_idx = tf.unique(tf.concat([plan.item_keys, negs["neg_keys"]], 0))
        neg_idx = all_idx[n_plan:]
        # The pool reads the history rows straight from all_keys' rows (the plan's keys come
        # first): no slice of them, whose gradient would be a dense copy.
        plan = model.widen_pool(plan, tf.size(all_keys))
        dense = model.dense_variables
        with tf.GradientTape() as tape:
            u_uniq = model.shadow_rows(model.users, plan.user_keys)
            i_all = model.shadow_rows(model.items, all_keys)
            loss, uv = self._planned_loss(model, plan, (u_uniq, i_all, neg_idx), known,
                                          (ik, log_q, w), negs, uk)
        g_user, g_item, *g_dense = tape.gradient(loss, [u_uniq, i_all, *dense])
        # Gradients w.r.t. the distinct rows, summed per key: dense [U, d] / [I, d] updates
        # of the shadow buffers, which hold exactly those keys in that order.
        self._apply(tf.convert_to_tensor(g_user), tf.convert_to_tensor(g_item), g_dense)
        return loss, tf.cast(uv[: max(self.options.eval_rows, 0)], tf.float32)

    def _planned_loss(
        self,
        model: TwoTower,
        plan: Any,
        rows: tuple[tf.Tensor, tf.Tensor, tf.Tensor],
        known: tf.Tensor,
        targets: tuple[tf.Tensor, tf.Tensor, tf.Tensor],
        negs: dict[str, tf.Tensor],
        uk: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """The loss of a planned step (one read per distinct key) and its user vectors:
        ``rows`` = (distinct user rows, distinct item rows, the negatives' indices in them),
        ``targets`` = (item keys, log q, weights). The one forward pass of the single
        process's step and of the cluster's (``model.cluster.trainer``), whatever holds
        the rows and the dense layers ``model`` computes with."""
        u_uniq, i_all, neg_idx = rows
        ik, log_q, w = targets
        u_rows, pooled, attended = model.planned_inputs(plan, u_uniq, i_all, known)
        uv = model.user_mlp(u_rows, pooled, attended)
        iv = model.item_tower(tf.gather(i_all, plan.target_idx))
        neg_vecs = model.item_tower(tf.gather(i_all, neg_idx))
        return self._loss(uv, pooled, known, (iv, ik, log_q, w), neg_vecs, negs, uk), uv

    def _materialize(self, params: object, keys: tf.Tensor) -> None:
        """Give every key a row now, so all micro-batches read the same initial values."""
        uniq, _ = tf.unique(tf.reshape(keys, [-1]))
        vals, exists = params.lookup(uniq, return_exists=True)  # type: ignore[attr-defined]
        missing = tf.logical_not(exists)
        params.upsert(tf.boolean_mask(uniq, missing), tf.boolean_mask(vals, missing))  # type: ignore[attr-defined]

    def _accum_step(
        self,
        uk: tf.Tensor,
        ik: tf.Tensor,
        hist: tf.Tensor,
        w: tf.Tensor,
        neg: tf.Tensor,
        neg_lq: tf.Tensor,
        count: tf.Tensor,
    ) -> tf.Tensor:
        n = self.options.grad_accum_steps
        e = self.config.embedding_dim
        u_eff, i_eff, h_eff, known, log_q = self._begin(uk, ik, hist, count)
        negs = self._negatives(neg, neg_lq)
        neg_keys = negs["neg_keys"]
        users, items = self.model.users, self.model.items
        self._materialize(users.params, u_eff)
        self._materialize(
            items.params, tf.concat([i_eff, tf.reshape(h_eff, [-1]), neg_keys], 0)
        )
        total_w = tf.maximum(tf.reduce_sum(w), 1e-12)
        group = group_ids(tf.shape(ik)[0], n)
        parts = [
            tf.dynamic_partition(x, group, n) for x in (u_eff, i_eff, h_eff, known, ik, log_q, w, uk)
        ]
        dense = self.model.dense_variables
        u_keys, u_grads, i_keys, i_grads = [], [], [], []
        d_grads = [tf.zeros_like(v) for v in dense]
        loss_total = tf.constant(0.0)
        for g in range(n):
            ue, ie, he, kn, ikg, lq, wg, ukg = (p[g] for p in parts)
            uu, uidx = tf.unique(ue)
            iu, iidx = tf.unique(tf.concat([ie, tf.reshape(he, [-1]), neg_keys], 0))
            with tf.GradientTape() as tape:
                u_uniq = users.params.lookup(uu)
                i_uniq = items.params.lookup(iu)
                tape.watch([u_uniq, i_uniq])
                bg = tf.shape(ie)[0]
                rows = tf.gather(i_uniq, iidx)
                n_hist = tf.size(he)
                h_rows = tf.reshape(rows[bg : bg + n_hist], [bg, -1, e])
                if not self.config.train_history:
                    h_rows = tf.stop_gradient(h_rows)
                pooled = self.model.history_pool(h_rows, kn)
                uv = self.model.user_mlp(
                    tf.gather(u_uniq, uidx), pooled, self.model.attend(h_rows, kn)
                )
                targets = (self.model.item_tower(rows[:bg]), ikg, lq, wg)
                neg_vecs = self.model.item_tower(rows[bg + n_hist :])
                loss = self._loss(uv, pooled, kn, targets, neg_vecs, negs, ukg, total_w)
            gu, gi, *gd = tape.gradient(loss, [u_uniq, i_uniq, *dense])
            u_keys.append(uu)
            u_grads.append(gu)
            i_keys.append(iu)
            i_grads.append(gi)
            d_grads = [a + b for a, b in zip(d_grads, gd, strict=True)]
            loss_total += loss
        uu, uidx = tf.unique(tf.concat(u_keys, 0))
        iu, iidx = tf.unique(tf.concat(i_keys, 0))
        gu = tf.math.unsorted_segment_sum(tf.concat(u_grads, 0), uidx, tf.size(uu))
        gi = tf.math.unsorted_segment_sum(tf.concat(i_grads, 0), iidx, tf.size(iu))
        with tf.GradientTape() as tape:
            surrogate = tf.reduce_sum(users.layer(uu) * gu) + tf.reduce_sum(items.layer(iu) * gi)
        g_user, g_item = tape.gradient(surrogate, [users.shadow, items.shadow])
        self._apply(g_user, g_item, d_grads)
        return loss_total

    # -- public API ---------------------------------------------------------------------------
    def train_step(
        self, batch: Batch, *, count: bool = True, covisit: bool = True,
        prepared: Prepared | None = None, epoch: int = 0,
    ) -> float:
        """One optimizer update on ``batch`` (accumulated if ``grad_accum_steps`` > 1).

        ``count``: record the batch's items in the frequency estimate (logQ correction and
        prior) first; False for further passes over the same batch (the evaluation's epochs),
        so that an item counts once per sample however often it is trained on. With ``count``
        and ``covisit`` the co-visitation term (``model.scoring.covisit``) learns the batch too, after
        the step; :meth:`fit_batch` passes ``covisit=False`` and has it learnt in order on the
        evaluation thread instead. ``prepared``: ``batch``'s inputs from :meth:`prepare`,
        with the negatives of its pass number ``epoch``.
        """
        if prepared is not None and prepared.negatives is not None:
            neg, neg_t, neg_lq_t = prepared.negatives[epoch]
        else:
            neg, neg_t, neg_lq_t = self._draw_negatives(batch)
        if self.on_step is not None:
            self.on_step(batch, neg)
        tensors = self._tensors(batch) if prepared is None else prepared.tensors
        args = (*tensors, neg_t, neg_lq_t, tf.constant(count))
        self._head_vectors = None
        if self._accumulates(batch):
            loss = float(self._accum_fn(*args))
        else:
            self.warm()
            loss_t, head = self._step_call(*args)
            loss = float(loss_t)
            self._head_vectors = head.numpy()
        if count and covisit and self.covisit is not None:
            self.covisit.learn(batch.history, batch.item_keys, batch.weights)
        self.maybe_evict()
        return loss

    def prepare(self, batch: Batch) -> Prepared | None:
        """``batch``'s step inputs, made ahead of its turn: while the batch before it trains
        (the step releases the interpreter lock), on another thread. Its tensors, and the
        sampled negatives of every pass :meth:`fit_batch` makes of it, unless eviction is on
        (an eviction resets the sampler between steps: they are drawn at the step then).
        Batches must be prepared in training order and each handed to :meth:`fit_batch`
        in that order, and nothing else may draw negatives meanwhile: the sampler then
        sees the batches in the same order as without preparation. Reads no model state,
        except the item table at the sampler's first use (before the first step).
        None: this trainer prepares nothing ahead."""
        negatives = None
        if not self.options.evict_every_steps:
            full = len(batch) >= self.options.batch_size
            passes = 1 if full else self.options.spare_epochs
            negatives = tuple(self._draw_negatives(batch) for _ in range(passes))
        return Prepared(batch, self._tensors(batch), negatives)

    def _draw_negatives(self, batch: Batch) -> tuple[np.ndarray, tf.Tensor, tf.Tensor]:
        """The negatives of one step on ``batch`` (keys, keys and log q as tensors)."""
        if self.negatives.count and not self.negatives.ready:
            self.negatives.reset(self.known_keys(self.model.items))
        self.negatives.add(batch.item_keys)
        neg, neg_lq = self.negatives.draw()
        return neg, tf.constant(neg, tf.int64), tf.constant(neg_lq, tf.float32)

    def _tensors(self, batch: Batch) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        return (
            tf.constant(batch.user_keys, tf.int64),
            tf.constant(batch.item_keys, tf.int64),
            tf.constant(self._history(batch.history), tf.int64),
            tf.constant(batch.weights, tf.float32),
        )

    def warm(self) -> None:
        """Trace the train step now if not yet (else its first use does: seconds on the
        2-core machine); calls then skip the ``tf.function`` dispatch and the signature
        binding (``model.towers.tf_env.flat_caller``). The trainer service
        calls it while its fetch process starts."""
        if self._step_call is None:
            self._step_call = flat_caller(self._step_fn.get_concrete_function())

    def _history(self, history: np.ndarray) -> np.ndarray:
        """The model's window of a (most recent first) history: ``ModelConfig.window``."""
        return history[:, : self.config.window]

    def _accumulates(self, batch: Batch) -> bool:
        n = self.options.grad_accum_steps
        return n > 1 and len(batch) >= n

    def user_vectors(self, user_keys: np.ndarray, history: np.ndarray) -> np.ndarray:
        """Scoring vectors of users (the user tower, plus the prior's 1: ``model.scoring.prior``)."""
        return user_scoring_vectors(self.tower_users(user_keys, history), self.config.prior_weight)

    def tower_users(self, user_keys: np.ndarray, history: np.ndarray) -> np.ndarray:
        """The user tower's output of users with their histories (most recent first)."""
        return self._user_vec_fn(
            tf.constant(user_keys, tf.int64), tf.constant(self._history(history), tf.int64)
        ).numpy()

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

    def item_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, scoring vectors float32) of every known item: the item tower output, with
        the popularity prior when ``ModelConfig.prior_weight`` (``model.scoring.prior``)."""
        return self._scoring_items(*self._item_rows())

    def known_rows(self, table: Any) -> tuple[np.ndarray, np.ndarray]:
        """(keys, rows) of the ids of ``table`` (``model.users`` or ``model.items``) with an
        own row: what exports and deltas read (``TwoTower.known_rows``; the cluster
        trainer reads its parameter servers' shards instead)."""
        return self.model.known_rows(table)

    def known_keys(self, table: Any) -> np.ndarray:
        """The keys of :meth:`known_rows` (the negatives' candidates, the live item ids)."""
        return self.known_rows(table)[0]

    def default_row(self, table: Any) -> np.ndarray:
        """The shared row of ``table``'s ids without one (``TwoTower.default_row``)."""
        return self.model.default_row(table)

    def _item_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """What :meth:`item_vectors` reads of the model now: (keys, rows, log q or None)."""
        keys, rows = self.known_rows(self.model.items)
        if not self.config.prior_weight:
            return keys, rows, None
        return keys, rows, self.freq.log_q(tf.constant(keys, tf.int64)).numpy()

    def _scoring_items(
        self, keys: np.ndarray, rows: np.ndarray, log_q: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`item_vectors` from :meth:`_item_rows` (numpy only: any thread)."""
        tower_w, prior_w, _ = self.score_weights()
        return keys, served_item_vectors(
            rows, log_q, normalize=self.config.normalize, tower_weight=tower_w,
            prior_weight=prior_w, temperature=self.config.temperature,
        )

    def _refresh_candidates(
        self, keys: np.ndarray, rows: np.ndarray, log_q: np.ndarray | None
    ) -> None:
        self.evaluator.set_candidates(keys, self._tower_items(rows), log_q)

    # -- the score's parts and their learned weights (model.scoring.mixer) -------------------
    def score_weights(self) -> tuple[float, float, float]:
        """(towers, prior, co-visitation) weights of the score as served now: the learned
        mix, or the config's constants (1, ``prior_weight``, ``covisit_weight``)."""
        w = self.mixer.as_dict()
        return w["tower"], w.get("prior", 0.0), w.get("covisit", 0.0)

    def last_weight(self) -> float:
        """Weight of the most recent history item's own co-visitation term (0: none)."""
        return self.mixer.as_dict().get("covisit_last", 0.0)

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
        history: np.ndarray, item_keys: np.ndarray,
    ) -> list[np.ndarray]:
        """``[B, N]`` parts of the score in :attr:`mixer` order: towers, prior, co-visitation
        (``log1p`` of the sums). ``tower_users`` are raw user tower outputs (no prior 1)."""
        parts = [tower_users @ tower_items.T]
        if self.config.prior_weight:
            q = np.zeros(len(item_keys), np.float32) if log_q is None else log_q
            parts.append(np.broadcast_to(np.asarray(q, np.float32), parts[0].shape))
        if self.covisit is not None:
            parts.append(np.log1p(self.covisit.sums(history, item_keys)))
            if "covisit_last" in self.mixer.names:
                parts.append(np.log1p(self.covisit.sums(history[:, :1], item_keys)))
        return parts

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
        then let the co-visitation term learn it (off the training thread)."""
        if callable(vectors):
            vectors = vectors()
        ev = self.evaluator
        if vectors is not None and ev.candidate_keys.size:
            self._score_head(vectors, head)
        elif vectors is not None:
            ev.evaluate(None, ev.positions(head.item_keys))
        ev.popularity.observe(trained.item_keys)
        if self.covisit is not None:
            self.covisit.learn(trained.history, trained.item_keys, trained.weights)

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
        score = tower * np.float32(w["tower"])
        if "prior" in w and ev.candidate_log_q is not None:
            score += np.float32(w["prior"]) * ev.candidate_log_q[None, :]
        sparse: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        item2item = None
        if self.covisit is not None:
            where = self._covisit_columns(keys)
            sparse.extend(self._covisit_sparse(history, where, "covisit_last" in w))
            for (r, c, v), name in zip(sparse, ("covisit", "covisit_last"), strict=False):
                score[r, c] += np.float32(w[name]) * v
            r, c, v = sparse[0]
            item2item = np.zeros((len(score), n), np.float32)
            item2item[r, c] = v
        ev.evaluate(score, target_pos, item2item=item2item)
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
            part = np.zeros((len(tower), cols.size), np.float32)
            keep = sub[c] >= 0
            part[r[keep], sub[c[keep]]] = v[keep]
            parts.append(part)
        self.mixer.update(parts, sub_target)

    def _covisit_columns(self, keys: np.ndarray) -> np.ndarray:
        """Candidate column of each co-visitation dense id (-1: not a candidate), kept
        between candidate refreshes and extended by the ids added since."""
        cv = self.covisit
        assert cv is not None
        ids, cached = cv.keys, self._columns
        if cached is None or cached[0] is not keys or cached[1] != cv.generation:
            cached = (keys, cv.generation, 0, np.zeros(0, np.int64))
        if cached[2] < ids.size:
            new = self.evaluator.positions(ids[cached[2]:])
            cached = (keys, cv.generation, ids.size, np.concatenate([cached[3], new]))
        self._columns = cached
        return cached[3]

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

    def sync(self) -> None:
        """Block until every step handed out is applied to the state a checkpoint saves
        (a no-op in one process; the cluster trainer waits for its workers)."""

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

    def maybe_evict(self) -> int:
        every = self.options.evict_every_steps
        if not every:
            return 0
        # Reads the step variable only when a multiple of ``every`` is due (a countdown in
        # between; a checkpoint restore is caught up with at the next read).
        if self._evict_in is not None and self._evict_in > 1:
            self._evict_in -= 1
            return 0
        due = int(self.step.numpy()) % every
        self._evict_in = every - due
        if due:
            return 0
        removed = 0
        for table, opt, cap in (
            (self.model.users, self.opt_user, self.options.max_user_rows),
            (self.model.items, self.opt_item, self.options.max_item_rows),
        ):
            removed += self.model.evict(table, cap, self._slot_tables(opt, table))
        self.evicted_rows += removed
        if removed and self.negatives.count:
            self.negatives.reset(self.known_keys(self.model.items))
        return removed

    @staticmethod
    def _slot_tables(opt: object, table: object) -> list[object]:
        try:
            slot = opt.get_slot(table.shadow, "accumulator")  # type: ignore[attr-defined]
        except (KeyError, AttributeError, ValueError):
            return []
        return [slot.params]

    def table_sizes(self) -> dict[str, int]:
        return {"user_rows": self.model.users.size(), "item_rows": self.model.items.size()}
