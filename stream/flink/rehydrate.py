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
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from feature_store.store import Mark, OnlineStore

log = logging.getLogger(__name__)

#: How often a part checks the store when it writes nothing (seconds).
CHECK_EVERY_S = 1.0
#: Records re-written per batch or timer call while rehydrating.
CHUNK = 2_000
#: Timer delay while a part rehydrates (ms): the next chunk follows soon.
REHYDRATE_TICK_MS = 20


@dataclass
class PartGuard:
    """Generation bookkeeping of one part in one subtask (module doc)."""

    part: str
    store: OnlineStore
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
