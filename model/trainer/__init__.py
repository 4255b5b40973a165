"""The trainer service: ``samples`` from Kafka -> train step -> checkpoints -> versions.

* ``options`` — :class:`TrainOptions`; ``samples`` — decoding records into batches.
* ``dedupe`` — dropping samples already trained; ``negatives`` — the negative sampler.
* ``fetch_thread`` / ``fetch_process`` — Kafka poll and decode on a thread / in a child.
* ``trainer`` — :class:`Trainer`, built in layers: ``tables`` (reads, eviction) <- ``step``
  (the train-step variants) <- ``scoring_head`` (the served score, live evaluation).
* ``rolling`` — the rolling test-then-train figures; ``checkpoint`` — model and consumed
  offsets saved together; ``export`` — versions; ``deltas`` — the delta stream between them.
* ``catalogue_feed`` — the ``items`` topic read for the attribute slots.
* ``guard_rule`` — the quality guard's decisions; ``guard_publishing`` — the service's use.
* ``service`` — the service loop (exactly once); ``loop_options`` — how it runs; ``build`` —
  the service built from settings; ``metrics`` — its metrics and HTTP server.

Importing this package loads nothing; ``trainer`` (and its layers), ``checkpoint``,
``export``, ``deltas``, ``service`` and ``build`` load TensorFlow.
"""
