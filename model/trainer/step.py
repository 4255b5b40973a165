"""The train step: the compiled step variants, their loss, and the inputs of a step.

Four variants of one update: the single step, the same with one read per distinct key
(``dedup_lookups``), the planned loss the cluster's workers share, and gradient
accumulation over micro-batches (``grad_accum_steps``). Layer of
:class:`model.trainer.trainer.Trainer` above the tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from model.scoring.cold import ColdStart
from model.scoring.covisit import CoVisitation
from model.scoring.sessions import SessionIndex
from model.towers.loss import (
    fused_softmax_loss,
    group_ids,
    history_pool_query,
    in_batch_softmax_loss,
)
from model.towers.tf_env import flat_caller, tf
from model.towers.two_tower import DEFAULT_KEY, TwoTower
from model.trainer.samples import Batch
from model.trainer.tables import TrainerTables

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


#: Input signature of the compiled step variants.
STEP_SIGNATURE = [
    tf.TensorSpec([None], tf.int64),
    tf.TensorSpec([None], tf.int64),
    tf.TensorSpec([None, None], tf.int64),
    tf.TensorSpec([None], tf.float32),
    tf.TensorSpec([None], tf.int64),  # sampled negative item keys
    tf.TensorSpec([], tf.float32),  # log of their per-step sampling probability
    tf.TensorSpec([], tf.bool),  # record the batch's items in the frequency estimate first
]


class TrainerStep(TrainerTables):
    """The optimizer updates of a batch (:meth:`train_step`) and their inputs."""

    covisit: CoVisitation | None
    sessions: SessionIndex | None
    cold: ColdStart
    _step_fn: Any
    _step_call: Any
    _accum_fn: Any
    on_step: Callable[[Batch, np.ndarray], None] | None
    _head_vectors: HeadVectors | None

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
        attrs = model.attrs
        a_plan = model.attr_plan(all_keys) if attrs is not None else None
        with tf.GradientTape() as tape:
            u_uniq = model.shadow_rows(model.users, plan.user_keys)
            i_all = model.shadow_rows(model.items, all_keys)
            watched = [u_uniq, i_all]
            i_rows = i_all
            if attrs is not None and a_plan is not None:
                # an item's row is its id row plus its attributes' rows (attr_tokens)
                a_uniq = model.shadow_rows(attrs, a_plan[0])
                watched.append(a_uniq)
                i_rows = model.attr_compose(i_all, a_plan, a_uniq)
            loss, uv = self._planned_loss(model, plan, (u_uniq, i_rows, neg_idx), known,
                                          (ik, log_q, w), negs, uk)
        grads = tape.gradient(loss, [*watched, *dense])
        g_user, g_item = grads[0], grads[1]
        g_dense = grads[len(watched):]
        # Gradients w.r.t. the distinct rows, summed per key: dense [U, d] / [I, d] updates
        # of the shadow buffers, which hold exactly those keys in that order.
        self._apply(tf.convert_to_tensor(g_user), tf.convert_to_tensor(g_item), g_dense)
        if attrs is not None:
            self.opt_attr.apply_gradients([(tf.convert_to_tensor(grads[2]), attrs.shadow)])
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

    # -- the step as callers use it ----------------------------------------------------------
    def learn_counts(self, batch: Batch) -> None:
        """What the score's counted parts learn of a trained batch, after its step: the
        co-visitation pairs (``model.scoring.covisit``), the session-kNN index of its
        positives (``model.scoring.sessions``) and the all-time item counts of the
        cold-start ranking (``model.scoring.cold``)."""
        if self.covisit is not None:
            self.covisit.learn(batch.history, batch.item_keys, batch.weights)
        if self.sessions is not None:
            positive = np.asarray(batch.weights) > 0
            self.sessions.learn(batch.user_keys[positive], batch.item_keys[positive])
        self.cold.counts.observe(batch.item_keys)

    def train_step(
        self, batch: Batch, *, count: bool = True, covisit: bool = True,
        prepared: Prepared | None = None, epoch: int = 0,
    ) -> float:
        """One optimizer update on ``batch`` (accumulated if ``grad_accum_steps`` > 1).

        ``count``: record the batch's items in the frequency estimate (logQ correction and
        prior) first; False for further passes over the same batch (the evaluation's epochs),
        so that an item counts once per sample however often it is trained on. With ``count``
        and ``covisit`` the counted parts learn the batch too, after the step
        (:meth:`learn_counts`); :meth:`fit_batch` passes ``covisit=False`` and has them learnt
        in order on the evaluation thread instead. ``prepared``: ``batch``'s inputs from :meth:`prepare`,
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
        if count and covisit:
            self.learn_counts(batch)
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

    def _accumulates(self, batch: Batch) -> bool:
        n = self.options.grad_accum_steps
        return n > 1 and len(batch) >= n

