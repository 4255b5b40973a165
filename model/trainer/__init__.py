"""The trainer service: ``samples`` from Kafka -> train step -> checkpoints -> versions.

* ``options`` — :class:`TrainOptions` (no TensorFlow).
* ``samples`` — decoding ``samples`` records into batches.
* ``dedupe`` — dropping samples already trained (every id ever trained, not a window).
* ``fetch`` / ``fetch_process`` — Kafka poll and decode off the training thread / in a child.
* ``negatives`` — the uniform negative sampler.
* ``rolling`` — Recall/NDCG@K, top-k and the trainer's rolling test-then-train figures.
* ``core`` — :class:`Trainer`: the compiled train step, scoring, eviction (TensorFlow).
* ``checkpoint`` — model checkpoint and consumed offsets saved together (``LoopState``).
* ``export`` — tables -> artifact -> registry.
* ``deltas`` — the delta stream between versions: touched rows -> ``model.delta`` records on
  ``model.updates`` (TensorFlow).
* ``guard`` — the quality guard's decisions on test-then-train figures (numpy);
  ``guarding`` — what the service does with them (pin, note, metrics).
* ``loop`` — the service loop (exactly once), ``metrics`` — its metric names and HTTP server.

Importing this package loads nothing; ``core``, ``checkpoint``, ``export``, ``deltas`` and
``loop`` load TensorFlow.
"""
