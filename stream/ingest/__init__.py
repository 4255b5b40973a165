"""The ingest API: ``api`` (``POST /events`` into Kafka), ``ratelimit``, ``metrics``."""
