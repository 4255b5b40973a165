"""The two-tower trainer with its step on a parameter-server cluster.

:class:`ClusterTrainer` is a :class:`model.trainer.trainer.Trainer` (same model, loss and numpy
terms on the chief) whose tables, dense layers and their Adagrad state live on the parameter
servers and whose train step runs on the workers (``model.cluster.sparse``). The chief keeps
admission and the frequency estimate, in training order, and never waits for a new batch's
step; :meth:`sync` joins every step for a consistent cut (checkpoint: every PS writes its own
shards), and a lost server or a re-run step ends the chief, which resumes from the last cut.

Not supported yet (refused by :func:`check_supported`): the attention user tower,
``train_history=False``, gradient accumulation, bfloat16 compute, ``dedup_lookups=False``,
item attribute slots.
The split of a step, checkpoints, failures and metrics in detail: docs/internals.md.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from model.cluster.coordinator import Coordinator
from model.cluster.metrics import ClusterMetrics, ClusterSnapshot
from model.cluster.options import ClusterOptions, StepsReplayed, check_supported
from model.cluster.sparse import ShardedTable
from model.cluster.stats import StepStats, WireLedger, nbytes, ps_figures
from model.cluster.tables import ShardedTables
from model.towers.config import ModelConfig
from model.towers.tf_env import flat_caller, tf
from model.towers.two_tower import DEFAULT_KEY
from model.trainer.options import TrainOptions
from model.trainer.samples import Batch
from model.trainer.trainer import Prepared, Trainer

log = logging.getLogger(__name__)

#: Keras' legacy Adagrad (the single-process optimizers): first accumulator and epsilon.
ADAGRAD_INITIAL = 0.1
EPSILON = 1e-7


def layers_from_checkpoint(prefix: str, layers: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(weights, accumulators) of the dense layers, each flattened and concatenated in
    layer order, from a checkpoint written with one PS variable per layer
    (``dense_ps_<i>``, ``dense_acc_<i>``); None for a checkpoint without them."""
    key = "{}_{}/.ATTRIBUTES/VARIABLE_VALUE"
    names = {name for name, _ in tf.train.list_variables(prefix)}
    if key.format("dense_ps", 0) not in names:
        return None
    reader = tf.train.load_checkpoint(prefix)
    weights, accumulators = (
        np.concatenate([np.ravel(reader.get_tensor(key.format(kind, i))) for i in range(layers)])
        for kind in ("dense_ps", "dense_acc")
    )
    return weights, accumulators


def _lr(value: float | None, default: float) -> float:
    return default if value is None else value


_PREP_SIG = [
    tf.TensorSpec([None], tf.int64),
    tf.TensorSpec([None], tf.int64),
    tf.TensorSpec([None, None], tf.int64),
    tf.TensorSpec([None], tf.int64),
    tf.TensorSpec([], tf.float32),
    tf.TensorSpec([], tf.bool),
]

_STEP_SIG = [
    tf.TensorSpec([None], tf.int64),  # user keys
    tf.TensorSpec([None], tf.int64),  # item keys
    tf.TensorSpec([None, None], tf.int64),  # history
    tf.TensorSpec([None], tf.float32),  # weights
    tf.TensorSpec([None], tf.int64),  # effective user keys
    tf.TensorSpec([None], tf.int64),  # effective item keys
    tf.TensorSpec([None, None], tf.bool),  # known history entries
    tf.TensorSpec([None], tf.float32),  # log q of the items
    tf.TensorSpec([None], tf.int64),  # negative keys (DEFAULT_KEY where not valid)
    tf.TensorSpec([None], tf.bool),  # negatives valid
    tf.TensorSpec([None], tf.float32),  # negatives' log q
]


