"""The one place TensorFlow and TFRA are imported.

TFRA 0.8.1 is built against TF 2.16.2 and the Keras 2 API (``tf_keras``), so
``TF_USE_LEGACY_KERAS=1`` must be set before TensorFlow is first imported. Every module of
``model`` that needs TensorFlow imports it from here::

    from model.towers.tf_env import de, tf, tf_keras
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
import tensorflow_recommenders_addons as tfra
import tf_keras
from tensorflow_recommenders_addons import dynamic_embedding as de

__all__ = ["de", "tf", "tf_keras", "tfra"]
