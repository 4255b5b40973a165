"""The trainer service: ``samples`` from Kafka -> train step -> checkpoints -> versions.

* ``options`` — :class:`TrainOptions`; ``samples`` — decoding records into batches.
* ``dedupe`` — dropping samples already trained; ``negatives`` — the negative sampler.
* ``fetch`` / ``fetch_process`` — Kafka poll and decode off the training thread / in a child.
* ``rolling`` — the rolling test-then-train figures; ``core`` — :class:`Trainer`, the step.
* ``checkpoint`` — model and consumed offsets saved together; ``export`` — versions.
* ``deltas`` — the delta stream between versions on ``model.updates``.
* ``guard`` — the quality guard's decisions; ``guarding`` — what the service does with them.
* ``loop`` — the service loop (exactly once); ``metrics`` — its metrics and HTTP server.

Importing this package loads nothing; ``core``, ``checkpoint``, ``export``, ``deltas`` and
``loop`` load TensorFlow.
"""
