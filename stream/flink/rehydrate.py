"""The feature job's side of the store generation (``feature_store/FORMAT.md``, "Generation").

Each stage writes its records by *part* (``users/3``: the user stage's bucket ``3``;
``items/a``; ``trending``) and counts the part's write batches in Flink keyed state, so the
count is checkpointed with the states it describes. Every write batch carries a
``feature_store.store.Mark``; a part that has nothing to write checks with an empty mark
every ``check_every_s`` (a processing-time timer), so a quiet part notices a loss too. When
the store answers that it is behind (it restarted empty, or from an older AOF or snapshot),
the part re-writes its whole state: the keys of its ``MapState`` are listed once and written
``chunk`` at a time, one chunk per batch or timer call, between the batches of new events
(which keep flowing and keep being written: records are only-if-newer, so a rehydrated
record never overwrites a fresher one). The last chunk clears the store's flag. A restart
during rehydration starts it over: the flag is still set in the store.

:class:`PartGuard` is that bookkeeping without Flink (unit-tested with fakes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from feature_store.store import Mark, OnlineStore, OnlineStoreError

log = logging.getLogger(__name__)

#: How often a part checks the store when it writes nothing (seconds).
CHECK_EVERY_S = 1.0
#: Records re-written per batch or timer call while rehydrating.
CHUNK = 2_000
#: Timer delay while a part rehydrates (ms): the next chunk follows soon.
REHYDRATE_TICK_MS = 20


class RetryingWrites:
    """The stage's store, its writes retried for up to ``deadline_s`` when the store fails.

    A Redis restart is an outage of seconds: waiting for it in place keeps the job's state in
    memory and its caches warm, where failing the task would restart the job from its last
    checkpoint (restore, replay, back-off) — which still happens if the store stays down past
    the deadline. Writes are only-if-newer and marks are idempotent, so a retried write that
    had reached the store changes nothing.
    """

    def __init__(self, store: OnlineStore, deadline_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store, self.deadline_s = store, deadline_s
        self._sleep, self._monotonic = sleep, monotonic

    def _retry(self, call: Callable[[], Any]) -> Any:
        give_up, pause = self._monotonic() + self.deadline_s, 0.1
        while True:
            try:
                return call()
            except OnlineStoreError as exc:
                if self._monotonic() + pause > give_up:
                    raise
                log.warning("online store write failed (%s); retrying in %.1f s", exc, pause)
                self._sleep(pause)  # back-off between attempts
                pause = min(pause * 2, 2.0)

    def write_batch(self, *args: Any, **kw: Any) -> Any:
        return self._retry(lambda: self.store.write_batch(*args, **kw))

    def write_user_rows(self, rows: Iterable[Any], mark: Mark | None = None) -> Any:
        rows = list(rows)  # a retry needs them again
        return self._retry(lambda: self.store.write_user_rows(rows, mark=mark))

    def write_catalogue(self, records: Sequence[Any]) -> Any:
        return self._retry(lambda: self.store.write_catalogue(records))

    def finish_rehydration(self, part: str, writes: int) -> None:
        self._retry(lambda: self.store.finish_rehydration(part, writes))

    def close(self) -> None:
        self.store.close()


@dataclass
class PartGuard:
    """Generation bookkeeping of one part in one subtask (module doc)."""

    part: str
    #: the stage's store (an ``OnlineStore`` or its :class:`RetryingWrites`)
    store: OnlineStore | RetryingWrites
    chunk: int = CHUNK
    check_every_s: float = CHECK_EVERY_S
    #: Keys still to re-write; None while the part is whole.
    pending: list[str] | None = None
    #: Whether ``pending`` holds the listed keys yet (listed on the first step).
    listed: bool = False
    last_check_s: float = float("-inf")
    #: Records re-written by the rehydration under way.
    rehydrated: int = 0
    started_s: float = 0.0
    #: The processing time the part's check timer is due at (None: none registered).
    timer_at: int | None = None

    @property
    def rehydrating(self) -> bool:
        return self.pending is not None

    def mark(self, writes: int) -> Mark:
        """The mark of a batch that brings the part's count from ``writes - 1`` to ``writes``."""
        return Mark(self.part, writes - 1, writes)

    def after_write(self, ok: bool, now_s: float) -> None:
        """Verdict of a marked write: ``ok`` False means the store lost writes."""
        self.last_check_s = now_s
        if not ok and self.pending is None:
            self.pending, self.listed = [], False  # listed on the next step
            self.started_s = now_s
            log.warning("online store is behind part %s: rehydrating it", self.part)

    def check_due(self, now_s: float) -> bool:
        return not self.rehydrating and now_s - self.last_check_s >= self.check_every_s

    def check(self, writes: int, now_s: float) -> None:
        """Ask the store whether it holds the part's ``writes`` batches (an empty mark)."""
        ok = self.store.write_batch(mark=Mark(self.part, writes, writes))
        self.after_write(ok is not False, now_s)

    def step(
        self,
        keys: Callable[[], Iterable[str]],
        write: Callable[[list[str]], int],
        writes: int,
        now_s: float,
    ) -> int:
        """One chunk of the rehydration: ``keys()`` lists the part's state keys (once),
        ``write(chunk)`` re-writes their records and returns how many it wrote; after the last
        chunk the store learns the part holds ``writes`` batches again."""
        if self.pending is None:
            return 0
        if not self.listed:
            self.pending, self.listed = list(keys()), True
            log.info("part %s: re-writing %d records", self.part, len(self.pending))
        chunk = self.pending[-self.chunk :]  # from the end: O(chunk), order is irrelevant
        del self.pending[-self.chunk :]
        written = write(chunk) if chunk else 0
        self.rehydrated += written
        if not self.pending:
            self.store.finish_rehydration(self.part, writes)
            log.info("part %s rehydrated: %d records in %.1f s", self.part, self.rehydrated,
                     now_s - self.started_s)
            self.pending, self.listed, self.rehydrated = None, False, 0
            self.last_check_s = now_s
        return written
