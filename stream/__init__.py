"""Events from the edge to Kafka and through the Flink feature job.

* ``schema`` / ``rules`` — the event schema and its rules, defined once; ``errors`` — the root.
* ``items`` — the item record (``POST /items``, the ``items`` topic) and catalogue files.
* ``kafka_client`` — every Kafka client piece (a package: connection, admin, producers,
  consumers, DLQ).
* ``ingest`` — the ingest API (``POST /events``, ``POST /items``), its rate limiter and metrics.
* ``flink`` — the Flink feature job, its operator functions, parser and submission.
* ``replay`` — backfill of historical logs and catalogue files; ``simulate`` — the click-stream simulator.
* ``monitor`` — the pipeline exporter; ``http_routes`` — its small ``/metrics`` server.
* ``gc_tuning`` — cheaper GC for decoders; ``cli`` — the ``ingest-api``, ``replay``,
  ``features``, ``simulate``, ``exporter`` subcommands.

May import ``feature_store`` and the kernel ``streamrec`` only (the ladder in README
"Layout").
"""
