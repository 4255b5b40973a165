"""The exactness probe of the cluster step: ``python -m model.cluster.probe``.

Rows start at zero, the loss is ``sum(rows)`` of each step's distinct keys and the update is
SGD with learning rate 1, so after training every key must equal minus the number of steps
that touched it: a lost update leaves it above, a doubled one below. A second table runs
the sparse Adagrad of the same steps; its accumulator must end at ``initial + steps`` (each
step adds ``g^2 = 1``). ``keys="shared"`` draws every step's keys from a small pool (the
workers update the same rows at once); ``"disjoint"`` gives each step keys of its own;
``"mixed"`` does both in one run (half of each step's keys from the pool, half its own).

The chief runs in this process (it joins the cluster for the rest of its life), so callers
that must stay out of the cluster run it as a child and read its ``--json`` output.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from model.cluster.spec import ClusterLayout

log = logging.getLogger(__name__)

ADAGRAD_INITIAL = 0.1
#: First key of the "mixed" mode's keys of their own (above every shared-pool key).
MIXED_OWN_BASE = 1_000_000


def step_keys(mode: str, steps: int, per_step: int, seed: int) -> list[np.ndarray]:
    """The distinct keys of each probe step."""
    rng = np.random.default_rng(seed)
    if mode == "shared":
        pool = max(per_step * 2, 8)
        return [np.unique(rng.integers(1, pool + 1, per_step)) for _ in range(steps)]
    if mode == "disjoint":
        return [np.arange(i * per_step + 1, (i + 1) * per_step + 1) for i in range(steps)]
    if mode == "mixed":  # half of each step from the shared pool, half keys of its own
        half = max(per_step // 2, 1)
        pool, own = max(half * 2, 8), MIXED_OWN_BASE
        return [np.concatenate([np.unique(rng.integers(1, pool + 1, half)),
                                np.arange(own + i * half, own + (i + 1) * half)])
                for i in range(steps)]
    raise ValueError(f"unknown key mode {mode!r}")


def run_probe(
    layout: ClusterLayout, mode: str, steps: int, per_step: int = 64, dim: int = 4, seed: int = 0,
    wire_dtype: str = "float32",
) -> dict[str, Any]:
    """Train the probe on a running cluster of ``layout``; returns the check's figures
    (``begun``: steps that started on a worker, counted on the PS as the cluster trainer
    counts them)."""
    from model.cluster.coordinator import connect
    from model.cluster.sparse import ShardedTable
    from model.towers.tf_env import tf

    c = connect(layout)
    with c.strategy.scope():
        begun = tf.Variable(0, dtype=tf.int64, trainable=False, name="probe_begun")
        sgd = ShardedTable("probe_sgd", dim, layout.ps_devices(), wire_dtype=wire_dtype)
        ada = ShardedTable("probe_ada", dim, layout.ps_devices(), adagrad_initial=ADAGRAD_INITIAL,
                           wire_dtype=wire_dtype)

    def replica(keys: tf.Tensor) -> tf.Tensor:
        with tf.control_dependencies([begun.assign_add(1)]), tf.GradientTape() as tape:
            route = sgd.route(keys)  # the trainer's step reads and writes on one route
            rows = sgd.read(route)
            tape.watch(rows)
            loss = tf.reduce_sum(rows)
        grads = tape.gradient(loss, rows)
        with tf.control_dependencies([sgd.sgd(route, grads, 1.0), ada.adagrad(route, grads, 0.01)]):
            return tf.identity(loss)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def step(keys: tf.Tensor) -> tf.Tensor:
        return c.strategy.run(replica, args=(keys,))

    batches = step_keys(mode, steps, per_step, seed)
    started = time.monotonic()
    for keys in batches:
        c.coordinator.schedule(step, args=(tf.constant(keys, tf.int64),))
    c.coordinator.join()
    elapsed = time.monotonic() - started
    touched: dict[int, int] = {}
    for keys in batches:
        for k in keys.tolist():
            touched[k] = touched.get(k, 0) + 1
    rows = _table(sgd)
    acc = _table(ada, accumulator=True)
    expected_acc = {}
    for k, n in touched.items():
        a = np.float32(ADAGRAD_INITIAL)
        for _ in range(n):
            a = np.float32(a + np.float32(1.0))
        expected_acc[k] = float(a)
    wrong = [k for k, n in touched.items() if k not in rows or not np.all(rows[k] == -n)]
    wrong_acc = [k for k, a in expected_acc.items() if k not in acc or not np.all(acc[k] == a)]
    shared = sum(1 for n in touched.values() if n > 1)
    return {
        "mode": mode, "steps": steps, "keys": len(touched), "keys_in_several_steps": shared,
        "keys_once": sum(1 for n in touched.values() if n == 1),
        "updates": int(sum(touched.values())), "rows": len(rows),
        "wrong_rows": len(wrong), "wrong_accumulators": len(wrong_acc),
        "examples_wrong": [(k, rows.get(k, [None])[0], -touched[k]) for k in wrong[:5]],
        "num_ps": layout.num_ps, "num_workers": layout.num_workers,
        "rows_per_shard": _per_shard(sgd),
        "steps_per_s": steps / elapsed if elapsed > 0 else float("inf"),
        "begun": int(begun.numpy()),
    }


def _table(table: Any, accumulator: bool = False) -> dict[int, np.ndarray]:
    var = table.accumulator if accumulator else table.params
    keys, vals = var.export()
    return {int(k): v for k, v in zip(keys.numpy(), vals.numpy(), strict=True)}


def _per_shard(table: Any) -> list[int]:
    return [int(t.size()) for t in table.params.tables]


def main(args: list[str] | None = None) -> int:
    from model.cluster.server import launch

    p = argparse.ArgumentParser(description="Exactness probe on a local cluster.")
    p.add_argument("--ps", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--keys", choices=["shared", "disjoint", "mixed"], default="shared")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--per-step", type=int, default=64)
    p.add_argument("--wire-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--json", type=Path, help="write the result here")
    ns = p.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    layout = ClusterLayout.local(ns.ps, ns.workers)
    cluster = launch(layout)
    try:
        result = run_probe(layout, ns.keys, ns.steps, ns.per_step, wire_dtype=ns.wire_dtype)
    finally:
        cluster.stop()
    text = json.dumps(result, sort_keys=True)
    if ns.json:
        ns.json.write_text(text)
    sys.stdout.write(text + "\n")
    return 0 if not result["wrong_rows"] and not result["wrong_accumulators"] else 1


if __name__ == "__main__":
    sys.exit(main())
