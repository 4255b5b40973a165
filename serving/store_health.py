"""Is the online store whole? Serving's reading of the store generation (FORMAT.md "Generation").

States (:attr:`StoreStatus.state`):

* ``whole`` — the marker is there and no part is rehydrating;
* ``rehydrating`` — some parts are being re-written by the feature job, or the marker is newer
  than ``grace_s`` (parts that write nothing check once a second: within the grace every part
  has checked and flagged itself if the store lost its writes);
* ``lost`` — the marker this process saw is gone: the store restarted empty and no writer has
  written since (is the feature job running?);
* ``unknown`` — no marker was ever seen (no feature job has written yet, or the backend keeps
  none): nothing is claimed, answers are not marked degraded for it.

The marker is read at most every ``ttl_s``; a failed read keeps the last status (a dead store
is :class:`serving.retrieval.StoreGuard`'s business).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from feature_store.store import OnlineStore

log = logging.getLogger(__name__)

WHOLE = "whole"
REHYDRATING = "rehydrating"
LOST = "lost"
UNKNOWN = "unknown"
STATES = (WHOLE, REHYDRATING, LOST, UNKNOWN)


@dataclass(frozen=True, slots=True)
class StoreStatus:
    state: str
    reason: str | None = None
    parts_rehydrating: int = 0
    epoch: str | None = None

    @property
    def degraded(self) -> bool:
        return self.state in (REHYDRATING, LOST)

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "reason": self.reason,
                "parts_rehydrating": self.parts_rehydrating, "epoch": self.epoch}


class StoreHealth:
    """The store's status, cached for ``ttl_s`` (module doc)."""

    def __init__(
        self,
        store: OnlineStore,
        ttl_s: float = 1.0,
        grace_s: float = 3.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.grace_s = grace_s
        self.monotonic = monotonic
        self.wall_ms = wall_ms
        self._lock = threading.Lock()
        self._checked_at = float("-inf")
        self._status = StoreStatus(UNKNOWN)
        self._seen_epoch: str | None = None
        #: monotonic time this process first saw the current epoch (after another one)
        self._epoch_changed_at = float("-inf")

    def status(self) -> StoreStatus:
        with self._lock:
            now = self.monotonic()
            if now - self._checked_at >= self.ttl_s:
                self._checked_at = now
                self._status = self._read(now)
            return self._status

    def _read(self, now: float) -> StoreStatus:
        try:
            gen = self.store.read_generation()
        except Exception as exc:  # noqa: BLE001 - a dead store is reported by the read path
            log.debug("generation read failed: %s", exc)
            return self._status
        if gen is None:
            return StoreStatus(UNKNOWN)
        if gen.epoch is None:
            if self._seen_epoch is None and not gen.rehydrating:
                return StoreStatus(UNKNOWN)
            return StoreStatus(LOST, "feature store restarted empty; the feature job has not "
                               "re-written it yet", epoch=None)
        if gen.epoch != self._seen_epoch:
            if self._seen_epoch is not None:
                self._epoch_changed_at = now
                log.warning("feature store generation changed (%s -> %s): it lost its data",
                            self._seen_epoch, gen.epoch)
            self._seen_epoch = gen.epoch
        if gen.rehydrating:
            n = len(gen.rehydrating)
            return StoreStatus(REHYDRATING, f"feature store rehydrating: {n} part(s) of the "
                               "feature job re-writing their state", n, gen.epoch)
        young = (now - self._epoch_changed_at < self.grace_s
                 or 0 <= self.wall_ms() - gen.since_ms < self.grace_s * 1000)
        if young:
            return StoreStatus(REHYDRATING, "feature store generation is new: waiting for every "
                               "part of the feature job to check it", 0, gen.epoch)
        return StoreStatus(WHOLE, None, 0, gen.epoch)
