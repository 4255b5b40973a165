"""Kafka helpers shared by ingest, replay, the trainer, serving and the stack runner.

Producers (:func:`make_producer` and the ingest / replay option sets, with
:class:`KeyHashPartitioner`), consumers (the trainer's assigned consumer, the offsets
consumer), topic admin, end offsets and ``events.dlq`` records: one home for Kafka code.

kafka-python and confluent-kafka are imported inside the functions so that modules
importing this one stay light.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from stream.errors import StreamError
from streamrec.settings import KafkaSettings

log = logging.getLogger(__name__)

DLQ_RAW_LIMIT = 64 * 1024

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


class KafkaUnavailable(StreamError):
    """The broker could not be reached (or did not answer) within the deadline."""


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


#: Where every librdkafka client of ours sends its own log (``confluent_kafka``'s ``logger``
#: option): Python logging, leveled and formatted like the rest, not raw stderr.
LIBRDKAFKA_LOGGER = f"{__name__}.librdkafka"


def librdkafka_logger() -> logging.Logger:
    """The logger given to each ``confluent_kafka`` client (:data:`LIBRDKAFKA_LOGGER`)."""
    return logging.getLogger(LIBRDKAFKA_LOGGER)


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


def ensure_topics(
    kafka: KafkaSettings,
    names: Iterable[str],
    partitions: int | None = None,
    timeout_s: float = 30.0,
    configs: Mapping[str, str] | None = None,
) -> list[str]:
    """Create the topics that do not exist yet; returns the names it created. ``configs``:
    more topic configs of the created ones (beside ``min.insync.replicas``)."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    wanted = list(dict.fromkeys(names))
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=kafka.bootstrap, request_timeout_ms=int(timeout_s * 1000)
        )
    except KafkaError as exc:
        raise KafkaUnavailable(f"cannot reach Kafka at {kafka.bootstrap}: {exc}") from exc
    try:
        existing = set(admin.list_topics())
        missing = [n for n in wanted if n not in existing]
        if missing:
            new = [
                NewTopic(
                    n,
                    num_partitions=partitions or kafka.partitions,
                    replication_factor=kafka.replication_factor,
                    topic_configs={
                        "min.insync.replicas": str(kafka.min_insync_replicas), **(configs or {}),
                    },
                )
                for n in missing
            ]
            try:
                admin.create_topics(new, timeout_ms=int(timeout_s * 1000))
            except TopicAlreadyExistsError:
                log.debug("topics created concurrently: %s", missing)
            log.info("created topics %s", ", ".join(missing))
        return missing
    finally:
        admin.close()


#: Largest record of the model updates topic (a delta after a burst, a snapshot is never
#: sent there: it lives beside its full version).
UPDATES_MAX_BYTES = 32 << 20


def ensure_updates_topic(kafka: KafkaSettings, timeout_s: float = 30.0) -> list[str]:
    """Create ``kafka.updates_topic`` if needed: one partition (the deltas are one ordered
    sequence), records up to :data:`UPDATES_MAX_BYTES`."""
    return ensure_topics(kafka, [kafka.updates_topic], 1, timeout_s,
                         {"max.message.bytes": str(UPDATES_MAX_BYTES)})


def updates_producer(kafka: KafkaSettings) -> Any:
    """The trainer's producer of deltas: ``acks=all``, idempotent, in order, large records."""
    return make_producer(kafka, **_IDEMPOTENT, max_request_size=UPDATES_MAX_BYTES, linger_ms=0)


def updates_consumer(kafka: KafkaSettings, backend: str = "auto") -> Any:
    """A consumer of the updates topic's one partition (assigned: no group, no commits),
    able to fetch its largest records, with kafka-python's calls (``poll``,
    ``offsets_for_times``, ``seek``, ``seek_to_end``, ``close``; :func:`seek_to_time`).

    ``backend`` (:func:`consumer_backend`): "confluent" is librdkafka behind
    :class:`UpdatesConsumer` — it fetches and checks records in C threads, a fraction of a
    serving worker's CPU per delta that kafka-python's Python client takes
    (``docs/decisions.md#delta-stream``). Either way the broker answers a fetch as soon as
    a record arrives, so the longest wait (500 ms) only sets how often an idle consumer asks
    again, and a long wait keeps an idle consumer's CPU low."""
    if consumer_backend(backend) == "confluent":
        return UpdatesConsumer(kafka)
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=kafka.bootstrap, group_id=None, enable_auto_commit=False,
        max_partition_fetch_bytes=UPDATES_MAX_BYTES, fetch_max_bytes=2 * UPDATES_MAX_BYTES,
        fetch_max_wait_ms=500,
    )
    consumer.assign([TopicPartition(kafka.updates_topic, 0)])
    return consumer


class UpdateRecord(NamedTuple):
    """A record of the updates topic as :class:`UpdatesConsumer` returns it."""

    offset: int
    value: bytes


