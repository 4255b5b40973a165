"""Kafka helpers shared by ingest, replay, the trainer, serving and the stack runner.

* ``connection`` — :class:`KafkaUnavailable`, the librdkafka logger, :func:`broker_ready`.
* ``admin`` — topics created when missing (:func:`ensure_topics`, the updates topic).
* ``producers`` — :func:`make_producer` and the ingest / replay / updates option sets with
  :class:`KeyHashPartitioner`; the replay's librdkafka :class:`ReplayProducer`.
* ``consumers`` — the updates follower, the trainer's assigned consumer, end offsets.
* ``dlq`` — the ``events.dlq`` record.

kafka-python and confluent-kafka are imported inside the functions so that modules
importing this one stay light. Callers import from here.
"""

from __future__ import annotations

from stream.kafka_client.admin import UPDATES_MAX_BYTES, ensure_topics, ensure_updates_topic
from stream.kafka_client.connection import (
    LIBRDKAFKA_LOGGER,
    KafkaUnavailable,
    broker_ready,
    librdkafka_logger,
)
from stream.kafka_client.consumers import (
    CONSUMER_BACKENDS,
    UpdateRecord,
    UpdatesConsumer,
    assigned_consumer,
    consumer_backend,
    end_offsets,
    offsets_consumer,
    seek_to_time,
    topic_end_offsets,
    updates_consumer,
)
from stream.kafka_client.dlq import DLQ_RAW_LIMIT, dlq_record
from stream.kafka_client.producers import (
    REPLAY_PRODUCER_CONFIG,
    KeyHashPartitioner,
    ReplayProducer,
    ingest_producer_options,
    make_producer,
    replay_producer_options,
    updates_producer,
)

__all__ = [
    "CONSUMER_BACKENDS",
    "DLQ_RAW_LIMIT",
    "LIBRDKAFKA_LOGGER",
    "REPLAY_PRODUCER_CONFIG",
    "UPDATES_MAX_BYTES",
    "KafkaUnavailable",
    "KeyHashPartitioner",
    "ReplayProducer",
    "UpdateRecord",
    "UpdatesConsumer",
    "assigned_consumer",
    "broker_ready",
    "consumer_backend",
    "dlq_record",
    "end_offsets",
    "ensure_topics",
    "ensure_updates_topic",
    "ingest_producer_options",
    "librdkafka_logger",
    "make_producer",
    "offsets_consumer",
    "replay_producer_options",
    "seek_to_time",
    "topic_end_offsets",
    "updates_consumer",
    "updates_producer",
]
