"""The trainer as a parameter-server cluster (TF2 ``ParameterServerStrategy``, TFRA tables).

Route, and why it is exact (Keras + TFRA loses updates past one worker): ``docs/cluster.md``.

* ``spec`` — :class:`ClusterLayout`, every role's address (no TensorFlow).
* ``server`` — one PS or worker process and :func:`launch` of a local layout.
* ``coordinator`` — the chief's strategy; ``sparse`` — TFRA tables sharded ``key % num_ps``.
* ``probe`` — the exactness probe; ``trainer`` — :class:`ClusterTrainer`, with ``options``
  (what it accepts, no TensorFlow) and ``tables`` (its reads and eviction of the shards).
* ``service`` — where the layout comes from; ``liveness`` — the chief's watchdog.
* ``metrics`` / ``stats`` — per-role series on the chief and what the step books for them.

Importing this package loads nothing; ``coordinator``, ``sparse``, ``stats``, ``tables``,
``trainer`` and ``probe``'s run load TensorFlow (through ``model.towers.tf_env``).
"""

from model.cluster.spec import ClusterLayout
from streamrec.ports import free_ports

__all__ = ["ClusterLayout", "free_ports"]
