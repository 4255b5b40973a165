"""Sharded dynamic-embedding tables and the stateless sparse optimizers of the cluster step.

A :class:`ShardedTable` is a TFRA ``de.Variable`` sharded over the parameter servers
(``key % num_ps``), plus an accumulator variable for Adagrad. The step never goes through
TFRA's shadow variables (one coordinator-side buffer shared by every worker loses updates:
docs/cluster.md); it is stateless instead: read the rows of the step's distinct keys
(insert-if-absent), compute the gradient on the worker, and add the optimizer's delta on the
parameter server with ``accum(exists=True)``, so concurrent steps add up, never overwrite.
Rows and gradients may travel as bfloat16 (``wire_dtype``). The three steps in detail:
docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from model.towers.tf_env import de, tf

if TYPE_CHECKING:
    from model.cluster.stats import WireLedger


def key_uniform(keys: tf.Tensor, dim: int, seed: int) -> tf.Tensor:
    """``[len(keys), dim]`` uniform [0, 1) values, a fixed function of (key, column, seed):
    a step that runs twice, or on another worker, draws the same first row of a key
    (splitmix64 of ``key * dim + column``)."""
    k = tf.bitcast(tf.cast(keys, tf.int64), tf.uint64)[:, None]
    cols = tf.cast(tf.range(dim, dtype=tf.int64), tf.uint64)[None, :]
    x = k * tf.constant(dim, tf.uint64) + cols
    x = x + tf.constant((seed * 0x9E3779B97F4A7C15) % (1 << 64), tf.uint64)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(shift, tf.uint64)))
        x = x * tf.constant(mult, tf.uint64)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(31, tf.uint64)))
    top = tf.bitwise.right_shift(x, tf.constant(40, tf.uint64))  # 24 bits: exact in float32
    return tf.cast(top, tf.float32) * (1.0 / (1 << 24))


@dataclass(frozen=True)
class Route:
    """A step's distinct keys split by shard (``key % shards``), computed once on the worker:
    the read and the write of a step take the same route, so each shard's keys reach its
    parameter server once per step (TF sends a tensor once to each device that consumes
    it), not once for the read and again with the gradients."""

    keys: tf.Tensor
    shard: tf.Tensor  # shard of each key
    parts: list[tf.Tensor]  # keys per shard
    pos: list[tf.Tensor]  # their positions in ``keys``


class ShardedTable:
    """A float32 table sharded over ``devices`` (``key % len(devices)``), optionally with an
    Adagrad accumulator. A key's first row is uniform in ``+-init_stddev * sqrt(3)`` (a
    fixed function of key and ``seed``: :func:`key_uniform`), zeros for ``init_stddev=0``."""

    def __init__(
        self,
        name: str,
        dim: int,
        devices: Sequence[str],
        init_stddev: float = 0.0,
        seed: int = 0,
        adagrad_initial: float | None = None,
        wire_dtype: str = "float32",
        init_capacity: int = 8192,
    ) -> None:
        self.name = name
        self.dim = dim
        self.devices = list(devices)
        self.half_width = init_stddev * 3.0**0.5
        self.seed = seed
        self.wire_dtype = tf.as_dtype(wire_dtype)
        self.params = de.get_variable(
            name, key_dtype=tf.int64, value_dtype=tf.float32, dim=dim, devices=self.devices,
            initializer=0.0, init_size=init_capacity,
        )
        self.accumulator = None
        self.adagrad_initial = adagrad_initial
        if adagrad_initial is not None:
            self.accumulator = de.get_variable(
                f"{name}_accum", key_dtype=tf.int64, value_dtype=tf.float32, dim=dim,
                devices=self.devices, initializer=adagrad_initial, init_size=init_capacity,
            )

    def initial_rows(self, keys: tf.Tensor) -> tf.Tensor:
        """First rows of ``keys`` (see the class doc)."""
        if not self.half_width:
            return tf.zeros([tf.size(keys), self.dim], tf.float32)
        u = key_uniform(keys, self.dim, self.seed)
        return (2.0 * u - 1.0) * self.half_width

    def _initial_accumulator(self, keys: tf.Tensor) -> tf.Tensor:
        return tf.fill([tf.size(keys), self.dim], float(self.adagrad_initial or 0.0))

    def trackables(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"{self.name}_params": self.params}
        if self.accumulator is not None:
            out[f"{self.name}_accum"] = self.accumulator
        return out

    # -- the shards -------------------------------------------------------------------------
    def route(self, keys: tf.Tensor | Route) -> Route:
        """The :class:`Route` of distinct ``keys`` (TFRA's ``key % shards``); a route is
        returned as it is."""
        if isinstance(keys, Route):
            return keys
        n = len(self.devices)
        shard = tf.cast(keys % n, tf.int32)
        parts = tf.dynamic_partition(keys, shard, n)
        pos = tf.dynamic_partition(tf.range(tf.size(keys)), shard, n)
        return Route(keys, shard, parts, pos)

    def _read_shard(self, table: Any, keys: tf.Tensor, init: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor:
        """Rows of ``keys`` in one shard, run on its parameter server: a missing key's first
        row is inserted if absent (a key another worker inserted meanwhile keeps that row)
        and read again, with no round trip to the worker in between."""
        zeros = tf.zeros([tf.size(keys), self.dim], tf.float32)
        rows, exists = table.lookup(keys, dynamic_default_values=zeros, return_exists=True)
        missing = tf.logical_not(tf.reshape(exists, [-1]))
        new_keys = tf.boolean_mask(keys, missing)
        first = init(new_keys)
        insert = table.accum(new_keys, first, tf.zeros([tf.size(new_keys), 1], tf.bool))
        with tf.control_dependencies([insert]):
            won = table.lookup(new_keys, dynamic_default_values=first)
        return tf.tensor_scatter_nd_update(rows, tf.cast(tf.where(missing), tf.int32), won)

    # -- reads -----------------------------------------------------------------------------
    @property
    def row_bytes(self) -> int:
        """Bytes of one row (or gradient) on the wire."""
        return self.dim * self.wire_dtype.size

    def read(self, keys: tf.Tensor | Route, ledger: WireLedger | None = None) -> tf.Tensor:
        """``[len(keys), dim]`` rows of distinct ``keys`` (each key gets a row); each shard's
        rows leave their parameter server in the wire dtype (booked in ``ledger``). Pass
        the step's :meth:`route` here and to the write, so the keys travel once."""
        route = self.route(keys)
        rows = []
        for i, device in enumerate(self.devices):
            with tf.device(device):
                r = self._read_shard(self.params.tables[i], route.parts[i], self.initial_rows)
                r = tf.cast(r, self.wire_dtype)
            rows.append(tf.cast(r, tf.float32))
            if ledger is not None:
                ledger.exchange(i, route.parts[i], self.row_bytes, rows_to_ps=False)
        return tf.reshape(tf.dynamic_stitch(route.pos, rows), [tf.size(route.keys), self.dim])

    # -- writes ----------------------------------------------------------------------------
    def _per_shard(
        self, keys: tf.Tensor | Route, grads: tf.Tensor,
        apply: Callable[[int, tf.Tensor, tf.Tensor], list[Any]], ledger: WireLedger | None,
    ) -> Any:
        """``apply(shard, keys, grads)`` on each parameter server, the gradients sent in the
        wire dtype and float32 again on the PS (booked in ``ledger``; the keys only when
        they were not routed for the read already)."""
        route = self.route(keys)
        g_parts = tf.dynamic_partition(tf.cast(grads, self.wire_dtype), route.shard,
                                       len(self.devices))
        ops = []
        for i, device in enumerate(self.devices):
            with tf.device(device):
                ops.extend(apply(i, route.parts[i], tf.cast(g_parts[i], tf.float32)))
            if ledger is not None:
                ledger.exchange(i, route.parts[i], self.row_bytes, rows_to_ps=True,
                                keys_sent=not isinstance(keys, Route))
        return tf.group(ops)

    @staticmethod
    def _add(table: Any, keys: tf.Tensor, delta: tf.Tensor) -> Any:
        """Add ``delta`` to the rows of existing ``keys`` of one shard (on its PS)."""
        return table.accum(keys, delta, tf.ones([tf.size(keys), 1], tf.bool))

    def sgd(self, keys: tf.Tensor | Route, grads: tf.Tensor, lr: float, ledger: WireLedger | None = None) -> Any:
        """Plain SGD on the rows of distinct ``keys`` (read by :meth:`read` this step; pass
        the same :class:`Route`)."""
        return self._per_shard(
            keys, grads, lambda i, k, g: [self._add(self.params.tables[i], k, -lr * g)], ledger
        )

    def adagrad(
        self, keys: tf.Tensor | Route, grads: tf.Tensor, lr: float, epsilon: float = 1e-7,
        ledger: WireLedger | None = None,
    ) -> Any:
        """Adagrad (Keras' legacy update: ``acc += g^2; row -= lr g / (sqrt(acc) + eps)``) on
        the rows of distinct ``keys`` (a :class:`Route` as for :meth:`sgd`), computed on the
        parameter servers: only the gradients travel; the accumulator is read (inserted if
        absent) and increased where it lives."""
        accumulator = self.accumulator
        if accumulator is None:
            raise ValueError(f"table {self.name} has no Adagrad accumulator")

        def apply(i: int, k: tf.Tensor, g: tf.Tensor) -> list[Any]:
            sq = tf.square(g)
            acc = self._read_shard(accumulator.tables[i], k, self._initial_accumulator) + sq
            return [
                self._add(accumulator.tables[i], k, sq),
                self._add(self.params.tables[i], k, -lr * g / (tf.sqrt(acc) + epsilon)),
            ]

        return self._per_shard(keys, grads, apply, ledger)

    def export(self) -> tuple[Any, Any]:
        """(keys, rows) of every shard, read from the parameter servers by the chief."""
        return self.params.export()

    def remove(self, keys: tf.Tensor) -> None:
        """Remove ``keys``' rows and accumulators from their parameter servers."""
        self.params.remove(keys)
        if self.accumulator is not None:
            self.accumulator.remove(keys)

    def size(self) -> int:
        return int(self.params.size())

    def shard_sizes(self) -> list[int]:
        """Rows of each shard (one round trip per parameter server)."""
        return [int(t.size()) for t in self.params.tables]
