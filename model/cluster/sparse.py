"""Sharded dynamic-embedding tables and the stateless sparse optimizers of the cluster step.

A :class:`ShardedTable` is a TFRA ``de.Variable`` whose shards live on the parameter servers
(``key % num_ps``), plus, for Adagrad, a second ``de.Variable`` holding the accumulator.
The step never goes through TFRA's shadow variables or ``DynamicEmbeddingOptimizer`` (one
coordinator-side buffer shared by every worker loses updates: docs/cluster.md); it is
"stateless" instead:

1. :meth:`ShardedTable.read` reads the rows of a step's distinct keys. A key without a row
   gets its initial row by an *insert-if-absent* (``accum`` with ``exists=False`` is a no-op
   for a key present by then), and is read again: two workers that first see a key at once
   both start from the one row that won.
2. The worker computes the gradient with respect to those rows.
3. :meth:`ShardedTable.sgd` / :meth:`ShardedTable.adagrad` write ``new - old`` back with
   ``accum(exists=True)``: a delta-add on the parameter server, so concurrent steps of other
   workers on the same key are added, never overwritten.

Optionally rows travel as bfloat16 (``wire_dtype``): cast on the parameter server before
sending, deltas cast on the worker, accumulated in float32 on the parameter server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from model.towers.tf_env import de, tf


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

    # -- reads -----------------------------------------------------------------------------
    def _lookup(self, var: Any, keys: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Rows (float32) and exists flags of ``keys``; each shard's rows leave their
        parameter server in the wire dtype. Missing keys read zeros."""
        n = tf.size(keys)
        shard = tf.cast(keys % len(self.devices), tf.int32)
        parts = tf.dynamic_partition(keys, shard, len(self.devices))
        pos = tf.dynamic_partition(tf.range(n), shard, len(self.devices))
        rows, flags = [], []
        for i, device in enumerate(self.devices):
            with tf.device(device):
                zeros = tf.zeros([tf.size(parts[i]), self.dim], tf.float32)
                r, e = var.tables[i].lookup(parts[i], dynamic_default_values=zeros, return_exists=True)
                r = tf.cast(r, self.wire_dtype)
            rows.append(tf.cast(r, tf.float32))
            flags.append(e)
        vals = tf.reshape(tf.dynamic_stitch(pos, rows), [n, self.dim])
        return vals, tf.reshape(tf.dynamic_stitch(pos, flags), [n])

    def _read_var(self, var: Any, keys: tf.Tensor, init: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor:
        rows, exists = self._lookup(var, keys)
        missing = tf.logical_not(exists)
        new_keys = tf.boolean_mask(keys, missing)
        first = init(new_keys)
        # insert-if-absent: a key another worker inserted meanwhile keeps that row
        insert = var.accum(new_keys, first, first, tf.zeros_like(new_keys, tf.bool))
        with tf.control_dependencies([insert]):
            won, _ = self._lookup(var, new_keys)
        where = tf.cast(tf.where(missing), tf.int32)
        return tf.tensor_scatter_nd_update(rows, where, won)

    def read(self, keys: tf.Tensor) -> tf.Tensor:
        """``[len(keys), dim]`` rows of distinct ``keys`` (each key gets a row)."""
        return self._read_var(self.params, keys, self.initial_rows)

    # -- writes ----------------------------------------------------------------------------
    def _add(self, var: Any, keys: tf.Tensor, delta: tf.Tensor) -> Any:
        """Add ``delta`` to the rows of existing ``keys`` on their parameter servers: each
        shard's deltas leave the worker in the wire dtype and become float32 on the PS."""
        if self.wire_dtype == tf.float32:
            return var.accum(keys, tf.zeros_like(delta), delta, tf.ones_like(keys, tf.bool))
        n = len(self.devices)
        shard = tf.cast(keys % n, tf.int32)  # TFRA's default partition: key % shards
        parts_k = tf.dynamic_partition(keys, shard, n)
        parts_d = tf.dynamic_partition(tf.cast(delta, self.wire_dtype), shard, n)
        ops = []
        for i, device in enumerate(self.devices):
            with tf.device(device):
                exists = tf.ones([tf.size(parts_k[i]), 1], tf.bool)
                ops.append(var.tables[i].accum(parts_k[i], tf.cast(parts_d[i], tf.float32), exists))
        return tf.group(ops)

    def sgd(self, keys: tf.Tensor, grads: tf.Tensor, lr: float) -> Any:
        """Plain SGD on the rows of distinct ``keys`` (read by :meth:`read` this step)."""
        return self._add(self.params, keys, -lr * grads)

    def adagrad(self, keys: tf.Tensor, grads: tf.Tensor, lr: float, epsilon: float = 1e-7) -> Any:
        """Adagrad (Keras' legacy update: ``acc += g^2; row -= lr g / (sqrt(acc) + eps)``) on
        the rows of distinct ``keys``; the accumulator's increment is added on the PS too."""
        if self.accumulator is None:
            raise ValueError(f"table {self.name} has no Adagrad accumulator")
        acc = self._read_var(self.accumulator, keys, self._initial_accumulator) + tf.square(grads)
        add_acc = self._add(self.accumulator, keys, tf.square(grads))
        add_row = self._add(self.params, keys, -lr * grads / (tf.sqrt(acc) + epsilon))
        return tf.group(add_acc, add_row)

    def export(self) -> tuple[Any, Any]:
        """(keys, rows) of every shard, read from the parameter servers by the chief."""
        return self.params.export()

    def size(self) -> int:
        return int(self.params.size())
