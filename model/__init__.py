"""The model: TFRA towers, numpy scoring terms, the artifact format, the trainer, evaluation.

Sub-packages (``import model`` loads none of them, and never TensorFlow):

* ``model.towers`` — the TFRA two-tower network, its tables, loss and frequency estimate
  (the only sub-package that imports TensorFlow, through ``model.towers.tf_env``).
* ``model.scoring`` — the numpy terms of the retrieval score shared by export, evaluation and
  serving: history pooling, the popularity prior, item co-visitation.
* ``model.artifact`` — the version artifact (spec: ``model/artifact/FORMAT.md``) and the
  registry of versions; numpy only, the one part of ``model`` that serving imports.
* ``model.delta`` — deltas between versions (spec ``model/delta/FORMAT.md``): the record,
  its row codecs, the state they build and ``apply``; numpy only, serving reads it.
* ``model.trainer`` — the trainer service: samples decoding, the fetch process, the train
  step, checkpoints with Kafka offsets, export, metrics.
* ``model.evaluation`` — test-then-train evaluation (``streamrec evaluate``) and baselines.
* ``model.cli`` — the ``train``, ``models`` and ``evaluate`` subcommands (light imports).

``model.errors`` holds the package's error root, :class:`~model.errors.ModelError`
(``ArtifactError``, ``RegistryError``, ``SampleError`` derive from it).
"""
