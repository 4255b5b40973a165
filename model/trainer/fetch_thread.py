"""Background fetching: Kafka poll + decode + batch assembly off the training thread.

The TF step releases the GIL while it runs, so polling and decoding here overlap with training
on the other core; everything per sample that needs no training state (keys, id hashes, event
times) is done here too. The fetcher only reads: it owns its consumer and hands over
:class:`Chunk` objects in order; the training thread records offsets after a chunk is
trained, so a chunk fetched but not trained is read again after a restart. Two record
sources, one contract (:class:`RecordSource`): :class:`ConfluentSource` (librdkafka, parsing
in C) and :class:`KafkaPythonSource` (several times the CPU per record:
``docs/decisions.md#trainer-loop``); both are assigned explicit offsets and never commit.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from model.trainer.dedupe import id_hashes
from model.trainer.samples import Batch, Columns, KeyCache, batch_from_columns, decode_columns

if TYPE_CHECKING:
    from streamrec.settings import KafkaSettings

log = logging.getLogger(__name__)


class Rejected(NamedTuple):
    """A record that does not decode (what the dead-letter topic needs of it)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass
class Polled:
    """The records of one poll of one topic, flat and in consumption order (per partition,
    offsets increase). ``record(i)`` rebuilds record ``i`` in full (only for rejected ones)."""

    topic: str
    partitions: list[int]
    offsets: list[int]
    values: list[Any]
    record: Callable[[int], Rejected]


class RecordSource(Protocol):
    def poll(self, timeout_s: float) -> Polled | None:
        """The next records, or None if none arrived within ``timeout_s``."""

    def close(self) -> None:
        """Close the consumer (it never commits)."""


class KafkaPythonSource:
    """A :class:`RecordSource` over an assigned ``kafka.KafkaConsumer`` (``poll`` returns
    ``{TopicPartition: [ConsumerRecord]}``)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer

    def close(self) -> None:
        self.consumer.close()

    def poll(self, timeout_s: float) -> Polled | None:
        polled = self.consumer.poll(timeout_ms=max(int(timeout_s * 1000), 0))
        records = [r for recs in polled.values() for r in recs]
        if not records:
            return None

        def record(i: int) -> Rejected:
            r = records[i]
            return Rejected(r.topic, r.partition, r.offset, r.key, r.value)

        return Polled(
            topic=records[0].topic,
            partitions=[r.partition for r in records],
            offsets=[r.offset for r in records],
            values=[r.value for r in records],
            record=record,
        )


class ConfluentSource:
    """A :class:`RecordSource` over an assigned ``confluent_kafka.Consumer``.

    ``consume()`` also returns events as messages with ``error()`` set: partition EOF (off
    unless ``enable.partition.eof``) is skipped, a fatal error raises, any other error is
    informational (librdkafka retries by itself: broker down, leader moved) and is logged,
    at most once per error code per ``warn_every_s``.
    """

    def __init__(
        self,
        consumer: Any,
        max_records: int,
        monotonic: Callable[[], float],
        warn_every_s: float = 10.0,
    ) -> None:
        self.consumer = consumer
        self.max_records = max_records
        self.monotonic = monotonic
        self.warn_every_s = warn_every_s
        self._warned: dict[int, float] = {}

    def close(self) -> None:
        self.consumer.close()

    def poll(self, timeout_s: float) -> Polled | None:
        msgs = self.consumer.consume(self.max_records, timeout_s)
        if not msgs:
            return None
        if any(m.error() is not None for m in msgs):
            msgs = [m for m in msgs if self._usable(m)]
            if not msgs:
                return None

        def record(i: int) -> Rejected:
            m = msgs[i]
            return Rejected(m.topic(), m.partition(), m.offset(), m.key(), m.value())

        return Polled(
            topic=msgs[0].topic(),
            partitions=[m.partition() for m in msgs],
            offsets=[m.offset() for m in msgs],
            values=[m.value() for m in msgs],
            record=record,
        )

    def _usable(self, msg: Any) -> bool:
        err = msg.error()
        if err is None:
            return True
        from confluent_kafka import KafkaError, KafkaException

        if err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - confluent-kafka names its internal codes so
            return False
        if err.fatal():
            raise KafkaException(err)
        now = self.monotonic()
        if now - self._warned.get(err.code(), -self.warn_every_s) >= self.warn_every_s:
            self._warned[err.code()] = now
            log.warning("samples consumer: %s (%s:%s)", err, msg.topic(), msg.partition())
        return False


def open_source(
    kafka: KafkaSettings,
    group_id: str,
    offsets: dict[str, int],
    backend: str,
    max_records: int,
    monotonic: Callable[[], float],
    wait: Callable[[float], Any],
    topic: str | None = None,
) -> RecordSource:
    """A source assigned every partition of ``topic`` (default ``kafka.samples_topic``),
    each at its offset in ``offsets`` (``"topic:partition"`` -> next offset) or at the
    beginning. ``backend``: "confluent", "kafka-python" or "auto" (confluent if installed).
    Waits up to 30 s (with ``wait``) for the topic's partitions."""
    from stream.kafka_client import assigned_consumer, consumer_backend

    backend = consumer_backend(backend)
    topic = topic or kafka.samples_topic
    prefix = f"{topic}:"
    starts = {int(key[len(prefix):]): at for key, at in offsets.items() if key.startswith(prefix)}
    consumer, saved = assigned_consumer(
        kafka, topic, starts, backend=backend, group_id=group_id,
        client_id=f"{group_id}-trainer", max_records=max_records, monotonic=monotonic, wait=wait,
    )
    log.info("consumer %s on %s at %s", backend, topic, saved)
    if backend == "confluent":
        return ConfluentSource(consumer, max_records, monotonic)
    return KafkaPythonSource(consumer)


