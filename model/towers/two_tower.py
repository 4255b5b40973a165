"""Two-tower retrieval model on TFRA dynamic embeddings.

User tower: the user's row and a recency-weighted pool of the known history items (plus, with
``ModelConfig.user_tower == "attention"``, an attention tower over the last items) through
dense layers, plus a pool residual, optionally L2-normalised — exactly what
``ServingArtifact.user_vectors`` recomputes in numpy. Item tower: the item's row of the item
table the history shares. Every sparse id goes through a ``tfra.dynamic_embedding`` table;
ids are admitted after ``admit_after`` sightings and evicted by recency of training
(:meth:`TwoTower.evict`). Training reads each table once per step for the batch's distinct
keys (:meth:`TwoTower.plan`). No global state; checkpointed with ``tf.train.Checkpoint``.
Admission, eviction and lookups in detail: docs/internals.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from model.towers.attention import AttentionTower
from model.towers.config import ModelConfig
from model.towers.tables import EmbeddingTable
from model.towers.tf_env import de, tf, tf_keras

log = logging.getLogger(__name__)

#: Key of the shared default row in both tables (the 64-bit id hash hits it w.p. 2**-64).
DEFAULT_KEY = int(np.iinfo(np.int64).min)
PAD_KEY = 0


def pool_weights(known: tf.Tensor, decay: float) -> tf.Tensor:
    """``[B, L]`` weights of the history pool: ``decay ** position`` at the known entries,
    normalised per row to sum 1 (all zero for a row without known entries).

    The numpy twin is ``model.artifact.files.pool_weights``; both define the served user tower.
    """
    w = tf.cast(known, tf.float32)
    if decay != 1.0:
        pos = tf.cast(tf.range(tf.shape(known)[1]), tf.float32)
        w = w * tf.pow(tf.constant(decay, tf.float32), pos)[None, :]
    total = tf.reduce_sum(w, axis=1, keepdims=True)
    return w / tf.where(total > 0.0, total, 1.0)


class LookupPlan(NamedTuple):
    """Distinct keys of one training batch and where each use of a key reads its row.

    ``item_keys`` holds the batch's target items followed by its known history items (only
    targets when history rows are frozen: then ``hist_keys`` holds the history's own distinct
    keys, read without gradients). ``pool`` is the ``[B, len(hist_keys)]`` sparse matrix
    whose row b holds the :func:`pool_weights` of b's known history entries (repeats add
    up): ``pool @ rows(hist_keys)`` is the (recency-weighted) mean of the known rows.
    """

    user_keys: tf.Tensor  # [U] distinct effective user keys
    user_idx: tf.Tensor  # [B] row of each batch user in user_keys
    item_keys: tf.Tensor  # [I] distinct keys read (with gradients) from the item table
    target_idx: tf.Tensor  # [B] row of each target item in item_keys
    hist_keys: tf.Tensor  # [H] distinct keys the history rows are read from
    pool: tf.SparseTensor  # [B, H] history pooling weights (``pool_weights``)
    #: [B, L] row of each history entry among the history rows (attention tower only;
    #: entries that are not known point anywhere and are masked)
    hist_pos: tf.Tensor | None = None


class TwoTower(tf.Module):
    """The model; see the module doc. ``towers`` is the one place the math lives."""

    def __init__(self, config: ModelConfig, tag: str = "", name: str = "two_tower") -> None:
        super().__init__(name=name)
        self.config = config
        e = config.embedding_dim
        # TFRA tables with equal names share one resource within a process, and TFRA
        # checkpoints match tables by name: a process holding several models gives each a
        # distinct ``tag``; a restarted trainer must use the tag it saved with.
        sfx = f"_{tag}" if tag else ""
        self.users = EmbeddingTable(
            f"user{sfx}", e, config.init_stddev, config.seed, config.init_capacity
        )
        self.items = EmbeddingTable(
            f"item{sfx}", e, config.init_stddev, config.seed + 1, config.init_capacity
        )
        #: The attribute table and each item's attribute keys and weights (``attr_tokens``).
        self.attrs: EmbeddingTable | None = None
        if config.attr_tokens:
            t = config.attr_tokens
            self.attrs = EmbeddingTable(
                f"attr{sfx}", e, config.init_stddev, config.seed + 3, config.init_capacity
            )
            self.attr_keys = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.int64, tf.zeros([t], tf.int64), name=f"item_attr_keys{sfx}"
            )
            self.attr_weights = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.float32, tf.zeros([t], tf.float32), name=f"item_attr_weights{sfx}"
            )
            #: The weights the catalogue gave (``attr_weights`` holds them times the keys'
            #: admission, :meth:`set_attributes`).
            self.attr_given = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.float32, tf.zeros([t], tf.float32), name=f"item_attr_given{sfx}"
            )
        #: Catalogued items naming each attribute key, as sorted ``(keys, counts)`` arrays
        #: (derived from the entries: rebuilt after a restore, :meth:`attributes_restored`).
        self._attr_counts: tuple[np.ndarray, np.ndarray] | None = None
        init = tf_keras.initializers.GlorotUniform(seed=config.seed + 2)
        self.kernels: list[tf.Variable] = []
        self.biases: list[tf.Variable] = []
        self.attention: AttentionTower | None = None
        width = 2 * e
        if config.attention:
            self.attention = AttentionTower(
                e, config.attention_len, config.attention_blocks, config.attention_heads,
                config.attention_ffn, config.seed + 100,
            )
            width += e if config.attention_pool else 0
        for i, out in enumerate(config.user_layers):
            self.kernels.append(tf.Variable(init([width, out]), name=f"user_w{i}"))
            self.biases.append(tf.Variable(tf.zeros([out]), name=f"user_b{i}"))
            width = out
        self.compute_dtype = tf.as_dtype(config.compute_dtype)

    # -- variables ------------------------------------------------------------------------
    @property
    def dense_variables(self) -> list[tf.Variable]:
        dense = [v for pair in zip(self.kernels, self.biases, strict=True) for v in pair]
        return dense + (self.attention.variables_list if self.attention is not None else [])

    @property
    def activations(self) -> list[str]:
        n = len(self.kernels)
        return ["relu" if i < n - 1 else "linear" for i in range(n)]

    # -- ids --------------------------------------------------------------------------------
    def admit(
        self, table: EmbeddingTable, keys: tf.Tensor, step: tf.Tensor | None
    ) -> tf.Tensor:
        """Keys with a row of their own, else DEFAULT_KEY; counts a sighting if ``step``."""
        counts = table.observe(keys, step) if step is not None else table.sightings(keys)
        admitted = counts >= self.threshold(table)
        return tf.where(admitted, keys, tf.constant(DEFAULT_KEY, tf.int64))

    def threshold(self, table: EmbeddingTable) -> int:
        """Sightings an id of ``table`` needs for a row of its own."""
        user = self.config.user_admit_after
        return user if user is not None and table is self.users else self.config.admit_after

    def known_history(self, history: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(history keys with unknown/pad entries replaced by DEFAULT_KEY, known mask)."""
        uniq, idx = tf.unique(tf.reshape(history, [-1]))  # one stats probe per distinct key
        admitted = tf.gather(self.items.sightings(uniq) >= self.config.admit_after, idx)
        known = tf.logical_and(tf.not_equal(history, PAD_KEY), tf.reshape(admitted, tf.shape(history)))
        return tf.where(known, history, tf.constant(DEFAULT_KEY, tf.int64)), known

    def prepare(
        self,
        user_keys: tf.Tensor,
        item_keys: tf.Tensor,
        history: tf.Tensor,
        step: tf.Tensor | None,
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """Effective keys ``(user, item, history, history_known)``; counts sightings if ``step``."""
        u_eff = self.admit(self.users, user_keys, step)
        i_eff = self.admit(self.items, item_keys, step)
        h_eff, known = self.known_history(history)
        return u_eff, i_eff, h_eff, known

    # -- lookups ------------------------------------------------------------------------------
    def lookup(
        self, u_eff: tf.Tensor, i_eff: tf.Tensor, h_eff: tf.Tensor, extra: tf.Tensor | None = None
    ) -> tuple[tf.Tensor, ...]:
        """Trainable lookups through the TFRA shadow variables (gradients reach the tables):
        ``(user rows, target rows, history rows)``, plus the rows of the ``extra`` item keys
        (e.g. sampled negatives) when given — read in the same single shadow lookup."""
        u_rows = self.users.layer(u_eff)
        b = tf.shape(i_eff)[0]
        n_extra = 0 if extra is None else tf.size(extra)
        tail = [] if extra is None else [extra]
        if not self.config.train_history:
            # History rows are read past the shadow variable: the optimizer then touches
            # only the batch's target rows (it rewrites every row a shadow lookup holds).
            rows = self.items.layer(tf.concat([i_eff, *tail], axis=0))
            out = (u_rows, rows[:b], self.read_rows(self.items, h_eff))
            return out if extra is None else (*out, rows[b:])
        flat = tf.reshape(h_eff, [-1])
        rows = self.items.layer(tf.concat([i_eff, flat, *tail], axis=0))
        n_hist = tf.size(flat)
        h_rows = tf.reshape(rows[b : b + n_hist], [b, -1, self.config.embedding_dim])
        if extra is None:
            return u_rows, rows[:b], h_rows
        return u_rows, rows[:b], h_rows, rows[b + n_hist : b + n_hist + n_extra]

    def read_rows(self, table: EmbeddingTable, keys: tf.Tensor) -> tf.Tensor:
        """Plain table read (no gradient path, no shadow update); unknown keys get random rows."""
        uniq, idx = tf.unique(tf.reshape(keys, [-1]))
        rows = tf.gather(table.params.lookup(uniq), idx)
        return tf.reshape(rows, tf.concat([tf.shape(keys), [self.config.embedding_dim]], 0))

    def plan(
        self, u_eff: tf.Tensor, i_eff: tf.Tensor, history: tf.Tensor, known: tf.Tensor
    ) -> LookupPlan:
        """Distinct keys per table and gather indices (see :class:`LookupPlan`)."""
        b = tf.shape(i_eff)[0]
        user_keys, user_idx = tf.unique(u_eff)
        coords = tf.where(known)  # [K, 2] (row, position) of each known history entry
        rows = coords[:, 0]
        weights = tf.gather_nd(
            pool_weights(self.pool_mask(known, keep_shape=True), self.config.history_decay),
            coords,
        )
        hist_pos = None
        if self.config.train_history:
            hist = tf.gather_nd(history, coords)
            item_keys, idx = tf.unique(tf.concat([i_eff, hist], axis=0))
            target_idx, hist_idx, hist_keys = idx[:b], idx[b:], item_keys
            if self.attention is not None:
                hist_pos = tf.scatter_nd(coords, hist_idx, tf.shape(history, out_type=tf.int64))
        else:
            item_keys, target_idx = tf.unique(i_eff)
            # The distinct keys of the whole effective history, as read_rows reads them (an
            # id first seen in this batch has no row yet: its random first row depends on them).
            h_eff = tf.where(known, history, tf.constant(DEFAULT_KEY, tf.int64))
            hist_keys, idx = tf.unique(tf.reshape(h_eff, [-1]))
            hist_idx = tf.gather_nd(tf.reshape(idx, tf.shape(history)), coords)
            if self.attention is not None:
                hist_pos = tf.reshape(idx, tf.shape(history))
        pool = tf.SparseTensor(
            tf.stack([rows, tf.cast(hist_idx, tf.int64)], axis=1),
            weights,
            tf.cast(tf.stack([b, tf.size(hist_keys)]), tf.int64),
        )
        return LookupPlan(user_keys, user_idx, item_keys, target_idx, hist_keys, pool, hist_pos)

    def widen_pool(self, plan: LookupPlan, n_rows: tf.Tensor) -> LookupPlan:
        """``plan`` whose pool reads the first of ``n_rows`` item rows (``item_keys`` then
        more keys) when the history rows are the trained item rows; else ``plan``."""
        if not self.config.train_history:
            return plan
        shape = tf.stack([plan.pool.dense_shape[0], tf.cast(n_rows, tf.int64)])
        return plan._replace(pool=tf.SparseTensor(plan.pool.indices, plan.pool.values, shape))

    def shadow_rows(self, table: EmbeddingTable, keys: tf.Tensor) -> tf.Tensor:
        """Rows of distinct ``keys`` through the table's TFRA shadow variable: the gradient
        with respect to the result is the (per key summed) gradient of the table rows."""
        return de.shadow_ops.embedding_lookup(table.shadow, keys)

    def planned_towers(
        self, plan: LookupPlan, u_uniq: tf.Tensor, i_uniq: tf.Tensor, known: tf.Tensor | None = None
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """:meth:`towers` from the distinct rows of :meth:`plan` (``u_uniq``/``i_uniq`` are the
        rows of ``plan.user_keys``/``plan.item_keys``; ``known`` for the attention tower)."""
        u_rows, pooled, attended = self.planned_inputs(plan, u_uniq, i_uniq, known)
        uv = self.user_mlp(u_rows, pooled, attended)
        return uv, self.item_tower(tf.gather(i_uniq, plan.target_idx))

    def planned_inputs(
        self, plan: LookupPlan, u_uniq: tf.Tensor, i_uniq: tf.Tensor, known: tf.Tensor | None = None
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor | None]:
        """The user MLP's inputs from the distinct rows of :meth:`plan`: (user rows, pool,
        attention output or None). ``i_uniq`` may continue past ``plan.item_keys`` if the
        pool was widened to it (:meth:`widen_pool`); the attention needs ``known``."""
        if self.config.train_history:
            h_uniq = i_uniq
        else:
            h_uniq = tf.stop_gradient(self.item_rows(plan.hist_keys))
        pooled = tf.sparse.sparse_dense_matmul(plan.pool, h_uniq)
        attended = None
        if self.attention is not None:
            if known is None or plan.hist_pos is None:
                raise ValueError("the attention tower needs the plan's hist_pos and known")
            attended = self.attend(tf.gather(h_uniq, plan.hist_pos), known)
        return tf.gather(u_uniq, plan.user_idx), pooled, attended

    # -- item attributes ---------------------------------------------------------------------
    def set_attributes(self, item_keys: np.ndarray, keys: np.ndarray, weights: np.ndarray
                       ) -> np.ndarray:
        """Items' attribute keys ``[n, attr_tokens]`` (0-padded, distinct within an item) and
        their weights (0 on the padding): an item's row is its id row plus ``sum(weights *
        attribute rows)`` over its admitted keys, those that ``attr_admit_after`` catalogued
        items name (a key below it adds nothing: its entry weighs 0 and it has no row).
        Returns the keys of every item whose entry changed: these, and the items naming a key
        whose admission changed."""
        if self.attrs is None:
            raise ValueError("the model has no attribute table (ModelConfig.attr_tokens = 0)")
        item_keys = np.asarray(item_keys, np.int64)
        keys, weights = np.asarray(keys, np.int64), np.asarray(weights, np.float32)
        old_k, old_w = self._given(item_keys)
        crossed = self._count_attributes(keys[weights > 0], old_k[old_w > 0])
        self.attr_keys.insert(tf.constant(item_keys, tf.int64), tf.constant(keys, tf.int64))
        self.attr_given.insert(tf.constant(item_keys, tf.int64), tf.constant(weights, tf.float32))
        return self._admit(item_keys, crossed)

    def _given(self, item_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The attribute keys and given weights of items (zeros: none)."""
        k = tf.constant(item_keys, tf.int64)
        return self.attr_keys.lookup(k).numpy(), self.attr_given.lookup(k).numpy()

    def _count_attributes(self, added: np.ndarray, dropped: np.ndarray) -> np.ndarray:
        """Count the entries ``added`` and uncount the ``dropped`` ones (attribute keys, one
        per item naming them); returns the keys whose admission changed and that items are
        named by both before and after (a key going from or to no item at all has no other
        item whose entry it changes: at ``attr_admit_after`` 1 no search is needed)."""
        held, counts = self.attribute_counts()
        changes = np.concatenate([added, dropped]).astype(np.int64)
        signs = np.concatenate([np.ones(added.size, np.int64), -np.ones(dropped.size, np.int64)])
        delta_keys = np.unique(changes)
        before = self._counts_of(delta_keys)
        keys, inv = np.unique(np.concatenate([held, changes]), return_inverse=True)
        total = np.bincount(inv, np.concatenate([counts, signs]).astype(np.float64),
                            minlength=keys.size).astype(np.int64)
        self._attr_counts = (keys[total > 0], total[total > 0])
        after = self._counts_of(delta_keys)
        need = self.config.attr_admit_after
        return delta_keys[((before >= need) != (after >= need)) & (np.minimum(before, after) > 0)]

    def attribute_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, counts)``: how many catalogued items name each attribute key, keys
        sorted."""
        if self._attr_counts is None:
            items, tokens = (t.numpy() for t in self.attr_keys.export())
            given = self.attr_given.lookup(tf.constant(items, tf.int64)).numpy()
            keys, counts = np.unique(tokens[given > 0], return_counts=True)
            self._attr_counts = (keys.astype(np.int64), counts.astype(np.int64))
        return self._attr_counts

    def _counts_of(self, keys: np.ndarray) -> np.ndarray:
        """How many catalogued items name each attribute key of ``keys`` (any shape)."""
        held, counts = self.attribute_counts()
        keys = np.asarray(keys, np.int64)
        if not held.size:
            return np.zeros(keys.shape, np.int64)
        pos = np.minimum(np.searchsorted(held, keys), held.size - 1)
        return np.where(held[pos] == keys, counts[pos], 0)

    def admitted(self, keys: np.ndarray) -> np.ndarray:
        """bool per attribute key: whether ``attr_admit_after`` catalogued items name it."""
        return self._counts_of(keys) >= self.config.attr_admit_after

    def _admit(self, item_keys: np.ndarray, crossed: np.ndarray) -> np.ndarray:
        """Set the entry weights (given times admitted) of ``item_keys`` and of the other
        items naming a key of ``crossed`` (found by a pass over every entry); store a row for every admitted key they name (a key
        without one reads a fresh draw at each lookup), so an item nobody chose has one
        vector until its keys train. Returns the items whose entry was set."""
        if crossed.size:
            items, tokens = (t.numpy() for t in self.attr_keys.export())
            item_keys = np.union1d(item_keys, items[np.isin(tokens, crossed).any(axis=1)])
        if not item_keys.size:
            return item_keys
        tokens, given = self._given(item_keys)
        weights = np.where(self.admitted(tokens), given, np.float32(0.0)).astype(np.float32)
        self.attr_weights.insert(tf.constant(item_keys, tf.int64), tf.constant(weights))
        used = np.unique(tokens[weights > 0])
        if used.size:
            t = tf.constant(used, tf.int64)
            rows, exists = self.attrs.params.lookup(t, return_exists=True)  # type: ignore[union-attr]
            missing = tf.logical_not(exists)
            self.attrs.params.upsert(  # type: ignore[union-attr]
                tf.boolean_mask(t, missing), tf.boolean_mask(rows, missing))
        return item_keys

    def attributes_restored(self) -> None:
        """After a checkpoint restore: the counts are derived again from the entries. A
        checkpoint from before admission has no given weights: its entries' weights are the
        catalogue's (never reweighed then), and admission is applied to them."""
        if self.attrs is None:
            return
        self._attr_counts = None
        items = self.attr_keys.export()[0]
        if int(self.attr_given.size()) < int(items.shape[0]):
            self.attr_given.insert(items, self.attr_weights.lookup(items))
            self._admit(items.numpy(), np.zeros(0, np.int64))

    def attr_plan(self, item_keys: tf.Tensor) -> tuple[tf.Tensor, ...]:
        """``(distinct attribute keys, entry -> distinct key, entry weights, entry -> item)``
        of ``item_keys`` (a vector): what :meth:`attr_compose` sums."""
        ak = tf.reshape(self.attr_keys.lookup(item_keys), [-1])
        aw = tf.reshape(self.attr_weights.lookup(item_keys), [-1])
        owner = tf.repeat(tf.range(tf.size(item_keys)), self.config.attr_tokens)
        keep = aw > 0.0
        uniq, idx = tf.unique(tf.boolean_mask(ak, keep))
        return uniq, idx, tf.boolean_mask(aw, keep), tf.boolean_mask(owner, keep)

    def attr_compose(self, rows: tf.Tensor, plan: tuple[tf.Tensor, ...], a_rows: tf.Tensor) -> tf.Tensor:
        """``rows`` (the id rows of the plan's items) plus their attribute parts; ``a_rows``
        are the rows of the plan's distinct attribute keys."""
        uniq, idx, w, owner = plan
        # one sparse [items, keys] x [keys, d] product (its gradient is the transposed
        # product): no [entries, d] gather and segment sum, forward or backward
        weights = tf.SparseTensor(
            tf.cast(tf.stack([owner, idx], axis=1), tf.int64), w,
            tf.cast(tf.stack([tf.shape(rows)[0], tf.size(uniq)]), tf.int64))
        part = tf.sparse.sparse_dense_matmul(weights, tf.cast(a_rows, tf.float32))
        return rows + tf.cast(part, rows.dtype)

    def item_rows(self, keys: tf.Tensor) -> tf.Tensor:
        """Inference rows of distinct item ``keys`` (id row, plus the attribute part): what
        the towers read of an item outside a training step. Keys must have a row of their
        own or be ``DEFAULT_KEY`` (as :meth:`known_history` leaves them)."""
        rows = self.items.params.lookup(keys)
        if self.attrs is None:
            return rows
        plan = self.attr_plan(keys)
        return self.attr_compose(rows, plan, self.attrs.params.lookup(plan[0]))

    def attr_part(self, keys: tf.Tensor) -> tf.Tensor:
        """``[n, d]``: the attribute parts of item ``keys`` (zeros without attributes)."""
        zeros = tf.zeros([tf.size(keys), self.config.embedding_dim])
        if self.attrs is None:
            return zeros
        plan = self.attr_plan(keys)
        return self.attr_compose(zeros, plan, self.attrs.params.lookup(plan[0]))

    def remove_attributes(self, item_keys: np.ndarray) -> np.ndarray:
        """Items leave the catalogue: their attribute keys and weights are dropped. Returns
        the other items whose entry changed (they name a key no longer admitted)."""
        if self.attrs is None or not len(item_keys):
            return np.zeros(0, np.int64)
        item_keys = np.asarray(item_keys, np.int64)
        old_k, old_w = self._given(item_keys)
        crossed = self._count_attributes(np.zeros(0, np.int64), old_k[old_w > 0])
        keys = tf.constant(item_keys, tf.int64)
        self.attr_keys.remove(keys)
        self.attr_weights.remove(keys)
        self.attr_given.remove(keys)
        return self._admit(np.zeros(0, np.int64), crossed)

    def attribute_keys_in_use(self) -> np.ndarray:
        """The attribute keys some catalogued item's entry names (weight > 0), sorted."""
        if self.attrs is None:
            return np.zeros(0, np.int64)
        items, tokens = (t.numpy() for t in self.attr_keys.export())
        w_items, weights = (t.numpy() for t in self.attr_weights.export())
        # the two tables hold the same items, each in its own order
        tokens = tokens[np.argsort(items, kind="stable")]
        weights = weights[np.argsort(w_items, kind="stable")]
        used = np.unique(tokens[weights > 0])
        return used[used != 0]

    def evict_attributes(self, slot_tables: Sequence[object] = ()) -> int:
        """Drop the rows of attribute keys no catalogued item names any more (items left the
        catalogue or changed their attributes), from the table, its stats and ``slot_tables``
        (the optimizer's); returns how many. A key named again later gets a fresh row, as a
        new key does (:meth:`set_attributes`)."""
        if self.attrs is None:
            return 0
        held = self.attrs.params.export()[0].numpy()
        drop = np.setdiff1d(held, self.attribute_keys_in_use())
        if drop.size:
            drop_t = tf.constant(drop, tf.int64)
            self.attrs.params.remove(drop_t)
            self.attrs.stats.remove(drop_t)
            for slot in slot_tables:
                slot.remove(drop_t)  # type: ignore[attr-defined]
            log.info("evicted %d attribute rows no catalogued item names", drop.size)
        return int(drop.size)

    def has_attributes(self, item_keys: np.ndarray) -> np.ndarray:
        """bool per item key: whether the catalogue gave it attributes."""
        if self.attrs is None or not len(item_keys):
            return np.zeros(len(item_keys), bool)
        w = self.attr_given.lookup(tf.constant(item_keys, tf.int64)).numpy()
        return (w > 0).any(axis=1)

    def attributed_items(self) -> np.ndarray:
        """Keys of the items with attributes (candidates before anybody chose them)."""
        if self.attrs is None:
            return np.zeros(0, np.int64)
        return self.attr_keys.export()[0].numpy()

    # -- math -----------------------------------------------------------------------------------
    def user_tower(self, u_rows: tf.Tensor, h_rows: tf.Tensor, known: tf.Tensor) -> tf.Tensor:
        pooled = self.history_pool(h_rows, known)
        return self.user_mlp(u_rows, pooled, self.attend(h_rows, known))

    def pool_mask(self, known: tf.Tensor, keep_shape: bool = False) -> tf.Tensor:
        """The entries of the window the pool reads: its first ``history_len`` (all of it
        unless the attention's window is longer); ``keep_shape``: as a mask of the window."""
        hl = self.config.history_len
        if self.config.tower_window <= hl:
            return known
        if not keep_shape:
            return known[:, :hl]
        return tf.logical_and(known, tf.range(tf.shape(known)[1])[None, :] < hl)

    def history_pool(self, h_rows: tf.Tensor, known: tf.Tensor) -> tf.Tensor:
        """The (recency-weighted) pool of dense ``[B, L, d]`` history rows: ``[B, d]``."""
        known = self.pool_mask(known)
        h_rows = h_rows[:, : self.config.history_len] if self.config.tower_window > self.config.history_len else h_rows
        weights = pool_weights(known, self.config.history_decay)[..., None]
        return tf.reduce_sum(h_rows * weights, axis=1)

    def attend(self, h_rows: tf.Tensor, known: tf.Tensor) -> tf.Tensor | None:
        """The attention tower's output over the window's first ``attention_len`` dense rows
        (None for the pool tower)."""
        if self.attention is None:
            return None
        n = self.config.attention_len
        return self.attention(h_rows[:, :n], known[:, :n])

    def user_mlp(
        self, u_rows: tf.Tensor, pooled: tf.Tensor, attended: tf.Tensor | None = None
    ) -> tf.Tensor:
        """Dense layers on ``concat(user row, [attention,] history pool)`` plus
        ``pool_residual`` times the pool (float32 inputs); see the module doc."""
        parts, residual = [u_rows, pooled], pooled
        if attended is not None:
            if self.config.attention_pool:
                parts = [u_rows, attended, pooled]
            else:
                parts, residual = [u_rows, attended], attended
        x = tf.cast(tf.concat(parts, axis=-1), self.compute_dtype)
        for w, b, act in zip(self.kernels, self.biases, self.activations, strict=True):
            x = tf.matmul(x, tf.cast(w, self.compute_dtype)) + tf.cast(b, self.compute_dtype)
            if act == "relu":
                x = tf.nn.relu(x)
        if self.config.pool_residual:
            x = x + tf.cast(self.config.pool_residual * residual, self.compute_dtype)
        return self._finish(x) if self.config.normalize_user else x

    def item_tower(self, i_rows: tf.Tensor) -> tf.Tensor:
        return self._finish(tf.cast(i_rows, self.compute_dtype))

    def _finish(self, x: tf.Tensor) -> tf.Tensor:
        if self.config.normalize:
            x32 = tf.cast(x, tf.float32)
            x32 = x32 / tf.maximum(tf.norm(x32, axis=-1, keepdims=True), 1e-12)
            x = tf.cast(x32, self.compute_dtype)
        return x

    def towers(
        self, u_rows: tf.Tensor, i_rows: tf.Tensor, h_rows: tf.Tensor, known: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        return self.user_tower(u_rows, h_rows, known), self.item_tower(i_rows)

    def user_vectors(self, user_keys: tf.Tensor, history: tf.Tensor) -> tf.Tensor:
        """Inference user vectors (float32), no admission counting, no gradients."""
        u_eff = self.admit(self.users, user_keys, None)
        h_eff, known = self.known_history(history)
        u_rows = self.read_rows(self.users, u_eff)
        if self.attrs is None:
            h_rows = self.read_rows(self.items, h_eff)
        else:
            uniq, idx = tf.unique(tf.reshape(h_eff, [-1]))
            h_rows = tf.reshape(tf.gather(self.item_rows(uniq), idx),
                                tf.concat([tf.shape(h_eff), [self.config.embedding_dim]], 0))
        return tf.cast(self.user_tower(u_rows, h_rows, known), tf.float32)

    # -- table maintenance ---------------------------------------------------------------------
    def known_rows(self, table: EmbeddingTable) -> tuple[np.ndarray, np.ndarray]:
        """(keys, rows) of the ids with an own row (admitted, excluding the default row)."""
        keys, rows = table.params.export()
        keys, rows = keys.numpy(), rows.numpy()
        keep = keys != DEFAULT_KEY
        if self.threshold(table) > 1 and keys.size:
            counts = table.sightings(tf.constant(keys)).numpy()
            keep &= counts >= self.threshold(table)
        return keys[keep], rows[keep]

    def init_default_rows(self) -> None:
        """Zero default rows, so an unknown id starts at the origin (and serving's default
        user row exists from the first export on)."""
        key = tf.constant([DEFAULT_KEY], tf.int64)
        zeros = tf.zeros([1, self.config.embedding_dim])
        for table in (self.users, self.items):
            table.params.upsert(key, zeros)

    def default_row(self, table: EmbeddingTable) -> np.ndarray:
        row, exists = table.params.lookup(
            tf.constant([DEFAULT_KEY], tf.int64), return_exists=True
        )
        if not bool(exists.numpy()[0]):
            return np.zeros([self.config.embedding_dim], np.float32)
        return row.numpy()[0]

    def evict(self, table: EmbeddingTable, max_rows: int, slot_tables: Sequence[object] = ()) -> int:
        """Keep the ``max_rows`` most recently trained rows; returns how many were removed.

        Also drops never-admitted stats entries older than the oldest kept row, so the stats
        table stays within a small multiple of ``max_rows``.
        """
        keys = table.params.export()[0].numpy()
        keys = keys[keys != DEFAULT_KEY]
        removed = 0
        if keys.size > max_rows:
            last = table.stats.lookup(tf.constant(keys)).numpy()[:, 1]
            drop = keys[np.argsort(last, kind="stable")[: keys.size - max_rows]]
            drop_t = tf.constant(drop)
            table.params.remove(drop_t)
            table.stats.remove(drop_t)
            for slot in slot_tables:
                slot.remove(drop_t)  # type: ignore[attr-defined]
            removed = int(drop.size)
        self.trim_stats(table, max_rows)
        if removed:
            log.info("evicted %d rows from %s (max %d)", removed, table.name, max_rows)
        return removed

    def trim_stats(self, table: EmbeddingTable, max_rows: int) -> None:
        """Drop never-admitted stats entries, oldest first, when the stats table holds more
        than ``4 * max_rows`` (down to ``2 * max_rows``)."""
        n_stats = int(table.stats.size())
        if n_stats > 4 * max(max_rows, 1):
            skeys, svals = table.stats.export()
            skeys, svals = skeys.numpy(), svals.numpy()
            cold = svals[:, 0] < self.threshold(table)
            order = np.argsort(np.where(cold, svals[:, 1], np.iinfo(np.int64).max), kind="stable")
            excess = n_stats - 2 * max(max_rows, 1)
            victims = order[:excess]
            victims = victims[cold[victims]]
            if victims.size:
                table.stats.remove(tf.constant(skeys[victims]))
