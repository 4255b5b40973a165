"""The chief's view of the sharded tables: their rows, admission and eviction.

:class:`ShardedTables` is the part of :class:`model.cluster.trainer.ClusterTrainer` that reads
the user and item tables from the parameter servers (exports, the default row, sizes) and
evicts from them, with the chief's admission stats naming the rows (module doc there).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from model.cluster.sparse import ShardedTable
from model.towers.tf_env import tf
from model.towers.two_tower import DEFAULT_KEY

if TYPE_CHECKING:
    from model.towers.config import ModelConfig
    from model.towers.two_tower import TwoTower
    from model.trainer.negatives import NegativeSampler
    from model.trainer.options import TrainOptions

log = logging.getLogger(__name__)


class ShardedTables:
    """Table reads and eviction of :class:`~model.cluster.trainer.ClusterTrainer` (a part of
    it: the attributes below are the trainer's)."""

    config: ModelConfig
    options: TrainOptions
    model: TwoTower
    negatives: NegativeSampler
    users_ps: ShardedTable
    items_ps: ShardedTable
    scheduled: int
    evicted_rows: int

    def _join(self) -> None:
        """Wait for every scheduled step (the trainer's)."""
        raise NotImplementedError

    def _sharded(self, table: Any) -> ShardedTable:
        """The sharded table of the local ``model.users`` or ``model.items``."""
        return self.users_ps if table is self.model.users else self.items_ps

    def known_rows(self, table: Any) -> tuple[np.ndarray, np.ndarray]:
        """(keys, rows) of the ids with an own row, read from the shards one parameter
        server at a time into arrays sized by the shards (the chief holds the result and
        one shard's export, not a copy of each), admission filtered by the chief's stats
        as one process filters its table. Steps may be in flight: :meth:`sync` first for
        the rows of a cut."""
        shards = self._sharded(table).params.tables
        threshold = self.model.threshold(table)
        size = sum(int(t.size()) for t in shards)
        keys_out = np.empty(size, np.int64)
        rows_out = np.empty((size, self.config.embedding_dim), np.float32)
        n = 0
        for shard in shards:
            keys, rows = (t.numpy() for t in shard.export())
            keep = keys != DEFAULT_KEY
            if threshold > 1 and keys.size:
                keep &= table.sightings(tf.constant(keys)).numpy() >= threshold
            m = int(keep.sum())
            if n + m > keys_out.size:  # a step in flight grew the shard since its size
                keys_out = np.resize(keys_out, n + m)
                rows_out = np.resize(rows_out, (n + m, rows_out.shape[1]))
            np.compress(keep, keys, out=keys_out[n:n + m])
            np.compress(keep, rows, axis=0, out=rows_out[n:n + m])
            n += m
            del keys, rows
        return keys_out[:n], rows_out[:n]

    def known_keys(self, table: Any) -> np.ndarray:
        """The admitted keys by the chief's stats: the shards hold a row for each once its
        step ran (no round trip to the parameter servers)."""
        return self._admitted(table)[0]

    def default_row(self, table: Any) -> np.ndarray:
        """The shared row of ids without one, as its shard holds it."""
        key = tf.constant([DEFAULT_KEY], tf.int64)
        return np.asarray(self._sharded(table).params.lookup(key).numpy()[0], np.float32)

    def admitted_rows(self) -> dict[str, int]:
        """Rows each table's admission stats grant (``DEFAULT_KEY`` aside): what the shards
        hold, plus their default row, once the steps in flight ran. With admission at the
        first sighting every stats entry is admitted, and the count is the stats' size."""
        out = {}
        for name, table in (("user", self.model.users), ("item", self.model.items)):
            if self.model.threshold(table) <= 1:
                out[name] = int(table.stats.size())
            else:
                out[name] = int(self._admitted(table)[0].size)
        return out

    def table_sizes(self) -> dict[str, int]:
        """Rows per table, and per table and parameter server (``item_rows_ps1``: the
        trainer's table-rows gauge and the manifest carry both)."""
        out = {}
        for name, table in (("user_rows", self.users_ps), ("item_rows", self.items_ps)):
            shards = table.shard_sizes()
            out[name] = sum(shards)
            out.update({f"{name}_ps{i}": n for i, n in enumerate(shards)})
        return out

    def maybe_evict(self) -> int:
        """Every ``evict_every_steps`` scheduled steps each table keeps its ``max_*_rows``
        most recently trained rows (the one-process rule, ``TwoTowerModel.evict``), removed
        from the shards and their accumulators on the parameter servers.

        The chief's admission stats name the rows: the PS hold a row for each admitted key
        once its step ran, so no table is read back. Every scheduled step is joined first:
        no step in flight reads or writes a row removed here.
        """
        every = self.options.evict_every_steps
        if not every or self.scheduled % every:
            return 0
        self._join()
        opts, removed = self.options, 0
        for local, sharded, cap in (
            (self.model.users, self.users_ps, opts.max_user_rows),
            (self.model.items, self.items_ps, opts.max_item_rows),
        ):
            keys, last = self._admitted(local)
            if keys.size > cap:
                drop = tf.constant(keys[np.argsort(last, kind="stable")[: keys.size - cap]])
                sharded.remove(drop)
                local.stats.remove(drop)
                removed += keys.size - cap
                log.info("evicted %d rows from %s (max %d)", keys.size - cap, sharded.name, cap)
            self.model.trim_stats(local, cap)
        self.evicted_rows += removed
        if removed and self.negatives.count:
            self.negatives.reset(self._admitted(self.model.items)[0])
        return removed

    def _admitted(self, table: Any) -> tuple[np.ndarray, np.ndarray]:
        """(keys, last step) of the admitted keys of a table's stats (``DEFAULT_KEY`` aside)."""
        keys, vals = (t.numpy() for t in table.stats.export())
        keep = (vals[:, 0] >= self.model.threshold(table)) & (keys != DEFAULT_KEY)
        return keys[keep], vals[keep, 1]
