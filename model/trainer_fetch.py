"""Background fetching: Kafka poll + decode + batch assembly off the training thread.

The TF step releases the GIL while it runs, so polling and JSON decoding on this thread
overlap with training on the other core. Everything per sample that does not need the
training state is done here too (int64 keys, sample-id hashes for dedupe and the digest,
event times), so the training thread does per chunk only what it must. The fetcher only reads: it owns the consumer
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

import numpy as np

from model.dedupe import id_hashes
from model.samples import Batch, KeyCache, Sample, SampleError, decode_sample, to_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """Up to ``batch_size`` consecutive records of the samples topic, decoded.

    ``samples`` are the trainable ones in record order, with their ``batch`` and, per
    sample, the ``model.dedupe.id_hashes`` of its id and its event time; ``rejected`` are
    the records that do not decode, with the reason (for the dead-letter topic);
    ``offsets`` is the next offset per ``"topic:partition"`` once the chunk is consumed.
    """

    samples: list[Sample]
    batch: Batch | None
    id_hashes: np.ndarray
    ts_ms: np.ndarray
    rejected: list[tuple[Any, str]]
    offsets: dict[str, int]


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

    def _emit(self, samples: list[Sample], rejected: list[tuple[Any, str]],
              offsets: dict[str, int]) -> None:
        n = len(samples)
        chunk = Chunk(
            samples=samples,
            batch=to_batch(samples, self.history_len, self.keys) if samples else None,
            id_hashes=id_hashes([s.sample_id for s in samples]),
            ts_ms=np.fromiter((s.ts_ms for s in samples), np.int64, n),
            rejected=rejected,
            offsets=offsets,
        )
        while not self.stopping.is_set():
            try:
                self.chunks.put(chunk, timeout=0.1)
                return
            except queue.Full:
                continue

    def run(self) -> None:
        samples: list[Sample] = []
        rejected: list[tuple[Any, str]] = []
        offsets: dict[str, int] = {}
        first = 0.0
        decode = decode_sample
        try:
            while not self.stopping.is_set():
                polled = self.consumer.poll(timeout_ms=self.poll_timeout_ms)
                for tp, records in polled.items():
                    where = f"{tp.topic}:{tp.partition}"
                    for record in records:
                        if not offsets:
                            first = self.monotonic()
                        try:
                            samples.append(decode(record.value))
                        except SampleError as exc:
                            rejected.append((record, str(exc)))
                        offsets[where] = record.offset + 1
                        if len(samples) >= self.batch_size:
                            self._emit(samples, rejected, offsets)
                            samples, rejected, offsets = [], [], {}
                if offsets and self.monotonic() - first >= self.batch_timeout_s:
                    self._emit(samples, rejected, offsets)
                    samples, rejected, offsets = [], [], {}
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
