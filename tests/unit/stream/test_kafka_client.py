"""Kafka client pieces that need no broker: producer options and the key-hash partitioner."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from kafka.partitioner.abc import Partitioner
from kafka.partitioner.default import murmur2

from stream.kafka_client import (
    KeyHashPartitioner,
    consumer_backend,
    ingest_producer_options,
    replay_producer_options,
)


class Cluster:
    def __init__(self, partitions: set[int]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, _topic: str) -> set[int]:
        return self.partitions

    def available_partitions_for_topic(self, _topic: str) -> set[int]:
        return self.partitions


def test_key_hash_partitioner_is_kafkas_keyed_partitioning() -> None:
    partitioner = KeyHashPartitioner()
    assert isinstance(partitioner, Partitioner)  # no deprecation path in the producer
    cluster = Cluster({0, 1, 2, 3, 4})
    for n in range(200):
        key = f"user-{n}".encode()
        expected = (murmur2(key) & 0x7FFFFFFF) % 5
        assert partitioner.partition("t", None, key, None, None, cluster) == expected
        assert partitioner.partition("t", None, key, None, None, cluster) == expected  # cached
    # more partitions: the cache is dropped, keys move as Kafka moves them
    cluster.partitions = set(range(7))
    key = b"user-1"
    assert partitioner.partition("t", None, key, None, None, cluster) == (
        (murmur2(key) & 0x7FFFFFFF) % 7
    )


def test_producer_options_acknowledge_everything_and_bound_delivery() -> None:
    ingest = ingest_producer_options(timeout_s=5.0)
    replay = replay_producer_options()
    for options in (ingest, replay):
        assert options["enable_idempotence"] is True
        assert options["delivery_timeout_ms"] >= options["request_timeout_ms"] + options["linger_ms"]
    assert ingest["delivery_timeout_ms"] == 5000 and ingest["max_block_ms"] == 5000
    assert isinstance(ingest["partitioner"], KeyHashPartitioner)
    tiny = ingest_producer_options(timeout_s=0.2)  # request timeout floor of 500 ms
    assert tiny["delivery_timeout_ms"] == tiny["request_timeout_ms"] + tiny["linger_ms"]


def test_consumer_backend_names() -> None:
    assert consumer_backend("kafka-python") == "kafka-python"
    assert consumer_backend("auto") in ("confluent", "kafka-python")
    try:
        consumer_backend("no-such-client")
    except ValueError as exc:
        assert "no-such-client" in str(exc)
    else:
        raise AssertionError("an unknown backend was accepted")


def test_importing_the_module_does_not_import_kafka() -> None:
    """Nor does the Flink parser pull in the pydantic schema (its rules are stream.rules)."""
    code = ("import sys, stream.kafka_client, stream.flink.parse\n"
            "print([m for m in ('kafka', 'confluent_kafka', 'stream.schema') if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_replay_producer_deliveries_call_back_as_kafka_python_futures() -> None:
    """The librdkafka replay producer hands the replay (partition, offset) metadata on
    acknowledgement and an exception on failure, as kafka-python's futures do."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError, KafkaException

    from stream.kafka_client.producers import REPLAY_PRODUCER_CONFIG, _Delivery

    class Msg:
        def partition(self) -> int:
            return 3

        def offset(self) -> int:
            return 41

    acked: list[Any] = []
    failed: list[BaseException] = []
    d = _Delivery().add_callback(acked.append).add_errback(failed.append)
    d(None, Msg())
    assert [(m.partition, m.offset) for m in acked] == [(3, 41)] and failed == []
    d(KafkaError(KafkaError._MSG_TIMED_OUT), Msg())
    assert len(acked) == 1 and isinstance(failed[0], KafkaException)
    assert REPLAY_PRODUCER_CONFIG["enable.idempotence"] is True
    assert REPLAY_PRODUCER_CONFIG["acks"] == "all"
    assert REPLAY_PRODUCER_CONFIG["partitioner"] == "murmur2_random"  # Java's keyed partitions


def test_librdkafka_clients_log_through_python_logging() -> None:
    """With no broker at the address, the replay producer's and the trainer's consumer's
    librdkafka log reaches the ``stream.kafka_client.librdkafka`` logger, and nothing is
    printed to the process's stderr (a child process: librdkafka writes to fd 2)."""
    pytest.importorskip("confluent_kafka")
    code = """
import logging, time
from streamrec.settings import KafkaSettings
from confluent_kafka import KafkaException
from stream.kafka_client import (LIBRDKAFKA_LOGGER, KafkaUnavailable, ReplayProducer,
                                 assigned_consumer)
got = []
class Keep(logging.Handler):
    def emit(self, record):
        got.append(record.getMessage())
logging.getLogger(LIBRDKAFKA_LOGGER).addHandler(Keep())
kafka = KafkaSettings(host="127.0.0.1", port=1)  # nothing listens there
producer = ReplayProducer(kafka, max_block_s=1.0)
producer.send("t", b"v")
deadline = time.monotonic() + 20
while not got and time.monotonic() < deadline:
    producer._producer.poll(0.1)
from_producer = len(got)
try:
    assigned_consumer(kafka, "t", {}, backend="confluent", group_id="g", client_id="c",
                      max_records=10, monotonic=time.monotonic, wait=time.sleep,
                      timeout_s=1.0)
except (KafkaUnavailable, KafkaException):  # no broker: no partitions
    pass  # its log was served while it waited
print(from_producer, len(got) - from_producer)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    from_producer, from_consumer = map(int, out.stdout.split())
    assert from_producer > 0 and from_consumer > 0, out.stdout
    assert "rdkafka" not in out.stderr, out.stderr