class UpdatesConsumer:
    """The updates topic's partition 0 through ``confluent_kafka.Consumer``, with the calls
    of kafka-python's consumer that serving's follower makes (:func:`updates_consumer`).
    Positions are set by assigning the partition at an absolute offset (librdkafka's
    ``seek`` needs a partition already being fetched). A fatal client error raises
    ``KafkaException``; a transient one (the broker restarting, say) is logged and the
    client retries, fetching on from its position once the broker is back. librdkafka's
    own log goes to the ``stream.kafka_client.librdkafka`` logger."""

    def __init__(self, kafka: KafkaSettings, timeout_s: float = 10.0) -> None:
        from confluent_kafka import Consumer

        self.topic, self.timeout_s = kafka.updates_topic, timeout_s
        self._consumer = Consumer({
            "bootstrap.servers": kafka.bootstrap,
            # required by the client; never used: assigned, nothing committed
            "group.id": "streamrec-updates-follower",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.wait.max.ms": 500,
            "fetch.max.bytes": 2 * UPDATES_MAX_BYTES,
            "max.partition.fetch.bytes": UPDATES_MAX_BYTES,
            "receive.message.max.bytes": 2 * UPDATES_MAX_BYTES + 1024 * 1024,
            # a broker that is gone: retried from 1 s on, doubling up to 10 s (the default
            # 100 ms logged ~20 failed connects a second, for every worker)
            "reconnect.backoff.ms": 1000,
        }, logger=librdkafka_logger())
        try:
            self.seek_to_end(None)
        except BaseException:
            self._consumer.close()
            raise

    def _tp(self, offset: int) -> Any:
        from confluent_kafka import TopicPartition

        return TopicPartition(self.topic, 0, offset)

    def poll(self, timeout_ms: int = 0) -> dict[int, list[UpdateRecord]]:
        """The records fetched within ``timeout_ms``, by partition (kafka-python's shape):
        back as soon as one is there (``consume`` would wait out its timeout for a full
        batch), with those queued behind it."""
        first = self._consumer.poll(timeout_ms / 1000.0)
        if first is None:
            return {}
        out: list[UpdateRecord] = []
        for message in [first, *self._consumer.consume(num_messages=63, timeout=0)]:
            err = message.error()
            if err is None:
                offset, value = message.offset(), message.value()
                if offset is not None and value is not None:
                    out.append(UpdateRecord(offset, value))
            elif err.fatal():
                from confluent_kafka import KafkaException

                raise KafkaException(err)
            else:
                log.warning("updates consumer: %s", err)
        return {0: out} if out else {}

    def offsets_for_times(self, query: Mapping[Any, int]) -> dict[Any, Any]:
        """For each partition of ``query`` (its ``.partition``) at time ``ms``: an object
        with the ``.offset`` of its first record at or after it, or None (kafka-python's)."""
        found = self._consumer.offsets_for_times(
            [self._tp(int(ms)) for ms in query.values()], timeout=self.timeout_s)
        return {tp: (UpdateRecord(f.offset, b"") if f.offset >= 0 else None)
                for tp, f in zip(query, found, strict=True)}

    def seek(self, tp: Any, offset: int) -> None:
        self._consumer.assign([self._tp(int(offset))])

    def seek_to_end(self, tp: Any) -> None:
        """To the partition's end offset as the broker has it now (an absolute offset:
        librdkafka leaves a partition re-assigned at its logical end unresolved)."""
        _, high = self._consumer.get_watermark_offsets(self._tp(0), timeout=self.timeout_s)
        self._consumer.assign([self._tp(int(high))])

    def close(self) -> None:
        self._consumer.close()


def seek_to_time(consumer: Any, topic: str, at_ms: int, partition: int = 0) -> None:
    """Seek an assigned ``consumer`` to the first record of ``topic``/``partition`` written
    at or after ``at_ms`` (epoch ms), or to the end when there is none."""
    from kafka import TopicPartition

    tp = TopicPartition(topic, partition)
    found = consumer.offsets_for_times({tp: max(int(at_ms), 0)}).get(tp)
    if found is None:
        consumer.seek_to_end(tp)
    else:
        consumer.seek(tp, found.offset)


def dlq_record(
    reason: str, stage: str, topic: str, partition: int, offset: int, raw: bytes | str | None
) -> bytes:
    """The JSON value of an ``events.dlq`` record (format in docs/design.md, "Wire formats")."""
    if isinstance(raw, bytes):
        raw_text = raw[:DLQ_RAW_LIMIT].decode("utf-8", errors="replace")
    else:
        raw_text = (raw or "")[:DLQ_RAW_LIMIT]
    return json.dumps(
        {
            "reason": reason,
            "stage": stage,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "raw": raw_text,
        }
    ).encode()


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


