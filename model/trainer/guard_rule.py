"""The quality guard of the trainer's publications (deltas and full versions).

Every scored row of the test-then-train evaluation (scored by the state before it trains on
that batch) feeds the guard its Recall@K hit. Before each publication :meth:`Guard.check`
compares the figure of the last ``min_scored`` rows, and of the rows since the last
publication, with the reference figure at the last healthy publication. More than ``margin``
below: it HOLDS (nothing is published) and names the newest full version before the evidence
to roll back to; it RESUMES once ``min_scored`` rows after the hold recover. ``margin`` 0 =
off. The reference, the window test and their reasons: docs/internals.md and
``docs/decisions.md#quality-guard``. Not thread-safe by itself: a lock keeps the evaluation
thread's rows and the training thread's checks apart.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from model.trainer.rolling import Rolling

#: One-sided binomial z the rows since the last publication must reach to hold alone.
WINDOW_Z = 3.0


@dataclass(frozen=True)
class Decision:
    """What :meth:`Guard.check` found: ``action`` is "publish", "hold" (just tripped),
    "held" (still holding), or "resume" (just recovered; publication goes on)."""

    action: str
    current: float | None
    reference: float | None
    scored: int
    reason: str = ""
    #: On "hold": the full version serving should return to (None: what it serves is fine,
    #: or no full version predates the evidence).
    rollback_to: str | None = None
    #: On "hold": publications since the evidence began (labels), newest last.
    suspect: tuple[str, ...] = ()

    @property
    def publishes(self) -> bool:
        return self.action in ("publish", "resume")


class Guard:
    """The decision logic (module doc); ``observe`` rows, ``check`` before publishing,
    ``published`` after."""

    def __init__(self, margin: float, min_scored: int, reference_rows: int = 10_000) -> None:
        if not 0.0 <= margin < 1.0:
            raise ValueError("guard margin must be in [0, 1)")
        if min_scored < 1:
            raise ValueError("guard min_scored must be >= 1")
        self.margin = margin
        self.min_scored = min_scored
        self.recent = Rolling(min_scored)
        self.long = Rolling(max(reference_rows, min_scored))
        self.scored = 0
        self.reference: float | None = None
        self.held = False
        self.held_since: int | None = None
        #: When the current hold began (the clock given to :meth:`check`); None: not held.
        self.held_at: datetime | None = None
        self.holds = 0
        self.rollbacks = 0
        self.last: Decision | None = None
        self._window_n = 0
        self._window_hits = 0.0
        self._last_publication_at = 0
        self._clean_from = 0
        #: (label, scored rows at publication, full version?) of recent publications.
        self._published: deque[tuple[str, int, bool]] = deque(maxlen=10_000)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.margin > 0.0

    def observe(self, hits: np.ndarray) -> None:
        """Recall@K hits (0/1) of scored rows, in training order."""
        hits = np.asarray(hits, np.float64).reshape(-1)
        if not hits.size:
            return
        with self._lock:
            self._observe(hits)

    def _observe(self, hits: np.ndarray) -> None:
        self.recent.add(hits)
        self.long.add(hits)
        self.scored += int(hits.size)
        self._window_n += int(hits.size)
        self._window_hits += float(hits.sum())

    def _current(self) -> float | None:
        return self.recent.value if self.recent.n >= self.min_scored else None

    def check(self, now: datetime | None = None) -> Decision:
        """The decision before a publication (module doc); ``now`` (timezone-aware) is kept
        as the start of a hold this check begins."""
        with self._lock:
            d = self._check()
            if d.action == "hold":
                self.held_at = now
            elif not self.held:
                self.held_at = None
            self.last = d
            return d

    def held_for_s(self, now: datetime) -> float | None:
        """Seconds the current hold has lasted at ``now`` (None: not holding, or its start
        is unknown)."""
        with self._lock:
            return self._held_for_s(now)

    def _held_for_s(self, now: datetime) -> float | None:
        if not self.held or self.held_at is None:
            return None
        return max((now - self.held_at).total_seconds(), 0.0)

    def _check(self) -> Decision:
        cur, ref = self._current(), self.reference
        if not self.enabled:
            return Decision("publish", cur, ref, self.scored)
        if self.held:
            assert ref is not None and self.held_since is not None
            fresh = self.scored - self.held_since >= self.min_scored
            if fresh and cur is not None and cur >= (1.0 - self.margin) * ref:
                self.held, self.held_since = False, None
                self._clean_from = self.scored
                return Decision("resume", cur, ref, self.scored,
                                f"recall {cur:.4f} >= {(1 - self.margin) * ref:.4f}")
            return Decision("held", cur, ref, self.scored)
        if ref is None:
            return Decision("publish", cur, ref, self.scored, "no healthy reference yet")
        floor = (1.0 - self.margin) * ref
        since: int | None = None
        reason = ""
        if self._window_n and floor > 0.0:
            rate = self._window_hits / self._window_n
            z = (floor - rate) / math.sqrt(floor * (1.0 - floor) / self._window_n)
            if z >= WINDOW_Z:
                since = self._last_publication_at
                reason = (f"the {self._window_n} rows since the last publication: recall "
                          f"{rate:.4f} < {floor:.4f} (z {z:.1f})")
        if since is None and cur is not None and cur < floor:
            since = self.scored - self.min_scored
            reason = f"recall {cur:.4f} over {self.min_scored} rows < {floor:.4f}"
        if since is None:
            return Decision("publish", cur, ref, self.scored)
        self.held, self.held_since = True, self.scored
        self.holds += 1
        suspect = tuple(label for label, at, _ in self._published if at > since)
        target = None
        if suspect:
            older = [label for label, at, full in self._published if full and at <= since]
            target = older[-1] if older else None
            if target is not None:
                self.rollbacks += 1
        return Decision("hold", cur, ref, self.scored, reason, target, suspect)

    def published(self, label: str, full: bool) -> None:
        """A publication went out (a delta ``full`` False, a version True): its state is the
        new healthy one, the reference moves to the long figure now."""
        with self._lock:
            self._published.append((label, self.scored, full))
            self._last_publication_at = self.scored
            self._window_n, self._window_hits = 0, 0.0
            # the reference moves only over rows all scored after the last hold ended (a
            # burst's rows would lower it for as long as they stay in the long window)
            clean = self.scored - self._clean_from >= self.long.window
            if not self.held and self.long.n >= self.min_scored and (
                    self.reference is None or clean):
                self.reference = self.long.value

    #: Publications a checkpoint keeps (the newest; and the newest full versions).
    SAVED_PUBLICATIONS = 1000
    SAVED_VERSIONS = 20

    def to_json(self) -> dict[str, Any]:
        """Everything a decision depends on, for the trainer checkpoint's JSON state: a
        trainer restarted during a hold goes on holding against the same healthy figure."""
        with self._lock:
            published = list(self._published)
            start = max(len(published) - self.SAVED_PUBLICATIONS, 0)
            full = [i for i, p in enumerate(published[:start]) if p[2]][-self.SAVED_VERSIONS:]
            kept = [published[i] for i in full] + published[start:]
            return {
                "margin": self.margin, "scored": self.scored, "reference": self.reference,
                "held": self.held, "held_since": self.held_since,
                "held_at": None if self.held_at is None else self.held_at.isoformat(),
                "holds": self.holds,
                "rollbacks": self.rollbacks, "window_n": self._window_n,
                "window_hits": self._window_hits,
                "last_publication_at": self._last_publication_at,
                "clean_from": self._clean_from, "recent": self.recent.to_json(),
                "long": self.long.to_json(), "published": [list(p) for p in kept],
            }

    def restore(self, data: dict[str, Any], now: datetime | None = None) -> None:
        """Back to a state of :meth:`to_json` (this guard's settings are kept). A hold
        checkpointed without its start (an older checkpoint) counts from ``now``."""
        with self._lock:
            self.scored = int(data.get("scored", 0))
            ref = data.get("reference")
            self.reference = None if ref is None else float(ref)
            self.held = bool(data.get("held", False)) and self.reference is not None
            since = data.get("held_since")
            self.held_since = int(since) if self.held and since is not None else (
                self.scored if self.held else None)
            held_at = data.get("held_at")
            self.held_at = (None if not self.held else
                            datetime.fromisoformat(held_at) if held_at else now)
            self.holds = int(data.get("holds", 0))
            self.rollbacks = int(data.get("rollbacks", 0))
            self._window_n = int(data.get("window_n", 0))
            self._window_hits = float(data.get("window_hits", 0.0))
            self._last_publication_at = int(data.get("last_publication_at", 0))
            self._clean_from = int(data.get("clean_from", 0))
            self.recent.load(data.get("recent", {}))
            self.long.load(data.get("long", {}))
            self._published.clear()
            self._published.extend((str(label), int(at), bool(full))
                                   for label, at, full in data.get("published", []))

    def status(self, now: datetime | None = None) -> dict[str, Any]:
        """What the trainer's ``/health`` shows under ``guard``; ``held_for_s`` needs
        ``now``."""
        with self._lock:
            last = self.last
            return {
                "enabled": self.enabled,
                "held": self.held,
                "held_at": None if self.held_at is None or not self.held
                else self.held_at.isoformat(),
                "held_for_s": None if now is None else self._held_for_s(now),
                "margin": self.margin,
                "min_scored": self.min_scored,
                "current_recall": self._current(),
                "healthy_recall": self.reference,
                "scored": self.scored,
                "holds": self.holds,
                "rollbacks": self.rollbacks,
                "last_action": last.action if last else None,
                "last_reason": last.reason if last else None,
            }
