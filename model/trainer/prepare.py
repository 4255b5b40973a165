"""The next chunk prepared while the current one trains (``LoopOptions.prepare_ahead``).

:class:`Preparer` is a thread between the samples fetcher and the training thread. In
chunk order it takes each fetched chunk (unpickling it, from the fetch process), drops the
samples trained before (:func:`admit`, ``model.trainer.dedupe``) and has the trainer make
the batch's step inputs (:meth:`model.trainer.trainer.Trainer.prepare`: tensors, sampled
negatives), then queues it for the training thread. The train step releases the
interpreter lock while it runs, so all of this overlaps the step of the chunk before
instead of preceding the next one's. Every stateful part (the trained-id set, the
negatives sampler) still sees the samples in stream order, one chunk after the other.

Exactly once: a chunk's ids enter the trained set here, up to two chunks before the chunk
trains. :meth:`Preparer.trained_ids` (what a checkpoint saves) leaves out the ids of the
chunks admitted but not handed to the training thread yet, so a checkpoint holds the ids of
exactly the samples its offsets cover, as without the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from model.trainer.dedupe import TrainedIds
from model.trainer.fetch_thread import Chunk, put_until_stopped
from model.trainer.samples import Batch

if TYPE_CHECKING:
    from model.trainer.trainer import Prepared, Trainer

log = logging.getLogger(__name__)


class ChunkSource(Protocol):
    def get(self, timeout_s: float) -> Chunk | None:
        """The next chunk, or None after ``timeout_s``."""


@dataclass(frozen=True)
class Admitted:
    """A chunk with its samples trained before dropped: ``batch`` (None: no sample left),
    with the kept samples' ids, item ids, id hashes and event times; ``dropped`` counts the
    others; ``prepared``: the batch's step inputs made ahead (None: made at the step)."""

    chunk: Chunk
    batch: Batch | None
    sample_ids: list[str]
    item_ids: list[str]
    hashes: np.ndarray
    ts_ms: np.ndarray
    dropped: int
    prepared: Prepared | None = None

    def __len__(self) -> int:
        """Samples of the chunk as fetched (before dropping)."""
        return len(self.chunk)


def admit(trained: TrainedIds, chunk: Chunk) -> Admitted:
    """The samples of ``chunk`` not in ``trained``, whose ids it then holds."""
    sample_ids, item_ids = chunk.sample_ids, chunk.item_ids
    batch, hashes, ts = chunk.batch, chunk.id_hashes, chunk.ts_ms
    dropped = 0
    if batch is not None:
        fresh = trained.admit_hashes(hashes)
        if not fresh.all():
            dropped = int((~fresh).sum())
            keep = fresh.tolist()
            sample_ids = [s for s, k in zip(sample_ids, keep, strict=True) if k]
            item_ids = [s for s, k in zip(item_ids, keep, strict=True) if k]
            batch = batch.rows(fresh) if sample_ids else None
            hashes, ts = hashes[fresh], ts[fresh]
    return Admitted(chunk, batch, sample_ids, item_ids, hashes, ts, dropped)


class Preparer(threading.Thread):
    """Admits and prepares the chunks of ``source`` in order, at most ``depth`` ahead of
    the training thread (:meth:`get`)."""

    def __init__(
        self, source: ChunkSource, trained: TrainedIds, trainer: Trainer, depth: int = 1
    ) -> None:
        super().__init__(name="trainer-prepare", daemon=True)
        self.source = source
        self.trained = trained
        self.trainer = trainer
        self.ready: queue.Queue[Admitted] = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        #: Guards ``trained`` and ``_ahead``: the hashes each admitted chunk added to
        #: ``trained`` that the training thread has not taken yet, in chunk order.
        self._lock = threading.Lock()
        self._ahead: deque[np.ndarray] = deque()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                chunk = self.source.get(timeout_s=0.1)
                if chunk is None:
                    continue
                with self._lock:
                    item = admit(self.trained, chunk)
                    self._ahead.append(item.hashes)
                if item.batch is not None:
                    item = replace(item, prepared=self.trainer.prepare(item.batch))
                put_until_stopped(self.ready, item, self.stopping)
        except BaseException as exc:  # handed to the training thread, which re-raises
            log.exception("chunk preparation failed")
            self.error = exc

    def get(self, timeout_s: float) -> Admitted | None:
        """The next prepared chunk, or None after ``timeout_s``; re-raises a failure."""
        try:
            item = self.ready.get(timeout=timeout_s)
        except queue.Empty:
            if self.error is not None:
                raise RuntimeError("chunk preparation failed") from self.error
            return None
        with self._lock:
            self._ahead.popleft()
        return item

    def trained_ids(self) -> np.ndarray:
        """The trained set as a checkpoint saves it (``TrainedIds.to_array``) without the
        ids of the chunks admitted but not taken by :meth:`get` yet."""
        with self._lock:
            ids = self.trained.to_array()
            if not self._ahead:
                return ids
            ahead = np.concatenate(self._ahead)
        return ids[~np.isin(ids, ahead, assume_unique=True)]

    def request_stop(self) -> None:
        """Take no more chunks, without waiting for the thread (:meth:`stop` waits)."""
        self.stopping.set()

    def stop(self) -> TrainedIds:
        """Stop the thread; returns the trained set without the ids of the chunks it
        admitted that were not taken (the set itself when there are none)."""
        self.request_stop()
        self.join(timeout=10)
        with self._lock:
            if not self._ahead:
                return self.trained
        return TrainedIds.from_array(self.trained_ids())