@dataclass(frozen=True)
class Chunk:
    """Consecutive records of the samples topic holding up to ``batch_size`` trainable
    samples, decoded.

    ``sample_ids``/``item_ids`` are the trainable samples' in record order, with their
    ``batch`` and, per sample, the ``model.trainer.dedupe.id_hashes`` of its id and its event time;
    ``rejected`` are the records that do not decode, with the reason (for the dead-letter
    topic); ``offsets`` is the next offset per ``"topic:partition"`` once the chunk is
    consumed.
    """

    sample_ids: list[str]
    item_ids: list[str]
    batch: Batch | None
    id_hashes: np.ndarray
    ts_ms: np.ndarray
    rejected: list[tuple[Rejected, str]]
    offsets: dict[str, int]

    def __len__(self) -> int:
        return len(self.sample_ids)


class _Pending:
    """Records polled but not yet handed over: per record its partition and offset, the
    decoded samples as columns, and the rejected records with their record index."""

    def __init__(self, topic: str = "") -> None:
        self.topic = topic
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.samples = Columns()
        self.rejected: list[tuple[int, Rejected, str]] = []

    def __bool__(self) -> bool:
        return bool(self.offsets)

    def add(self, polled: Polled) -> None:
        cols, bad = decode_columns(polled.values)
        base = len(self.offsets)
        self.topic = polled.topic
        self.rejected += [(base + i, polled.record(i), reason) for i, reason in bad]
        self.partitions += polled.partitions
        self.offsets += polled.offsets
        self.samples.extend(cols)

    def take(self, n_samples: int) -> tuple[Columns, list[tuple[Rejected, str]], dict[str, int]]:
        """Remove the records up to and including the ``n_samples``-th sample (all records
        if there are fewer samples)."""
        n_samples = min(n_samples, len(self.samples))
        n_records = n_samples
        if self.rejected:  # the n-th sample's record index, rejected records counted in
            bad = [i for i, _, _ in self.rejected]
            if n_samples == len(self.samples):
                n_records = len(self.offsets)
            else:
                good = np.ones(len(self.offsets), bool)
                good[bad] = False
                n_records = int(np.flatnonzero(good)[n_samples - 1]) + 1 if n_samples else 0
        # the last record of a partition has its highest offset (offsets increase per partition)
        last = dict(zip(self.partitions[:n_records], self.offsets[:n_records], strict=True))
        offsets = {f"{self.topic}:{p}": o + 1 for p, o in last.items()}
        rejected = [(r, why) for i, r, why in self.rejected if i < n_records]
        self.rejected = [(i - n_records, r, why) for i, r, why in self.rejected if i >= n_records]
        del self.partitions[:n_records], self.offsets[:n_records]
        return self.samples.split(n_samples), rejected, offsets


