"""What each role of the cluster does per step, booked in TF variables on the parameter
servers (read by the chief's sampler: ``model.cluster.metrics``).

* Each parameter server has a ``[received, sent]`` int64 counter of its own. The step adds
  the payload it exchanged with that PS to it *on the PS*, from sizes of tensors the PS
  holds anyway, so the booking puts nothing on the wire.
* One ``[num_workers, fields]`` float64 table (on a PS) holds per worker: steps, their summed
  time, bytes to / from the PS, bytes from the chief, then per-bucket step counts. The worker
  adds one row at the end of each step (indexed by
  ``tf.distribute.coordinator.experimental_get_current_worker_index``): one small tensor to a
  PS per step, concurrent with the step's last writes.

A :class:`WireLedger` collects, while a step is traced, the byte counts of every exchange of
its rows, keys, gradients and dense weights, on both sides: the PS's figure from the PS's
tensors and the worker's from the worker's, so neither side's booking needs the other's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from model.cluster.metrics import STEP_BUCKETS, PsFigures, WorkerFigures
from model.towers.tf_env import tf

#: Columns of the worker table before the bucket counts.
STEPS, SECONDS, TO_PS, FROM_PS, FROM_CHIEF = range(5)
N_FIELDS = 5 + len(STEP_BUCKETS) + 1
KEY_BYTES = 8  # int64 keys


def ps_index(device: str) -> int:
    """Task index of a parameter-server device name (``/job:ps/replica:0/task:1/...`` -> 1)."""
    task = tf.DeviceSpec.from_string(device).task
    if task is None:
        raise ValueError(f"not a task device: {device!r}")
    return int(task)


def nbytes(t: tf.Tensor) -> tf.Tensor:
    """Payload bytes of ``t`` (int64 scalar), computed where ``t``'s consumer runs."""
    return tf.cast(tf.size(t), tf.int64) * t.dtype.size


class StepStats:
    """The variables; create in the strategy's scope (they are placed on the parameter
    servers round-robin, and sorted here by the PS each landed on)."""

    def __init__(self, ps_devices: Sequence[str], num_workers: int) -> None:
        self.ps_devices = list(ps_devices)
        counters = [tf.Variable(tf.zeros([2], tf.int64), trainable=False, name=f"ps_traffic{i}")
                    for i in range(len(self.ps_devices))]
        by_task = {ps_index(v.device): v for v in counters}
        if sorted(by_task) != list(range(len(self.ps_devices))):
            raise RuntimeError(f"traffic counters not one per PS: {[v.device for v in counters]}")
        self.ps_traffic = [by_task[i] for i in range(len(self.ps_devices))]
        self.workers = tf.Variable(tf.zeros([num_workers, N_FIELDS], tf.float64),
                                   trainable=False, name="worker_stats")
        self.bounds = tf.constant(STEP_BUCKETS, tf.float64)

    def read(self) -> tuple[list[tuple[int, int]], list[WorkerFigures]]:
        """(received, sent) of each PS and each worker's figures (round trips to the PS)."""
        ps = [tuple(int(x) for x in v.numpy()) for v in self.ps_traffic]
        rows = self.workers.numpy()
        workers = [
            WorkerFigures(
                steps=int(r[STEPS]), seconds=float(r[SECONDS]),
                buckets=tuple(int(c) for c in np.rint(r[5:])),
                to_ps_bytes=int(r[TO_PS]), from_ps_bytes=int(r[FROM_PS]),
                from_chief_bytes=int(r[FROM_CHIEF]),
            )
            for r in rows
        ]
        return [(a, b) for a, b in ps], workers


def ps_figures(traffic: list[tuple[int, int]], user_rows: list[int], item_rows: list[int]) -> tuple[PsFigures, ...]:
    return tuple(PsFigures(u, it, rx, tx)
                 for (rx, tx), u, it in zip(traffic, user_rows, item_rows, strict=True))


class WireLedger:
    """Byte counts of one traced step (see the module doc)."""

    def __init__(self, ps_devices: Sequence[str]) -> None:
        self.ps_devices = list(ps_devices)
        self.at_ps: list[list[tuple[Any, Any]]] = [[] for _ in self.ps_devices]
        self.to_ps: list[Any] = []
        self.from_ps: list[Any] = []

    def exchange(self, shard: int, keys: tf.Tensor, row_bytes: int, rows_to_ps: bool,
                 keys_sent: bool = True) -> None:
        """The worker sent ``keys`` to PS ``shard`` (unless ``keys_sent`` is False: the PS has
        them from this step's read), and rows of ``row_bytes`` per key went to the PS
        (gradients) or came back (reads). Call outside any device scope (the worker)."""
        zero = tf.constant(0, tf.int64)
        key_bytes = KEY_BYTES if keys_sent else 0
        with tf.device(self.ps_devices[shard]):
            n = tf.cast(tf.size(keys), tf.int64)  # the PS's copy of the keys
            rows = n * row_bytes
            self.at_ps[shard].append((n * key_bytes + (rows if rows_to_ps else zero),
                                      zero if rows_to_ps else rows))
        n = tf.cast(tf.size(keys), tf.int64)
        self.to_ps.append(n * key_bytes + (n * row_bytes if rows_to_ps else zero))
        if not rows_to_ps:
            self.from_ps.append(n * row_bytes)

    def dense(self, device: str, nbytes_each_way: int) -> None:
        """A dense variable of PS ``device`` read by the worker and its gradient sent back."""
        shard = ps_index(device)
        with tf.device(self.ps_devices[shard]):
            c = tf.constant(nbytes_each_way, tf.int64)
            self.at_ps[shard].append((c, c))
        self.to_ps.append(tf.constant(nbytes_each_way, tf.int64))
        self.from_ps.append(tf.constant(nbytes_each_way, tf.int64))

    def book(
        self, stats: StepStats, seconds: tf.Tensor, from_chief: tf.Tensor, index: Any = None
    ) -> list[Any]:
        """The ops adding this step to ``stats`` (each PS's on the PS; the worker's row at
        ``index``, by default the worker running the step)."""
        ops = []
        for shard, pairs in enumerate(self.at_ps):
            if not pairs:
                continue
            with tf.device(self.ps_devices[shard]):
                received = tf.add_n([r for r, _ in pairs])
                sent = tf.add_n([s for _, s in pairs])
                ops.append(stats.ps_traffic[shard].assign_add(tf.stack([received, sent])))
        seconds = tf.cast(seconds, tf.float64)
        bucket = tf.searchsorted(stats.bounds, tf.reshape(seconds, [1]), side="left")[0]

        def total(parts: list[Any]) -> tf.Tensor:
            return tf.cast(tf.add_n(parts) if parts else tf.constant(0, tf.int64), tf.float64)

        row = tf.concat([
            tf.stack([tf.constant(1.0, tf.float64), seconds, total(self.to_ps),
                      total(self.from_ps), tf.cast(from_chief, tf.float64)]),
            tf.one_hot(bucket, len(STEP_BUCKETS) + 1, dtype=tf.float64),
        ], 0)
        if index is None:
            index = tf.distribute.coordinator.experimental_get_current_worker_index()
        index = tf.cast(index, tf.int64)
        ops.append(stats.workers.scatter_nd_add(tf.reshape(index, [1, 1]), row[None, :]))
        return ops
