"""``model.cluster``: the layout and the stateless sparse step's math, in one process
(the tables on the local CPU; the multi-process exactness: tests/integration/test_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model.cluster.spec import ClusterLayout, free_ports


def test_layout_round_trips_through_json_with_distinct_free_ports() -> None:
    layout = ClusterLayout.local(2, 3)
    assert ClusterLayout.from_json(layout.to_json()) == layout
    addrs = [layout.chief, *layout.ps, *layout.workers]
    assert len(set(addrs)) == 6
    assert layout.roles() == [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("worker", 2)]
    assert layout.ps_devices()[1] == "/job:ps/replica:0/task:1/device:CPU:0"
    assert len(set(free_ports(4))) == 4
    with pytest.raises(ValueError, match="at least one"):
        ClusterLayout("h:1", (), ("h:2",))


def test_adagrad_matches_keras_legacy_adagrad_and_first_rows_are_fixed_per_key() -> None:
    from model.cluster.sparse import ShardedTable
    from model.towers.tf_env import tf, tf_keras

    table = ShardedTable("unit_ada", 3, ["/CPU:0"], init_stddev=0.1, seed=5, adagrad_initial=0.1)
    keys = tf.constant([7, -3, 11], tf.int64)
    first = table.read(keys).numpy()
    again = ShardedTable("unit_ada2", 3, ["/CPU:0"], init_stddev=0.1, seed=5).read(keys).numpy()
    np.testing.assert_array_equal(first, again)  # a function of (key, seed), not of the draw
    assert np.all(np.abs(first) <= 0.1 * 3**0.5) and len(np.unique(first)) == first.size

    dense = tf.Variable(first)
    opt = tf_keras.optimizers.legacy.Adagrad(learning_rate=0.05)
    rng = np.random.default_rng(0)
    for _ in range(3):
        g = rng.normal(size=(3, 3)).astype(np.float32)
        rows = table.read(keys)
        np.testing.assert_allclose(rows.numpy(), dense.numpy(), rtol=1e-6, atol=1e-7)
        table.adagrad(keys, tf.constant(g), 0.05)
        opt.apply_gradients([(tf.constant(g), dense)])
    np.testing.assert_allclose(table.read(keys).numpy(), dense.numpy(), rtol=1e-5, atol=1e-6)


def test_bfloat16_wire_keeps_float32_rows_on_the_table() -> None:
    from model.cluster.sparse import ShardedTable
    from model.towers.tf_env import tf

    # two shards (key % 2) on the local CPU
    table = ShardedTable("unit_wire", 2, ["/CPU:0", "/CPU:0"], wire_dtype="bfloat16")
    keys = tf.constant([1, 2, 3, -6, 10], tf.int64)
    table.read(keys)
    assert [int(t.size()) for t in table.params.tables] == [3, 2]
    for _ in range(4):  # deltas of 1/3 are rounded to bfloat16 on the way, summed in float32
        table.sgd(keys, tf.fill([5, 2], 1.0 / 3.0), 1.0)
    _, stored = table.params.export()
    step = float(tf.cast(tf.cast(1.0 / 3.0, tf.bfloat16), tf.float32))
    np.testing.assert_allclose(stored.numpy(), -4 * step, rtol=1e-6)
    assert stored.dtype == np.float32 and stored.shape == (5, 2)


def test_up_runs_each_server_of_a_fixed_layout_as_a_component_before_the_chief() -> None:
    from deploy.components import service_components
    from streamrec.settings import load_settings

    s = load_settings()
    single = [c.name for c in service_components(s, {"train"})]
    assert single == ["trainer"]
    s = s.model_copy(update={"trainer": s.trainer.model_copy(
        update={"ps": 2, "workers": 1, "cluster_port": 9500})})
    comps = service_components(s, {"train"})
    assert [c.name for c in comps] == ["trainer-ps-0", "trainer-ps-1", "trainer-worker-0", "trainer"]
    assert [c.port for c in comps[:3]] == [9501, 9502, 9503]  # the chief has 9500
    assert comps[1].argv()[-4:] == ["--role", "ps", "--index", "1"]
    # without a fixed layout the chief starts its servers itself: one component
    s = s.model_copy(update={"trainer": s.trainer.model_copy(update={"cluster_port": 0})})
    assert [c.name for c in service_components(s, {"train"})] == ["trainer"]


def test_configs_the_cluster_step_does_not_support_are_refused_by_name() -> None:
    from model.cluster.options import ClusterError, check_supported
    from model.towers.config import ModelConfig
    from model.trainer.options import TrainOptions

    check_supported(ModelConfig(), TrainOptions())
    check_supported(ModelConfig(), TrainOptions(evict_every_steps=10))  # eviction runs on shards
    with pytest.raises(ClusterError, match="attention.*gradient accumulation"):
        check_supported(ModelConfig(user_tower="attention"), TrainOptions(grad_accum_steps=2))


def test_the_watchdog_names_the_server_that_stopped_listening_and_ends_with_the_chief() -> None:
    import os
    import socket
    import subprocess
    import sys

    from model.cluster.liveness import watch

    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.listen()
        addrs = [f"127.0.0.1:{s.getsockname()[1]}" for s in (a, b)]
        b.close()  # b is lost; a keeps listening
        assert watch(os.getpid(), addrs, grace_s=0.3, every_s=0.05) == addrs[1]
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        assert watch(gone.pid, addrs[:1], grace_s=0.3, every_s=0.05) == ""


def test_a_checkpoint_with_one_variable_per_dense_layer_restores_into_the_flat_pair(
    tmp_path: Path,
) -> None:
    """The cluster's dense layers are one flat variable (and its accumulator); a checkpoint
    written with a variable per layer gives the same values, in layer order."""
    from model.cluster.trainer import layers_from_checkpoint
    from model.towers.tf_env import tf

    rng = np.random.default_rng(0)
    shapes = [(3, 4), (4,), (4, 2), (2,)]
    weights = [rng.normal(size=s).astype(np.float32) for s in shapes]
    accs = [rng.uniform(0.1, 1, size=s).astype(np.float32) for s in shapes]
    old = {f"dense_ps_{i}": tf.Variable(w) for i, w in enumerate(weights)}
    old.update({f"dense_acc_{i}": tf.Variable(a) for i, a in enumerate(accs)})
    old["step"] = tf.Variable(7, dtype=tf.int64)
    prefix = tf.train.Checkpoint(**old).write(str(tmp_path / "old" / "tf"))
    flat = layers_from_checkpoint(prefix, len(shapes))
    assert flat is not None
    np.testing.assert_array_equal(flat[0], np.concatenate([w.ravel() for w in weights]))
    np.testing.assert_array_equal(flat[1], np.concatenate([a.ravel() for a in accs]))
    new = tf.train.Checkpoint(dense_ps=tf.Variable(flat[0]), dense_acc=tf.Variable(flat[1]))
    assert layers_from_checkpoint(new.write(str(tmp_path / "new" / "tf")), len(shapes)) is None