class ClusterTrainer(ShardedTables, Trainer):
    """A Trainer whose step runs on the cluster of ``conn``; see the module doc."""

    def __init__(
        self,
        config: ModelConfig,
        options: TrainOptions | None,
        conn: Coordinator,
        cluster: ClusterOptions | None = None,
        tag: str = "",
        metrics: ClusterMetrics | None = None,
        monotonic: Callable[[], float] = time.perf_counter,
    ) -> None:
        options = options or TrainOptions()
        check_supported(config, options)
        super().__init__(config, options, tag)
        self.conn = conn
        self.metrics = metrics
        self.monotonic = monotonic
        self.rows_local = False  # the rows live on the parameter servers: no deltas yet
        self.cluster_options = cluster or ClusterOptions()
        e, devices, sfx = config.embedding_dim, conn.layout.ps_devices(), f"_{tag}" if tag else ""
        wire = self.cluster_options.wire_dtype
        with conn.strategy.scope():
            self.users_ps = ShardedTable(
                f"cluster_user{sfx}", e, devices, config.init_stddev, config.seed,
                ADAGRAD_INITIAL, wire, config.init_capacity,
            )
            self.items_ps = ShardedTable(
                f"cluster_item{sfx}", e, devices, config.init_stddev, config.seed + 1,
                ADAGRAD_INITIAL, wire, config.init_capacity,
            )
            # the dense layers as one flat variable and its accumulator on one PS: a step
            # reads it and sends its gradient as one tensor each, not one per layer
            local = self.model.dense_variables
            self._dense_shapes = [tuple(v.shape) for v in local]
            flat = np.concatenate([v.numpy().ravel() for v in local]).astype(np.float32)
            self.dense_ps = tf.Variable(flat, name="ps_dense")
            with conn.strategy.extended.colocate_vars_with(self.dense_ps):
                self.dense_acc = tf.Variable(tf.fill(flat.shape, ADAGRAD_INITIAL),
                                             name="ps_dense_acc")
            #: steps begun on the workers (see the module doc)
            self.begun = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_begun")
            self.step_stats = StepStats(devices, conn.layout.num_workers)
        self.scheduled = 0
        # a restarted chief finds the tables of its predecessor on the parameter servers
        # (TFRA tables are shared by name within a server): start from empty ones
        for table in (self.users_ps, self.items_ps):
            table.params.clear()
            if table.accumulator is not None:
                table.accumulator.clear()
        key = tf.constant([DEFAULT_KEY], tf.int64)
        for table in (self.users_ps, self.items_ps):
            table.params.upsert(key, tf.zeros([1, e]))
        opts = self.options
        self._lrs = (
            _lr(opts.user_lr, opts.learning_rate),
            _lr(opts.item_lr, opts.learning_rate),
            _lr(opts.dense_lr, opts.learning_rate),
        )
        # no autograph: neither function has tensor-dependent Python control flow (a
        # trace would fail if it had), and converting them took most of the trace's seconds
        self._prepare_fn = tf.function(self._prepare, input_signature=_PREP_SIG, autograph=False)
        self._remote_fn = tf.function(
            self._distributed_step, input_signature=_STEP_SIG, autograph=False
        )
        self._prepare_concrete: Any = None
        self._remote_concrete: Any = None
        self._last_loss = float("nan")
        #: evaluation pieces (fn, args) not yet handed to the evaluation thread, in order
        self._deferred: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()

    # -- state ------------------------------------------------------------------------------
    def trackables(self) -> dict[str, object]:
        """The chief's local model (admission stats; rows equal to the shards after
        :meth:`sync`), the estimate, the step and every PS-side variable."""
        out: dict[str, object] = {"model": self.model, "freq": self.freq, "step": self.step}
        for table in (self.users_ps, self.items_ps):
            out.update(table.trackables())
        out.update({"dense_ps": self.dense_ps, "dense_acc": self.dense_acc})
        return out

    def sync(self) -> None:
        """Wait for every scheduled step, check none began twice, and copy the dense weights
        into the local model (exports read its layers). The rows stay on the parameter
        servers: a checkpoint saves each shard from its server, and exports read them
        through :meth:`known_rows` (module doc)."""
        self._join()
        begun = int(self.begun.numpy())
        if begun != self.scheduled:
            raise StepsReplayed(
                f"{begun} steps began on the workers for {self.scheduled} scheduled: a worker "
                "failed mid-step; resume from the last checkpoint"
            )
        for v_local, value in zip(self.model.dense_variables,
                                  self._dense_parts(self.dense_ps.read_value()), strict=True):
            v_local.assign(value)

    def restored(self, prefix: str) -> None:
        """A checkpoint written while each dense layer was a variable of its own on the
        PS (``dense_ps_<i>``, ``dense_acc_<i>``) restores them into the flat pair."""
        flat = layers_from_checkpoint(prefix, len(self._dense_shapes))
        if flat is not None:
            self.dense_ps.assign(flat[0])
            self.dense_acc.assign(flat[1])
            log.info("restored the dense layers of %s from their earlier per-layer variables",
                     prefix)

    def _dense_parts(self, flat: tf.Tensor) -> list[tf.Tensor]:
        """The dense layers' values (``model.dense_variables`` order) from the flat one."""
        sizes = [int(np.prod(shape)) for shape in self._dense_shapes]
        return [tf.reshape(part, shape)
                for part, shape in zip(tf.split(flat, sizes), self._dense_shapes, strict=True)]

    def _ps_model(self, flat: tf.Tensor) -> Any:
        """The towers' math with the dense layers read from the PS this step (a shallow
        copy of the local model whose layers are those values)."""
        parts = self._dense_parts(flat)
        model = copy.copy(self.model)
        n = len(self.model.kernels)
        model.kernels, model.biases = parts[0 : 2 * n : 2], parts[1 : 2 * n : 2]
        return model

    def tower_users(self, user_keys: np.ndarray, history: np.ndarray) -> np.ndarray:
        """The user tower of users with their histories on the rows the shards hold now
        (``streamrec evaluate``'s scoring): the chief keeps no copy of the shards between
        cuts, so the rows of these users and of their history items are read from the
        parameter servers into its tables first; the dense layers are the last
        :meth:`sync`'s. Steps may be in flight: :meth:`sync` first, as evaluate does."""
        for sharded, local, keys in ((self.users_ps, self.model.users, user_keys),
                                     (self.items_ps, self.model.items, history)):
            keys = np.unique(np.asarray(keys, np.int64))
            rows, exists = sharded.params.lookup(tf.constant(keys), return_exists=True)
            held = np.asarray(exists).reshape(-1)
            if held.any():
                local.params.upsert(tf.constant(keys[held]), tf.boolean_mask(rows, held))
        return super().tower_users(user_keys, history)

    def _join(self) -> None:
        """Wait for every scheduled step (timed: the chief's ``join`` wait)."""
        started = self.monotonic()
        self.conn.coordinator.join()
        if self.metrics is not None:
            self.metrics.waits["join"].observe(self.monotonic() - started)

    def snapshot(self, clock: Callable[[], float]) -> ClusterSnapshot:
        """Every PS's shard rows and traffic, every worker's steps and traffic, the chief's
        admitted rows (a few round trips to the PS: the metrics sampler, not the step)."""
        traffic, workers = self.step_stats.read()
        users, items = self.users_ps.shard_sizes(), self.items_ps.shard_sizes()
        return ClusterSnapshot(ps_figures(traffic, users, items), tuple(workers),
                               self.admitted_rows(), self.scheduled, clock())

    # -- the step -----------------------------------------------------------------------------
    def warm(self) -> None:
        """Trace the chief's part and the worker step once (else the first step does).

        The worker step is traced as ``ClusterCoordinator.schedule`` traces a
        ``tf.function`` (in the strategy's scope, marked as being scheduled); scheduling
        its concrete function then skips the per-call signature lookup too."""
        if self._remote_concrete is not None:
            return
        # called flat, as one process calls its step (model.towers.tf_env.flat_caller)
        self._prepare_concrete = flat_caller(self._prepare_fn.get_concrete_function())
        strategy = self.conn.strategy
        with strategy.scope():
            strategy.extended._being_scheduled = True  # noqa: SLF001 - as schedule() sets it
            try:
                self._remote_concrete = self._remote_fn.get_concrete_function()
            finally:
                strategy.extended._being_scheduled = False  # noqa: SLF001

    def _prepare(
        self, uk: tf.Tensor, ik: tf.Tensor, hist: tf.Tensor, neg: tf.Tensor, neg_lq: tf.Tensor,
        count: tf.Tensor,
    ) -> tuple[tf.Tensor, ...]:
        """The chief's part of a step (local state): see the module doc."""
        u_eff, i_eff, _, known, log_q = self._begin(uk, ik, hist, count)
        negs = self._negatives(neg, neg_lq)
        return u_eff, i_eff, known, log_q, negs["neg_keys"], negs["neg_valid"], negs["neg_log_q"]

    def _distributed_step(self, *args: tf.Tensor) -> Any:
        return self.conn.strategy.run(self._worker_step, args=args)

    def _worker_step(
        self, uk: tf.Tensor, ik: tf.Tensor, hist: tf.Tensor, w: tf.Tensor, u_eff: tf.Tensor,
        i_eff: tf.Tensor, known: tf.Tensor, log_q: tf.Tensor, neg_keys: tf.Tensor,
        neg_valid: tf.Tensor, neg_log_q: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """One step on a worker: :meth:`Trainer._dedup_step` with stateless reads/writes."""
        started = tf.timestamp()
        flat = self.dense_ps.read_value()  # the dense layers: one tensor from their PS
        model = self.model  # plan and widen_pool do not use the dense layers
        ledger = WireLedger(self.conn.layout.ps_devices())
        from_chief = tf.add_n([nbytes(t) for t in (uk, ik, hist, w, u_eff, i_eff, known, log_q,
                                                   neg_keys, neg_valid, neg_log_q)])
        negs = {"neg_keys": neg_keys, "neg_valid": neg_valid, "neg_log_q": neg_log_q}
        begun = self.begun.assign_add(1)  # concurrent with the reads; before any write
        plan = model.plan(u_eff, i_eff, hist, known)
        n_plan = tf.size(plan.item_keys)
        all_keys, all_idx = tf.unique(tf.concat([plan.item_keys, neg_keys], 0))
        u_route, i_route = self.users_ps.route(plan.user_keys), self.items_ps.route(all_keys)
        u_uniq = self.users_ps.read(u_route, ledger)
        i_all = self.items_ps.read(i_route, ledger)
        neg_idx = all_idx[n_plan:]
        plan = model.widen_pool(plan, tf.size(all_keys))
        with tf.GradientTape() as tape:
            tape.watch([u_uniq, i_all, flat])
            model = self._ps_model(flat)  # the layers' slices, recorded by the tape
            loss, uv = self._planned_loss(model, plan, (u_uniq, i_all, neg_idx), known,
                                          (ik, log_q, w), negs, uk)
        g_user, g_item, g_dense = tape.gradient(loss, [u_uniq, i_all, flat])
        lr_user, lr_item, lr_dense = self._lrs
        with tf.control_dependencies([begun]):
            updates = [
                self.users_ps.adagrad(u_route, tf.convert_to_tensor(g_user), lr_user,
                                      EPSILON, ledger),
                self.items_ps.adagrad(i_route, tf.convert_to_tensor(g_item), lr_item, EPSILON,
                                      ledger),
            ]
            v, g = self.dense_ps, tf.convert_to_tensor(g_dense)
            ledger.dense(v.device, v.shape.num_elements() * 4)  # float32 weights and grads
            with tf.device(v.device):  # the update computed where the weights live
                acc_now = self.dense_acc.assign_add(tf.square(g), read_value=True)
                updates.append(v.assign_sub(lr_dense * g / (tf.sqrt(acc_now) + EPSILON)))
        with tf.control_dependencies(updates):
            head = tf.cast(uv[: max(self.options.eval_rows, 0)], tf.float32)
            loss = tf.identity(loss)
        with tf.control_dependencies([loss]):  # after the writes (no new cross-device edge)
            seconds = tf.timestamp() - started
        ledger.book(self.step_stats, seconds, from_chief)
        return loss, head

    # -- public API (Trainer's, with the step on the cluster) --------------------------------
    def prepare(self, batch: Batch) -> None:
        """Nothing ahead: the chief draws a step's negatives when it schedules the step."""
        return None

    def train_step(
        self, batch: Batch, *, count: bool = True, covisit: bool = True,
        prepared: Prepared | None = None, epoch: int = 0,
    ) -> float:
        """Schedule one step of ``batch`` on a worker; returns the newest loss fetched
        (``prepared`` is never given: :meth:`prepare` makes nothing ahead).

        The chief never waits for the step of a new batch (a further pass waits for the
        steps before it, module doc): for a batch :meth:`Trainer.fit_batch`
        evaluates, the head vectors (test-then-train: computed by the step before its
        update) are fetched later by the evaluation thread (:meth:`_evaluation`).
        """
        self.warm()
        if not count:
            # a further pass over the same batch refines the previous pass's update: it
            # reads the state after it, as in one process (two passes in flight at once
            # would each step from the same state, and the batch's gradient would be
            # applied twice from it instead of once from each refined state)
            self._join()
        started = self.monotonic()
        if self.negatives.count and not self.negatives.ready:
            self.negatives.reset(self._item_rows()[0])
        self.negatives.add(batch.item_keys)
        neg, neg_lq = self.negatives.draw()
        uk = tf.constant(batch.user_keys, tf.int64)
        ik = tf.constant(batch.item_keys, tf.int64)
        hist = tf.constant(self._history(batch.history), tf.int64)
        w = tf.constant(batch.weights, tf.float32)
        prep = self._prepare_concrete(
            uk, ik, hist, tf.constant(neg, tf.int64), tf.constant(neg_lq, tf.float32),
            tf.constant(count),
        )
        args = (uk, ik, hist, w, *prep)
        remote = self.conn.coordinator.schedule(self._remote_concrete, args=args)
        self.scheduled += 1
        m = self.metrics
        if m is not None:
            m.schedule_seconds.observe(self.monotonic() - started)
            m.chief_sent(sum(t.shape.num_elements() * t.dtype.size for t in args))
        # a further pass over the same batch (count False: spare epochs) is never scored
        evaluated = count and self._evaluates(batch)
        self._head_vectors = self._head_fetch(remote) if evaluated else None
        if count and covisit:
            self.learn_counts(batch)
        self.maybe_evict()
        return self._last_loss

    def _head_fetch(self, remote: Any) -> Callable[[], np.ndarray]:
        """The head vectors of a scheduled step, fetched when called (on the evaluation
        thread; the wait is the ``fetch`` wait); the step's loss becomes the newest."""

        def fetch() -> np.ndarray:
            waiting = self.monotonic()
            loss, head = remote.fetch()
            self._last_loss = float(loss)
            vectors = np.asarray(head)
            if self.metrics is not None:
                self.metrics.waits["fetch"].observe(self.monotonic() - waiting)
                self.metrics.chief_received(np.asarray(loss).nbytes + vectors.nbytes)
            return vectors

        return fetch

    def _evaluation(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue a piece of evaluation work; pieces go to the evaluation thread in order,
        a piece behind an evaluated step only ``head_lag_steps`` batches later, so
        that step has most likely run when its head is fetched (no drained pipeline)."""
        self._deferred.append((fn, args))
        self._hand_over(self.cluster_options.head_lag_steps)

    def _hand_over(self, keep: int) -> None:
        """Hand the oldest deferred pieces to the evaluation thread until at most ``keep``
        remain, and any more at the front whose head is not in flight."""
        deferred = self._deferred
        while deferred and (len(deferred) > keep or not any(map(callable, deferred[0][1]))):
            fn, args = deferred.popleft()
            super()._evaluation(fn, *args)

    def wait_evaluation(self) -> None:
        """Hand over every deferred piece, then wait until all are scored."""
        self._hand_over(0)
        super().wait_evaluation()

    def _evaluates(self, batch: Batch) -> bool:
        """Whether :meth:`Trainer.fit_batch` scores this batch's head (it counted the batch
        in ``_full_batches`` before calling :meth:`train_step`)."""
        opts = self.options
        if opts.eval_rows <= 0:
            return False
        full = len(batch) >= opts.batch_size
        return not full or (self._full_batches - 1) % opts.eval_every == 0
