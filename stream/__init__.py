"""Events from the edge to Kafka and through the Flink feature job.

* ``schema`` — the event schema: the pydantic model, its fast path, JSON decoding.
* ``rules`` — the event rules and limits, defined once (ingest, replay, Flink parser).
* ``errors`` — ``StreamError``, the root of every error of this package.
* ``kafka_client`` — every Kafka client piece: producer options, partitioner, consumers,
  topic admin, end offsets, DLQ records.
* ``ingest`` — the ingest API (``POST /events``), its rate limiter and metrics.
* ``flink`` — the Flink feature job, its operator functions, parser and submission.
* ``replay`` — backfill of historical logs (readers and the replay runner).
* ``simulate`` — the click-stream simulator (it posts through ``streamrec.client``);
  ``gc_tuning`` — cheaper GC for decoders.
* ``monitor`` — the pipeline exporter for Prometheus (topic write counts, the feature job's
  lag, Kafka and Redis up, feature freshness); ``http_routes`` — the small GET server of
  ``/metrics`` and ``/health`` it and the trainer answer on.
* ``cli`` — the ``ingest-api``, ``replay``, ``features``, ``simulate``, ``exporter``
  subcommands.

May import ``feature_store`` and the client package ``streamrec`` only (the ladder in README
"Layout").
"""
