"""The TFRA two-tower network: config, dynamic-embedding tables, loss, frequency estimate.

* ``config`` — :class:`ModelConfig` (no TensorFlow).
* ``tf_env`` — the one place TensorFlow and TFRA are imported.
* ``tables`` — one TFRA table with admission/eviction stats.
* ``two_tower`` — the user and item towers.
* ``attention`` — the optional causal self-attention over the history (``user_tower``).
* ``loss`` — in-batch sampled softmax with logQ correction.
* ``frequency`` — streaming item-frequency estimate.

Importing this package loads nothing; the modules other than ``config`` load TensorFlow.
"""
