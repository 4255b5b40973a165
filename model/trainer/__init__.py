"""The trainer service: ``samples`` from Kafka -> train step -> checkpoints -> versions.

* ``options`` — :class:`TrainOptions`; ``samples`` — decoding records into batches.
* ``dedupe`` — dropping samples already trained; ``negatives`` — the negative sampler.
* ``fetch_thread`` / ``fetch_process`` — Kafka poll and decode on a thread / in a child.
* ``rolling`` — the rolling test-then-train figures; ``trainer`` — :class:`Trainer`, the step.
* ``checkpoint`` — model and consumed offsets saved together; ``export`` — versions.
* ``deltas`` — the delta stream between versions on ``model.updates``.
* ``guard_rule`` — the quality guard's decisions; ``guard_publishing`` — what the service
  does with them.
* ``service`` — the service loop (exactly once); ``metrics`` — its metrics and HTTP server.

Importing this package loads nothing; ``trainer``, ``checkpoint``, ``export``, ``deltas`` and
``service`` load TensorFlow.
"""
