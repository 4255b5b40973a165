"""The trainer's tables: reads of the TFRA tables, the user tower, and eviction.

The bottom layer of :class:`model.trainer.trainer.Trainer` (tables <- step <- scoring head
<- trainer, each using only the layers beneath it). It declares the state the layers share;
the trainer builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from feature_store.catalogue import FeatureSpec, attribute_row
from model.scoring.attributes import attribute_parts
from model.scoring.prior import user_scoring_vectors
from model.towers.frequency import CountFrequencyEstimator
from model.towers.loss import FrequencyEstimator
from model.towers.tf_env import tf
from model.towers.two_tower import ModelConfig, TwoTower
from model.trainer.negatives import NegativeSampler
from model.trainer.options import TrainOptions
from streamrec.ids import item_key


class TrainerTables:
    """Reads of the model's tables and their eviction (the rows exports and deltas read)."""

    options: TrainOptions
    config: ModelConfig
    model: TwoTower
    freq: FrequencyEstimator | CountFrequencyEstimator
    opt_user: Any
    opt_item: Any
    opt_attr: Any
    opt_dense: Any
    step: tf.Variable
    negatives: NegativeSampler
    evicted_rows: int
    #: Attribute rows dropped because no catalogued item names their key any more.
    evicted_attr_rows: int
    _evict_in: int | None
    _user_vec_fn: Callable[..., Any]
    #: Hears the item keys whose catalogue entry changed (:meth:`set_catalogue`,
    #: :meth:`remove_catalogue`): the delta stream re-sends their rows.
    on_catalogue: Callable[[np.ndarray], None] | None = None

    def user_vectors(self, user_keys: np.ndarray, history: np.ndarray) -> np.ndarray:
        """Scoring vectors of users (the user tower, plus the prior's 1: ``model.scoring.prior``)."""
        return user_scoring_vectors(self.tower_users(user_keys, history), self.config.prior_weight)

    def tower_users(self, user_keys: np.ndarray, history: np.ndarray) -> np.ndarray:
        """The user tower's output of users with their histories (most recent first)."""
        return self._user_vec_fn(
            tf.constant(user_keys, tf.int64), tf.constant(self._history(history), tf.int64)
        ).numpy()

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
        keys, rows = self.item_table_rows()
        if not self.config.prior_weight:
            return keys, rows, None
        return keys, rows, self.freq.log_q(tf.constant(keys, tf.int64)).numpy()

    def item_table_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, rows) of every candidate item: the ids with an own row and, with attribute
        slots (``ModelConfig.attr_tokens``), every catalogued item (an item nobody chose
        has the table's default row), each row plus its attribute part
        (:meth:`attribute_parts`)."""
        keys, rows = self.known_rows(self.model.items)
        model = self.model
        if model.attrs is None:
            return keys, rows
        extra = np.setdiff1d(model.attributed_items(), keys)
        base = np.broadcast_to(model.default_row(model.items), (extra.size, rows.shape[1]))
        keys = np.concatenate([keys, extra])
        rows = np.concatenate([rows, base]).astype(np.float32)
        return keys, rows + self.attribute_parts(keys)

    def item_hist_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, rows) of the ids with an own row, each plus its attribute part: the rows a
        version pools histories from (an item without an own row is unknown there, as in
        the user tower)."""
        keys, rows = self.known_rows(self.model.items)
        if self.model.attrs is None:
            return keys, rows
        return keys, rows + self.attribute_parts(keys)

    def attribute_entries(self, item_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, weights)`` ``[n, attr_tokens]`` of items (zeros: no attributes)."""
        model = self.model
        k = tf.constant(np.asarray(item_keys, np.int64), tf.int64)
        return model.attr_keys.lookup(k).numpy(), model.attr_weights.lookup(k).numpy()

    def attribute_rows(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sorted distinct attribute keys of ``tokens``, their rows float32); key 0 (the
        padding) left out."""
        model = self.model
        keys = np.unique(np.asarray(tokens, np.int64))
        keys = keys[keys != 0]
        if model.attrs is None or not keys.size:
            return keys, np.zeros((keys.size, self.config.embedding_dim), np.float32)
        rows, exists = model.attrs.params.lookup(tf.constant(keys, tf.int64),
                                                 return_exists=True)
        # a key without a row (evicted since a step moved it) is left out: a lookup would
        # draw a fresh row for it
        exists = exists.numpy()
        return keys[exists], rows.numpy()[exists]

    def attribute_parts(self, item_keys: np.ndarray) -> np.ndarray:
        """``[n, d]``: the attribute parts of items (``model.scoring.attributes``; zeros
        without attributes), as versions and serving compute them."""
        tokens, weights = self.attribute_entries(item_keys)
        table_keys, table_rows = self.attribute_rows(tokens[weights > 0])
        return attribute_parts(tokens, weights, table_keys, table_rows)

    def set_catalogue(
        self, spec: FeatureSpec, items: Iterable[tuple[str, Mapping[str, Any]]]
    ) -> int:
        """Give items their attributes (checked ``attributes`` of ``spec``'s item slots;
        ``feature_store.catalogue.attribute_row``); returns how many items were set.
        ``on_catalogue`` hears the keys of every item whose entry changed (these, and
        those naming a key whose admission changed: ``TwoTower.set_attributes``)."""
        width = self.config.attr_tokens
        keys: list[int] = []
        a_keys: list[np.ndarray] = []
        a_weights: list[np.ndarray] = []
        for item_id, attributes in items:
            k, w = attribute_row(spec, attributes, width)
            keys.append(item_key(item_id))
            a_keys.append(k)
            a_weights.append(w)
        if keys:
            item_keys = np.asarray(keys, np.int64)
            changed = self.model.set_attributes(item_keys, np.stack(a_keys), np.stack(a_weights))
            if self.on_catalogue is not None:
                self.on_catalogue(changed)
        return len(keys)

    def remove_catalogue(self, item_ids: Iterable[str]) -> int:
        """Items leave the catalogue (their attributes are dropped; ``on_catalogue`` hears
        the keys); returns how many."""
        keys = np.fromiter((item_key(i) for i in item_ids), np.int64)
        if keys.size:
            changed = self.model.remove_attributes(keys)
            if self.on_catalogue is not None:
                self.on_catalogue(np.union1d(keys, changed))
        return int(keys.size)

    def _history(self, history: np.ndarray) -> np.ndarray:
        """The user tower's window of a (most recent first) history:
        ``ModelConfig.tower_window``."""
        return history[:, : self.config.tower_window]

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
        if self.model.attrs is not None:  # the rows of attribute keys no item names
            self.evicted_attr_rows += self.model.evict_attributes(
                self._slot_tables(self.opt_attr, self.model.attrs))
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
