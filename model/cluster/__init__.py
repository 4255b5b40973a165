"""The trainer as a parameter-server cluster (TF2 ``ParameterServerStrategy``, TFRA tables).

Route, and why it is exact (the documented Keras + TFRA route loses updates with more than
one worker): ``docs/cluster.md``.

* ``spec`` — :class:`ClusterLayout`: chief, parameter-server and worker addresses on free
  local ports, as JSON for every role (no TensorFlow).
* ``server`` — one PS or worker process (``python -m model.cluster.server``) and
  :func:`launch` of a whole local layout.
* ``coordinator`` — the chief's strategy and ``ClusterCoordinator``.
* ``sparse`` — :class:`ShardedTable`: TFRA tables sharded ``key % num_ps`` with the
  stateless step's reads (insert-if-absent) and delta writes (SGD, sparse Adagrad), rows
  optionally bfloat16 on the wire.
* ``probe`` — the exactness probe (``python -m model.cluster.probe``).
* ``trainer`` — :class:`ClusterTrainer`: the two-tower ``Trainer`` with its step on the
  workers, checkpoints as one consistent cut, and what it does not support yet.
* ``service`` — where the layout comes from (settings or free ports) and the chief's
  servers; ``liveness`` — the chief's watchdog process (a lost server: back to the last cut).
* ``metrics`` — the per-role series the chief exports for every role (no TensorFlow) and
  its sampler thread; ``stats`` — what the step books on the PS for them (bytes, step time).

Importing this package loads nothing; ``coordinator``, ``sparse``, ``stats``, ``trainer`` and
``probe``'s run load TensorFlow (through ``model.towers.tf_env``).
"""

from model.cluster.spec import ClusterLayout, free_ports

__all__ = ["ClusterLayout", "free_ports"]