def put_until_stopped(q: queue.Queue[Any], item: Any, stopping: threading.Event) -> bool:
    """Put ``item`` on the bounded ``q``, waiting for room until ``stopping`` is set;
    True if it was put."""
    while not stopping.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


class ChunkFetcher(threading.Thread):
    """Polls ``source`` and queues chunks of up to ``batch_size`` trainable samples."""

    def __init__(
        self,
        source: RecordSource,
        batch_size: int,
        history_len: int,
        batch_timeout_s: float,
        poll_timeout_ms: int,
        monotonic: Callable[[], float],
        keys: KeyCache | None = None,
        depth: int = 4,
    ) -> None:
        super().__init__(name="trainer-fetch", daemon=True)
        self.source = source
        self.batch_size = batch_size
        self.history_len = history_len
        self.batch_timeout_s = batch_timeout_s
        self.poll_timeout_s = poll_timeout_ms / 1000.0
        self.monotonic = monotonic
        self.keys = keys or KeyCache()
        self.chunks: queue.Queue[Chunk] = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def _chunk(self, pending: _Pending, n_samples: int) -> Chunk:
        cols, rejected, offsets = pending.take(n_samples)
        n = len(cols)
        batch = None
        ts = np.array(cols.ts_ms, np.int64).reshape(n)
        if n:
            batch = batch_from_columns(cols.user_ids, cols.item_ids, cols.histories,
                                       np.array(cols.weights, np.float32), self.history_len,
                                       self.keys, times=ts)
        return Chunk(
            sample_ids=cols.sample_ids,
            item_ids=cols.item_ids,
            batch=batch,
            id_hashes=id_hashes(cols.sample_ids),
            ts_ms=ts,
            rejected=rejected,
            offsets=offsets,
        )

    def _emit(self, chunk: Chunk) -> None:
        put_until_stopped(self.chunks, chunk, self.stopping)

    def run(self) -> None:
        pending = _Pending()
        first = 0.0
        try:
            while not self.stopping.is_set():
                polled = self.source.poll(self.poll_timeout_s)
                if polled is not None:
                    if not pending:
                        first = self.monotonic()
                    pending.add(polled)
                    while len(pending.samples) >= self.batch_size:
                        self._emit(self._chunk(pending, self.batch_size))
                        if pending:
                            first = self.monotonic()
                if pending and self.monotonic() - first >= self.batch_timeout_s:
                    self._emit(self._chunk(pending, self.batch_size))
        except BaseException as exc:  # handed to the training thread, which re-raises
            log.exception("fetcher failed")
            self.error = exc

    def get(self, timeout_s: float) -> Chunk | None:
        """The next chunk, or None after ``timeout_s``; re-raises a fetcher failure."""
        try:
            return self.chunks.get(timeout=timeout_s)
        except queue.Empty:
            if self.error is not None:
                raise RuntimeError("sample fetcher failed") from self.error
            return None

    def request_stop(self) -> None:
        """Stop fetching without waiting (:meth:`stop` waits)."""
        self.stopping.set()

    def stop(self) -> None:
        self.request_stop()
        self.join(timeout=10)
