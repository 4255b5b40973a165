"""Background fetching: Kafka poll + decode + batch assembly off the training thread.

The TF step releases the GIL while it runs, so polling and JSON decoding on this thread
overlap with training on the other core. The fetcher only reads: it owns the consumer
(kafka-python consumers are not thread-safe) and hands over :class:`Chunk` objects in
order; offsets are recorded by the training thread after a chunk is trained, so a chunk
fetched but not trained is simply read again after a restart.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from model.samples import Batch, KeyCache, Sample, SampleError, decode_sample, to_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """One consumed record: its sample, or the reason it cannot be trained on."""

    sample: Sample | None
    reason: str | None
    record: Any


@dataclass(frozen=True)
class Chunk:
    entries: list[Entry]
    samples: list[Sample]
    batch: Batch | None


class ChunkFetcher(threading.Thread):
    """Polls ``consumer`` and queues chunks of up to ``batch_size`` trainable samples."""

    def __init__(
        self,
        consumer: Any,
        batch_size: int,
        history_len: int,
        batch_timeout_s: float,
        poll_timeout_ms: int,
        monotonic: Callable[[], float],
        keys: KeyCache | None = None,
        depth: int = 4,
    ) -> None:
        super().__init__(name="trainer-fetch", daemon=True)
        self.consumer = consumer
        self.batch_size = batch_size
        self.history_len = history_len
        self.batch_timeout_s = batch_timeout_s
        self.poll_timeout_ms = poll_timeout_ms
        self.monotonic = monotonic
        self.keys = keys or KeyCache()
        self.chunks: queue.Queue[Chunk] = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def _emit(self, entries: list[Entry]) -> None:
        samples = [e.sample for e in entries if e.sample is not None]
        batch = to_batch(samples, self.history_len, self.keys) if samples else None
        chunk = Chunk(entries, samples, batch)
        while not self.stopping.is_set():
            try:
                self.chunks.put(chunk, timeout=0.1)
                return
            except queue.Full:
                continue

    def run(self) -> None:
        pending: list[Entry] = []
        trainable = 0
        first = 0.0
        try:
            while not self.stopping.is_set():
                polled = self.consumer.poll(timeout_ms=self.poll_timeout_ms)
                for records in polled.values():
                    for record in records:
                        if not pending:
                            first = self.monotonic()
                        try:
                            pending.append(Entry(decode_sample(record.value), None, record))
                            trainable += 1
                        except SampleError as exc:
                            pending.append(Entry(None, str(exc), record))
                        if trainable >= self.batch_size:
                            self._emit(pending)
                            pending, trainable = [], 0
                if pending and self.monotonic() - first >= self.batch_timeout_s:
                    self._emit(pending)
                    pending, trainable = [], 0
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

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)
