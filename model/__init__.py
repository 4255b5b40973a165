"""The model: TFRA towers, numpy scoring terms, the artifact format, the trainer, evaluation.

Sub-packages (``import model`` loads none of them, and never TensorFlow):

* ``model.towers`` — the TFRA two-tower network (the only TensorFlow import: ``tf_env``).
* ``model.scoring`` — numpy terms of the score shared by export, evaluation and serving.
* ``model.artifact`` — the version artifact and registry (``FORMAT.md``); numpy only.
* ``model.delta`` — deltas between versions (``FORMAT.md``); numpy only, serving reads it.
* ``model.trainer`` — the trainer service; ``model.cluster`` — it on a parameter-server cluster.
* ``model.evaluation`` — test-then-train evaluation (``streamrec evaluate``) and baselines.
* ``model.cli`` — the ``train``, ``models`` and ``evaluate`` subcommands (light imports).

``model.errors`` holds the package's error root, :class:`~model.errors.ModelError`.
"""
