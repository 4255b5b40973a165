"""The one place TensorFlow and TFRA are imported.

TFRA 0.8.1 is built against TF 2.16.2 and the Keras 2 API (``tf_keras``), so
``TF_USE_LEGACY_KERAS=1`` must be set before TensorFlow is first imported. Every module of
``model`` that needs TensorFlow imports it from here::

    from model.towers.tf_env import de, tf, tf_keras

It also sets TensorFlow's process defaults, each overridable by its environment variable:
one intra-op thread (``TF_NUM_INTRAOP_THREADS``), errors-only C++ logging.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One intra-op thread per process unless TF_NUM_INTRAOP_THREADS says otherwise (TF reads it
# when its runtime starts, so it is set before the import). A training process already keeps
# the cores busy with other threads and processes (the fetch process, the evaluation thread,
# the cluster's other roles), and TF's intra-op pool spin-waits between ops, taking their
# CPU; independent ops still run in parallel on the inter-op pool
# (docs/decisions.md#tensorflow-threads).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import tensorflow as tf
import tensorflow_recommenders_addons as tfra
import tf_keras
from tensorflow_recommenders_addons import dynamic_embedding as de

__all__ = ["de", "flat_caller", "tf", "tf_keras", "tfra"]


def flat_caller(concrete: Any) -> Callable[..., list[Any]]:
    """A caller of the traced ``concrete`` function with its flat tensor arguments, in
    order, that returns its flat outputs (a tuple ``(a, b)`` comes back as ``[a, b]``).

    ``concrete(*args)`` binds the arguments to the function's structured signature on every
    call: for the train step's eight tensors about 0.3 ms of interpreter time per call
    (0.82 against 0.53 ms of the calling thread's CPU, measured side by side), held under
    the GIL that the trainer's evaluation and preparation threads want. This calls TF 2.16's
    flat entry point below ``__call__`` (the function's ``AtomicFunction.call_flat`` with the
    captured inputs appended, read anew each call), which also skips the gradient-tape
    bookkeeping: no tape may be recording around the call.
    """
    atomic = concrete._inference_function  # noqa: SLF001 - the flat entry point (doc above)

    def call(*args: Any) -> list[Any]:
        return atomic.call_flat(*args, *concrete.captured_inputs)

    return call
