"""``model.towers.tf_env.flat_caller``: the train step's call without the signature binding."""

from __future__ import annotations

import numpy as np

from model.towers.tf_env import flat_caller, tf


def test_flat_caller_returns_what_the_concrete_function_returns_and_runs_it_once() -> None:
    counter = tf.Variable(0.0)
    weights = tf.Variable([[1.0, 2.0], [3.0, 4.0]])

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32),
                                  tf.TensorSpec([], tf.bool)])
    def step(x: tf.Tensor, flag: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        counter.assign_add(1.0)  # a captured variable, updated by every call
        y = tf.matmul(x, weights)
        return tf.reduce_sum(y) * tf.cast(flag, tf.float32), y

    concrete = step.get_concrete_function()
    call = flat_caller(concrete)
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    total, y = call(x, tf.constant(True))
    want_total, want_y = concrete(x, tf.constant(True))
    np.testing.assert_array_equal(y.numpy(), want_y.numpy())
    assert float(total) == float(want_total) == float(np.sum(want_y.numpy()))
    assert float(counter) == 2.0  # one update per call, either way
    zero, _ = call(x, tf.constant(False))
    assert float(zero) == 0.0 and float(counter) == 3.0