def offsets_consumer(bootstrap: str, timeout_s: float | None = None) -> Any:
    """A kafka-python consumer for metadata and offset look-ups: no group, no commits.

    ``timeout_s`` bounds its requests and its first connection (None: the client's defaults).
    """
    from kafka import KafkaConsumer

    options: dict[str, Any] = {}
    if timeout_s is not None:
        timeout_ms = int(timeout_s * 1000)
        options = {
            "request_timeout_ms": timeout_ms + 1000,
            "connections_max_idle_ms": timeout_ms + 600_000,
            "bootstrap_timeout_ms": timeout_ms,
        }
    return KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **options
    )


def end_offsets(consumer: Any, topic: str, timeout_s: float | None = None) -> dict[int, int]:
    """The end offset (the next offset to be written) of every partition of ``topic``, read
    with the kafka-python ``consumer``; ``{}`` when the topic does not exist."""
    from kafka import TopicPartition

    parts = consumer.partitions_for_topic(topic)
    if not parts:
        return {}
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    if timeout_s is None:
        ends = consumer.end_offsets(tps)
    else:
        ends = consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
    return {tp.partition: int(offset) for tp, offset in ends.items()}


def topic_end_offsets(
    kafka: KafkaSettings, topic: str, timeout_s: float | None = None
) -> dict[int, int]:
    """:func:`end_offsets` of ``topic`` with a consumer of its own (opened and closed here)."""
    consumer = offsets_consumer(kafka.bootstrap, timeout_s)
    try:
        return end_offsets(consumer, topic, timeout_s)
    finally:
        consumer.close()


CONSUMER_BACKENDS = ("confluent", "kafka-python")


def consumer_backend(name: str) -> str:
    """``name`` of a consumer client, with "auto" resolved (confluent-kafka if installed)."""
    if name == "auto":
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            return "kafka-python"
        return "confluent"
    if name not in CONSUMER_BACKENDS:
        raise ValueError(f"unknown consumer {name!r}; expected auto or one of {CONSUMER_BACKENDS}")
    return name


def assigned_consumer(
    kafka: KafkaSettings,
    topic: str,
    starts: Mapping[int, int],
    *,
    backend: str,
    group_id: str,
    client_id: str,
    max_records: int,
    monotonic: Callable[[], float],
    wait: Callable[[float], Any],
    timeout_s: float = 30.0,
) -> tuple[Any, dict[int, int | None]]:
    """A consumer assigned every partition of ``topic``, each at its offset in ``starts``
    (partition -> next offset) or at the beginning, never committing; and the offset each
    partition starts at (None: the beginning).

    ``backend`` is "confluent" (a ``confluent_kafka.Consumer``) or "kafka-python" (a
    ``kafka.KafkaConsumer`` returning up to ``max_records`` per poll). Waits up to
    ``timeout_s`` (with ``wait``) for the topic's partitions, else :class:`KafkaUnavailable`.
    """
    if backend == "confluent":
        from confluent_kafka import Consumer

        consumer: Any = Consumer({
            "bootstrap.servers": kafka.bootstrap,
            # required by the client; never used: partitions are assigned, not subscribed,
            # and nothing is committed (the caller keeps the offsets)
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "client.id": client_id,
        }, logger=librdkafka_logger())

        def lookup() -> list[int]:
            meta = consumer.list_topics(topic, timeout=5.0).topics.get(topic)
            return [] if meta is None or meta.error is not None else list(meta.partitions)
    elif backend == "kafka-python":
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            bootstrap_servers=kafka.bootstrap, group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", max_poll_records=max_records,
            fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=16 * 1024 * 1024,
            client_id=client_id,
        )

        def lookup() -> list[int]:
            return list(consumer.partitions_for_topic(topic) or ())
    else:
        raise ValueError(f"unknown consumer {backend!r}")
    try:
        partitions: list[int] = []
        deadline = monotonic() + timeout_s
        while not partitions and monotonic() < deadline:
            partitions = sorted(lookup())
            if not partitions:
                wait(0.2)
        if not partitions:
            raise KafkaUnavailable(f"topic {topic} has no partitions")
        at = {p: starts.get(p) for p in partitions}
        _assign(consumer, backend, topic, at)
        return consumer, at
    except BaseException:
        consumer.close()
        raise


def _assign(consumer: Any, backend: str, topic: str, at: dict[int, int | None]) -> None:
    if backend == "confluent":
        from confluent_kafka import OFFSET_BEGINNING
        from confluent_kafka import TopicPartition as ConfluentTP

        consumer.assign([ConfluentTP(topic, p, OFFSET_BEGINNING if o is None else o)
                         for p, o in at.items()])
        return
    from kafka import TopicPartition

    tps = [TopicPartition(topic, p) for p in at]
    consumer.assign(tps)
    for tp in tps:
        offset = at[tp.partition]
        if offset is None:
            consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, offset)
