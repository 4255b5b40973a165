"""Consumers: the updates topic's follower (:func:`updates_consumer`), the trainer's
assigned consumer, the offsets consumer and end offsets."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from stream.kafka_client.admin import UPDATES_MAX_BYTES
from stream.kafka_client.connection import KafkaUnavailable, librdkafka_logger
from streamrec.settings import KafkaSettings

log = logging.getLogger(__name__)


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
