"""Producers: kafka-python's (:func:`make_producer` with the ingest, replay and updates option
sets, keyed on :class:`KeyHashPartitioner`) and the replay's librdkafka
:class:`ReplayProducer`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stream.kafka_client.admin import UPDATES_MAX_BYTES
from stream.kafka_client.connection import KafkaUnavailable, librdkafka_logger
from streamrec.settings import KafkaSettings

#: Options of every producer of ours: all in-sync replicas acknowledge (``acks=all``).
_PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "linger_ms": 5,
    "retries": 5,
    "max_in_flight_requests_per_connection": 1,
    "request_timeout_ms": 10_000,
    "max_block_ms": 10_000,
}
#: Producers that must neither lose nor reorder nor duplicate a record on retry (ingest,
#: replay): idempotent, retried until their delivery timeout.
_IDEMPOTENT: dict[str, Any] = {
    "enable_idempotence": True,
    "retries": 2**31 - 1,  # bounded by delivery_timeout_ms
    "max_in_flight_requests_per_connection": 5,
}


class KeyHashPartitioner:
    """Kafka's default keyed partitioning (murmur2 of the key over all partitions), cached.

    Same partition as the Java client and kafka-python's ``DefaultPartitioner`` for every key
    (so all of a user's events stay in one partition); the cache saves the pure-Python murmur2
    on the hot path. Unkeyed records are delegated to the default partitioner. It is
    registered as a ``kafka.partitioner.Partitioner`` when first built (so that importing
    this module does not import kafka-python).
    """

    MAX_CACHED = 200_000

    def __init__(self) -> None:
        from kafka.partitioner.abc import Partitioner
        from kafka.partitioner.default import DefaultPartitioner, murmur2

        Partitioner.register(KeyHashPartitioner)
        self._default = DefaultPartitioner()
        self._murmur2 = murmur2
        self._cache: dict[tuple[str, bytes], int] = {}
        self._counts: dict[str, int] = {}

    def partition(
        self,
        topic: str,
        key: Any,
        serialized_key: bytes | None,
        value: Any,
        serialized_value: Any,
        cluster: Any,
    ) -> int:
        parts = cluster.partitions_for_topic(topic)
        if serialized_key is None or not parts:
            return int(
                self._default.partition(
                    topic, key, serialized_key, value, serialized_value, cluster
                )
            )
        if self._counts.get(topic) != len(parts) or len(self._cache) > self.MAX_CACHED:
            self._cache.clear()
            self._counts[topic] = len(parts)
        cached = self._cache.get((topic, serialized_key))
        if cached is None:
            ordered = sorted(parts)
            cached = ordered[(self._murmur2(serialized_key) & 0x7FFFFFFF) % len(ordered)]
            self._cache[(topic, serialized_key)] = cached
        return cached


def make_producer(kafka: KafkaSettings, **overrides: Any) -> Any:
    """A producer that waits for all in-sync replicas (``acks=all``) and retries safely;
    ``overrides`` are kafka-python options (e.g. :func:`ingest_producer_options`)."""
    from kafka import KafkaProducer

    options: dict[str, Any] = {"bootstrap_servers": kafka.bootstrap, **_PRODUCER_DEFAULTS}
    options.update(overrides)
    return KafkaProducer(**options)


def ingest_producer_options(timeout_s: float, compression: str | None = None) -> dict[str, Any]:
    """Options of the ingest API's producer (tuned with ``bench/ingest.py``): idempotent,
    every wait bounded by ``timeout_s`` (a record not acknowledged by then is given up by
    the producer, not written later), keyed records on :class:`KeyHashPartitioner`."""
    timeout_ms = int(timeout_s * 1000)
    linger_ms = 5
    request_timeout_ms = max(500, timeout_ms - linger_ms)
    return {
        **_IDEMPOTENT,
        "linger_ms": linger_ms,
        "batch_size": 256 * 1024,
        "compression_type": compression,
        # kafka-python requires delivery >= request + linger
        "delivery_timeout_ms": max(timeout_ms, request_timeout_ms + linger_ms),
        "request_timeout_ms": request_timeout_ms,
        "max_block_ms": timeout_ms,
        "reconnect_backoff_max_ms": 1000,
        "bootstrap_timeout_ms": timeout_ms,
        "partitioner": KeyHashPartitioner(),
    }


def replay_producer_options() -> dict[str, Any]:
    """Options of the replay producer: idempotent, large batches, patient timeouts."""
    return {
        **_IDEMPOTENT,
        "linger_ms": 20,
        "batch_size": 512 * 1024,
        "delivery_timeout_ms": 120_000,
        "request_timeout_ms": 30_000,
        "max_block_ms": 30_000,
    }


#: librdkafka settings of the replay producer (:class:`ReplayProducer`): the same delivery
#: contract as :func:`replay_producer_options` (idempotent, so acks=all and no reordering or
#: duplicate on retry; records given up after 120 s) and Java's keyed partitioning.
REPLAY_PRODUCER_CONFIG: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 20,
    "batch.size": 1024 * 1024,
    "delivery.timeout.ms": 120_000,
    "request.timeout.ms": 30_000,
    # murmur2 of the key over the partitions, as the Java client, kafka-python and the ingest
    # API's KeyHashPartitioner: a user's replayed and live events share a partition.
    "partitioner": "murmur2_random",
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 256 * 1024,
}


class _Delivery:
    """The "future" :meth:`ReplayProducer.send` returns: kafka-python's ``add_callback`` /
    ``add_errback``, called back with ``(partition, offset)`` metadata or the error."""

    __slots__ = ("callbacks", "errbacks")

    def __init__(self) -> None:
        self.callbacks: list[Callable[[Any], Any]] = []
        self.errbacks: list[Callable[[Any], Any]] = []

    def add_callback(self, fn: Callable[[Any], Any]) -> _Delivery:
        self.callbacks.append(fn)
        return self

    def add_errback(self, fn: Callable[[Any], Any]) -> _Delivery:
        self.errbacks.append(fn)
        return self

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            from confluent_kafka import KafkaException

            for fn in self.errbacks:
                fn(KafkaException(err))
            return
        meta = _Acked(msg.partition(), msg.offset())
        for fn in self.callbacks:
            fn(meta)


class _Acked:
    __slots__ = ("offset", "partition")

    def __init__(self, partition: int, offset: int) -> None:
        self.partition, self.offset = partition, offset


class ReplayProducer:
    """The replay's producer: kafka-python's ``send``/``flush``/``close`` over librdkafka.

    kafka-python does record batches, partitioning and futures in Python, at several times the
    CPU per replayed record (``docs/decisions.md#backfill-cpu``); librdkafka does that in C.
    Delivery callbacks run on the caller's thread, in ``send`` (served every
    :data:`POLL_EVERY` records) and in ``flush``. A full queue (Kafka down) blocks ``send`` up
    to ``max_block_s`` waiting for room.
    """

    POLL_EVERY = 256

    def __init__(self, kafka: KafkaSettings, max_block_s: float = 120.0,
                 **config: Any) -> None:
        from confluent_kafka import Producer

        self._producer = Producer({"bootstrap.servers": kafka.bootstrap,
                                   **REPLAY_PRODUCER_CONFIG, **config},
                                  logger=librdkafka_logger())
        self._max_block_s = max_block_s
        self._sent = 0

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> _Delivery:
        producer, delivery = self._producer, _Delivery()
        self._sent += 1
        if self._sent % self.POLL_EVERY == 0:
            producer.poll(0)  # serve the callbacks of what was delivered meanwhile
        try:
            producer.produce(topic, value, key, on_delivery=delivery)
        except BufferError:
            self._produce_when_room(topic, value, key, delivery)
        return delivery

    def _produce_when_room(self, topic: str, value: bytes, key: bytes | None,
                           delivery: _Delivery) -> None:
        import time

        give_up = time.monotonic() + self._max_block_s
        while True:
            self._producer.poll(0.1)
            try:
                self._producer.produce(topic, value, key, on_delivery=delivery)
                return
            except BufferError:
                if time.monotonic() > give_up:
                    raise KafkaUnavailable(
                        f"the producer queue stayed full for {self._max_block_s:.0f} s"
                    ) from None

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent is acknowledged or failed (callbacks called)."""
        left = self._producer.flush(-1 if timeout is None else timeout)
        if left:
            raise KafkaUnavailable(f"{left} record(s) not delivered within {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        self._producer.flush(-1 if timeout is None else timeout)


def updates_producer(kafka: KafkaSettings) -> Any:
    """The trainer's producer of deltas: ``acks=all``, idempotent, in order, large records."""
    return make_producer(kafka, **_IDEMPOTENT, max_request_size=UPDATES_MAX_BYTES, linger_ms=0)
