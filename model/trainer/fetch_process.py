"""The samples fetch in a child process (``LoopOptions.fetch_process``, the default).

Decoding samples is Python work: on a thread of the training process it holds the GIL and a
core the compiled step wants (``docs/decisions.md#trainer-fetch-process``). The child runs
the same :class:`model.trainer.fetch_thread.ChunkFetcher` at the offsets the parent restored and
hands chunks over a queue; the parent records offsets only after training, so exactly-once is
unchanged. The child imports no TensorFlow (``spawn``), exits when asked, when the parent is
gone (checked 20 times a second) or on an error it reports, and ignores SIGINT and SIGTERM
(blocked from before the spawn) so a signal to the trainer's process group cannot kill it
mid-drain; the parent stops it through the stop flag.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
import time
from typing import TYPE_CHECKING, Any

from model.trainer.fetch_thread import Chunk, ChunkFetcher, open_source
from stream.gc_tuning import tune_gc

if TYPE_CHECKING:
    from streamrec.settings import KafkaSettings

log = logging.getLogger(__name__)

#: How long the child blocks before it looks at the stop flag and its parent again: short,
#: so that stopping the trainer does not wait for it (a wake-up costs microseconds).
_CHECK_S = 0.05
#: How long the parent waits for a report a child sent just before exiting.
_REPORT_S = 0.5


#: What a terminal's Ctrl-C and ``streamrec down`` send to the trainer's process group.
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class _Failure(tuple):  # (message,): what the child sends instead of a chunk when it fails
    pass


def _put(out: Any, item: object, stop: Any, parent: int) -> bool:
    while not stop.is_set() and os.getppid() == parent:
        try:
            out.put(item, timeout=_CHECK_S)
            return True
        except queue.Full:
            continue
    return False


#: ``open_source`` arguments before its clock and wait: kafka, group id, offsets, backend,
#: max records; ``ChunkFetcher`` arguments after its source: batch size, history length,
#: batch timeout (s), poll timeout (ms).
SourceArgs = tuple["KafkaSettings", str, dict[str, int], str, int]
FetchArgs = tuple[int, int, float, int]


def _child(out: Any, stop: Any, parent: int, source_args: SourceArgs,
           fetch_args: FetchArgs) -> None:
    failure = None
    for sig in _STOP_SIGNALS:  # the parent stops this process (module doc)
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    tune_gc()  # this process only decodes (stream.gc_tuning: what the collector cost)
    try:
        source = open_source(*source_args, time.monotonic, stop.wait)
        fetcher = ChunkFetcher(source, *fetch_args, time.monotonic)
        fetcher.start()
        try:
            while not stop.is_set() and os.getppid() == parent:
                chunk = fetcher.get(_CHECK_S)
                if chunk is not None and not _put(out, chunk, stop, parent):
                    break
        finally:
            fetcher.stop()
            source.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        failure = f"{type(exc).__name__}: {exc}"
    if failure is not None and _put(out, _Failure((failure,)), stop, parent):
        return  # the queue flushes the report before the process exits
    # Stopped, or the parent is gone: exit without flushing what the queue still buffers
    # (nobody may read it any more; untrained chunks are read again from the checkpoint).
    out.cancel_join_thread()


def _widen_pipe(q: Any, size: int = 1 << 20) -> None:
    """Let the queue's pipe hold several chunks (Linux ``F_SETPIPE_SZ``; else left as is).

    A chunk pickles to more than the default 64 KB pipe holds: the child's feeder thread then
    writes it in two parts, taking the child's interpreter lock back from the decoding
    thread in between, while the training thread waits for the rest (the measured wait:
    ``docs/decisions.md#trainer-fetch-process``)."""
    try:
        import fcntl

        fcntl.fcntl(q._writer.fileno(), fcntl.F_SETPIPE_SZ, size)  # noqa: SLF001 - no public pipe handle
    except (ImportError, AttributeError, OSError):  # not Linux, or a capped pipe size
        pass


class ProcessFetcher:
    """:class:`ChunkFetcher`'s interface (``start``/``get``/``stop``) over a child process
    that opens the source itself (``open_source`` arguments) and fetches with
    ``ChunkFetcher(source, batch_size, history_len, batch_timeout_s, poll_timeout_ms)``."""

    def __init__(
        self,
        kafka: KafkaSettings,
        group_id: str,
        offsets: dict[str, int],
        backend: str,
        max_records: int,
        batch_size: int,
        history_len: int,
        batch_timeout_s: float,
        poll_timeout_ms: int,
        depth: int = 4,
    ) -> None:
        ctx = mp.get_context("spawn")
        self._queue = ctx.Queue(maxsize=depth)
        _widen_pipe(self._queue)
        self._stop = ctx.Event()
        source_args: SourceArgs = (kafka, group_id, dict(offsets), backend, max_records)
        fetch_args: FetchArgs = (batch_size, history_len, batch_timeout_s, poll_timeout_ms)
        self._process = ctx.Process(
            target=_child,
            args=(self._queue, self._stop, os.getpid(), source_args, fetch_args),
            name="trainer-fetch",
            daemon=True,
        )

    def start(self) -> None:
        # the child inherits the blocked mask until it ignores the signals (module doc)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            self._process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def get(self, timeout_s: float) -> Chunk | None:
        """The next chunk, or None after ``timeout_s`` (or once the child stopped as asked);
        raises if the child failed or died."""
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            if self._process.is_alive() or (self._stop.is_set() and self._process.exitcode == 0):
                return None
            try:  # what it sent just before exiting may still be on its way
                item = self._queue.get(timeout=_REPORT_S)
            except queue.Empty:
                raise RuntimeError(
                    f"sample fetch process exited (code {self._process.exitcode})"
                ) from None
        if isinstance(item, _Failure):
            raise RuntimeError(f"sample fetcher failed: {item[0]}")
        return item

    def request_stop(self) -> None:
        """Ask the child to stop without waiting for it (:meth:`stop` waits): its consumer
        closes meanwhile."""
        self._stop.set()

    def stop(self) -> None:
        self.request_stop()
        self._process.join(timeout=10)
        if self._process.is_alive():
            log.warning("sample fetch process did not stop in 10 s: terminating it")
            self._process.terminate()
            self._process.join(timeout=5)
        self._queue.close()
