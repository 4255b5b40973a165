"""Reaching the broker: the error when it cannot be reached, where librdkafka's own log goes,
and a readiness probe."""

from __future__ import annotations

import logging

from stream.errors import StreamError
from streamrec.settings import KafkaSettings


class KafkaUnavailable(StreamError):
    """The broker could not be reached (or did not answer) within the deadline."""


#: Where every librdkafka client of ours sends its own log (``confluent_kafka``'s ``logger``
#: option): Python logging, leveled and formatted like the rest, not raw stderr.
LIBRDKAFKA_LOGGER = "stream.kafka_client.librdkafka"


def librdkafka_logger() -> logging.Logger:
    """The logger given to each ``confluent_kafka`` client (:data:`LIBRDKAFKA_LOGGER`)."""
    return logging.getLogger(LIBRDKAFKA_LOGGER)


def broker_ready(kafka: KafkaSettings, timeout_s: float = 3.0) -> bool:
    """True if the broker answers a metadata request within ``timeout_s``.

    A probe: "connection refused" is an expected answer here, so kafka-python's own error
    logging is silenced while it runs (``streamrec status`` with Kafka down prints a table,
    not a page of connection errors)."""
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    kafka_log = logging.getLogger("kafka")
    level = kafka_log.level
    kafka_log.setLevel(logging.CRITICAL)
    try:
        try:
            consumer = KafkaConsumer(
                bootstrap_servers=kafka.bootstrap,
                request_timeout_ms=int(timeout_s * 1000) + 1000,
                connections_max_idle_ms=int(timeout_s * 1000) + 5000,
                enable_auto_commit=False,
            )
        except KafkaError:
            return False
        try:
            return consumer.topics() is not None
        except KafkaError:
            return False
        finally:
            consumer.close()
    finally:
        kafka_log.setLevel(level)
