"""The quality guard of the trainer's publications (deltas and full versions).

Each head the test-then-train evaluation scores (by the state before it trains on that batch)
gives the guard per-row 0/1 signals (:class:`RowSignals`), each watched by a one-sided
Bernoulli CUSUM (:class:`Cusum`): ``paired`` — of the rows the served state (what the delta
stream gave serving) and the trained state rank differently, the served one hits (1/2 when
the trained state is no worse); ``unexplained`` — a target the model ranks outside its top
100 and the traffic of late hardly goes to (``ScoredRows.rarity`` >= 1: rarer than every
item the recent targets touched; uniformly random targets are often that, a shift of tastes,
new users or a new catalogue are not); ``lost_history`` — a user seen with a history arrives twice with none;
and one user's / target's share of the last 1,000 rows (:class:`Concentration`, a bot). Each
is judged against its own figure at the last healthy publication (``paired``: 1/2), so
a benign change of traffic moves both sides. A CUSUM trips at ``ln(1 / FALSE_ALARM)`` after
``MIN_EVIDENCE`` rows: the guard HOLDS (nothing is published), names the newest full version
before the evidence to roll back to, and RESUMES after ``min_scored`` rows with no trip.
``margin`` 0 = off. Why: ``docs/decisions.md#quality-guard``. A lock keeps the evaluation
thread's rows and the training thread's checks apart.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from model.trainer.rolling import Rolling, ScoredRows

#: False alarms per excursion a CUSUM allows (its threshold is ``ln(1 / FALSE_ALARM)``).
FALSE_ALARM = 1e-4
THRESHOLD = math.log(1.0 / FALSE_ALARM)
#: Rows of an excursion before its CUSUM may trip: never on a handful of rows.
MIN_EVIDENCE = 30
#: Lowest reference rate a CUSUM assumes: with ``p0`` near 0 every 1 weighs ln(p1 / p0) and a
#: rise to a few percent (a drift of tastes over five minutes) already tripped; at 0.05 the
#: test breaks even at 13% when it tests 25%.
MIN_RATE = 0.05
#: ``one_user`` / ``one_item``: the largest share one user / target holds of the last
#: ``CONCENTRATION_ROWS`` scored rows trips at ``CONCENTRATION_FACTOR`` times its reference,
#: and never below ``CONCENTRATION_FLOOR``.
CONCENTRATION_ROWS, CONCENTRATION_FACTOR, CONCENTRATION_FLOOR = 1000, 3.0, 0.1
#: ``unexplained``: the target ranked outside the top ``UNEXPLAINED_RANK`` candidates (a
#: count, not a share: the candidates hold every item ever seen, one-off ones too) that is
#: rare: at least as many candidates more popular of late as the recent targets had distinct
#: items (``ScoredRows.rarity >= RARE``).
UNEXPLAINED_RANK, RARE = 100, 1.0
#: ``unexplained`` does not judge rows at an event time over ``BACKFILL_MS`` behind the newest
#: seen: a replay or backfill of old events is not judged by today's traffic.
BACKFILL_MS = 3_600_000
#: Users remembered as seen with a history (``lost_history``); forgotten all at once past it.
SEEN_USERS = 1_000_000
SIGNALS = ("paired", "unexplained", "lost_history")
#: What the signals mean; a checkpoint's references and CUSUMs of other meanings are not
#: restored (the new ones start from the next healthy publication).
SIGNALS_VERSION = 2
SHARES = ("one_user", "one_item")


class RowSignals:
    """Per-row 0/1 signals of scored heads (NaN: the row says nothing), in row order; keeps
    the users seen with a history and the recent users and targets (module doc)."""

    def __init__(self) -> None:
        #: user -> (whether their last row had a history, its event time); users seen with a
        #: history only.
        self.seen: dict[int, tuple[bool, int]] = {}
        #: The newest event time seen (epoch ms).
        self.newest = 0
        #: Rows ``unexplained`` did not judge, by reason (a row may have several).
        self.unjudged: Counter[str] = Counter()

    def signals(self, rows: ScoredRows, served_ranks: np.ndarray | None, k: int = 10,
                recent_items: int = 0) -> dict[str, np.ndarray]:
        """Per-row signals; ``recent_items`` (when > 0) rescales the rows' rarity to that many
        distinct recent items (the guard's figure at its last healthy publication: a burst
        of random items must not make itself the traffic it is judged against)."""
        n = rows.hits.size
        out = {name: np.full(n, np.nan) for name in SIGNALS}
        if served_ranks is not None:
            served = (served_ranks >= 0) & (served_ranks < k)
            trained = rows.hits > 0
            out["paired"] = np.where(served != trained, served.astype(np.float64), np.nan)
        lengths = (np.asarray(rows.history) != 0).sum(axis=1)
        rarity = np.full(n, np.nan) if rows.rarity is None else np.asarray(rows.rarity)
        if recent_items > 0 and rows.recent_items > 0:
            rarity = rarity * (rows.recent_items / recent_items)
        reasons = {"not_a_candidate": rows.ranks < 0,
                   "warming_up": np.isnan(rarity) & (rows.ranks >= 0)}
        times = np.zeros(n, np.int64) if rows.times is None else np.asarray(rows.times, np.int64)
        if rows.times is not None:  # a backfill or replay of old events is not judged
            self.newest = max(self.newest, int(times.max()))
            reasons["backfill"] = times < self.newest - BACKFILL_MS
        judged = np.full(n, rows.candidates >= 2 * UNEXPLAINED_RANK)
        for name, out_ in reasons.items():
            self.unjudged[name] += int(out_.sum())
            judged &= ~out_
        out["unexplained"] = np.where(
            judged, (rows.ranks >= UNEXPLAINED_RANK) & (np.nan_to_num(rarity) >= RARE), np.nan)
        users = np.asarray(rows.user_keys, np.int64).tolist()
        out["lost_history"] = self._lost(users, lengths.tolist(), times.tolist())
        return out

    def _lost(self, users: list[int], lengths: list[int], times: list[int]) -> np.ndarray:
        """1: a user seen with a history arrives without one a second time running, at an
        event time no older than the user's last; 0: with a history again; NaN: not judged.
        An older event is a replay or a backfill: its point-in-time history may rightly be
        empty (a history keeps the newest events; an old one falls behind them)."""
        if len(self.seen) > SEEN_USERS:
            self.seen.clear()
        out = np.full(len(users), np.nan)
        for i, (user, length, ts) in enumerate(zip(users, lengths, times, strict=True)):
            had, last_ts = self.seen.get(user, (None, 0))
            if ts < last_ts:
                continue
            if length:
                self.seen[user] = (True, ts)
                if had is not None:
                    out[i] = 0.0
            elif had is True:
                self.seen[user] = (False, ts)
            elif had is False:
                self.seen[user] = (False, ts)
                out[i] = 1.0
        return out


class Concentration:
    """The largest share one key (a user, a target) holds of the last ``rows`` scored rows,
    against its long-window mean at the last healthy publication (``reference``): at
    ``CONCENTRATION_FACTOR`` times that, and at least ``CONCENTRATION_FLOOR``, it trips."""

    def __init__(self, rows: int = CONCENTRATION_ROWS, window: int = 10_000) -> None:
        self.recent: deque[int] = deque()
        self.counts: Counter[int] = Counter()
        self.rows = rows
        self.long = Rolling(window)
        self.reference: float | None = None
        self.scored = 0

    def add(self, keys: list[int], first_row: int) -> None:
        """Keys of rows ``first_row, first_row + 1, ...`` (the guard's row numbers)."""
        recent, counts = self.recent, self.counts
        for key in keys:
            recent.append(key)
            counts[key] += 1
            if len(recent) > self.rows:
                old = recent.popleft()
                counts[old] -= 1
                if not counts[old]:
                    del counts[old]
        self.scored = first_row + len(keys)
        share = self.share
        if share is not None:
            self.long.add(np.full(len(keys), share))

    @property
    def share(self) -> float | None:
        if len(self.recent) < self.rows:
            return None
        return self.counts.most_common(1)[0][1] / len(self.recent)

    @property
    def judging(self) -> bool:
        return self.reference is not None

    @property
    def limit(self) -> float | None:
        if self.reference is None:
            return None
        return max(CONCENTRATION_FACTOR * self.reference, CONCENTRATION_FLOOR)

    @property
    def tripped(self) -> bool:
        share, limit = self.share, self.limit
        return share is not None and limit is not None and share >= limit

    @property
    def start(self) -> int:
        """First row of the evidence: the window's."""
        return max(self.scored - len(self.recent), 0)

    def reset(self) -> None:
        """Nothing to restart: the window itself is the evidence."""

    def rebase(self, min_rows: int) -> None:
        if self.long.n >= min_rows:
            self.reference = self.long.value

    def reason(self, name: str) -> str:
        return (f"{name}: one key holds {self.share or 0.0:.3f} of the last {len(self.recent)} "
                f"rows >= {self.limit or 0.0:.3f} ({CONCENTRATION_FACTOR:g} x its usual "
                f"{self.reference or 0.0:.3f}, at least {CONCENTRATION_FLOOR:g})")

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "long": self.long.to_json()}

    def load(self, data: dict[str, Any]) -> None:
        ref = data.get("reference")
        self.reference = None if ref is None else float(ref)
        self.long.load(data.get("long", {}))

    def status(self) -> dict[str, Any]:
        return {"reference_share": self.reference, "share": self.share, "limit": self.limit}


class Cusum:
    """One-sided Bernoulli CUSUM of a 0/1 signal: the log-likelihood ratio of rate ``p1`` =
    ``p0 + shift`` against ``p0`` summed row by row, floored at 0; ``start`` is the row
    (of all scored) where the current excursion began. ``p0`` None: not judging yet."""

    def __init__(self, shift: float, p0: float | None = None, window: int = 10_000) -> None:
        self.shift = shift
        self.p0 = p0
        self.fixed = p0 is not None
        self.long = Rolling(window)
        self.s = 0.0
        self.n = 0
        self.start = 0

    @property
    def judging(self) -> bool:
        """Whether it has a reference rate (it may still not judge: :attr:`active`)."""
        return self.p0 is not None

    @property
    def active(self) -> bool:
        return self.p0 is not None and self.p0 + self.shift <= 0.99

    @property
    def tripped(self) -> bool:
        return self.active and self.s >= THRESHOLD and self.n >= MIN_EVIDENCE

    def add(self, x: np.ndarray, first_row: int) -> None:
        """Signals of rows ``first_row, first_row + 1, ...`` (NaN rows skipped)."""
        keep = np.flatnonzero(~np.isnan(x))
        if not keep.size:
            return
        self.long.add(x[keep])
        if not self.active:
            return
        assert self.p0 is not None
        p0 = max(self.p0, MIN_RATE)
        p1 = p0 + self.shift
        up, down = math.log(p1 / p0), math.log((1.0 - p1) / (1.0 - p0))
        s, n, start = self.s, self.n, self.start
        for i, v in zip(keep.tolist(), x[keep].tolist(), strict=True):
            if s == 0.0:
                n, start = 0, first_row + i
            s = max(0.0, s + (up if v else down))
            n += 1
        self.s, self.n, self.start = s, n, start

    def reset(self) -> None:
        self.s, self.n = 0.0, 0

    def rebase(self, min_rows: int) -> None:
        """The reference rate becomes the long window's (a healthy publication)."""
        if not self.fixed and self.long.n >= min_rows:
            self.p0 = self.long.value

    def reason(self, name: str) -> str:
        p0 = max(self.p0 or 0.0, MIN_RATE)
        return (f"{name}: CUSUM {self.s:.1f} >= {THRESHOLD:.1f} over {self.n} rows (rate "
                f"{p0:.3f} -> {p0 + self.shift:.3f} tested)")

    def to_json(self) -> dict[str, Any]:
        return {"p0": self.p0, "s": self.s, "n": self.n, "start": self.start,
                "long": self.long.to_json()}

    def load(self, data: dict[str, Any]) -> None:
        if not self.fixed:
            p0 = data.get("p0")
            self.p0 = None if p0 is None else float(p0)
        self.s, self.n = float(data.get("s", 0.0)), int(data.get("n", 0))
        self.start = int(data.get("start", 0))
        self.long.load(data.get("long", {}))

    def status(self) -> dict[str, Any]:
        return {"reference_rate": self.p0, "rate": self.long.value if self.long.n else None,
                "judged_rows": self.long.n, "cusum": round(self.s, 3), "rows": self.n,
                "active": self.active}


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
    #: On "hold": every full version published before the evidence, newest first (the
    #: registry may have pruned ``rollback_to``; the next one still there serves).
    older_versions: tuple[str, ...] = ()

    @property
    def publishes(self) -> bool:
        return self.action in ("publish", "resume")


class Guard:
    """The decision logic (module doc); ``observe`` scored heads, ``check`` before
    publishing, ``published`` after. ``served``: the served state's Recall@K hits of a
    scored head (None: unknown), for the ``paired`` signal."""

    def __init__(self, margin: float, min_scored: int, reference_rows: int = 10_000) -> None:
        if not 0.0 <= margin < 1.0:
            raise ValueError("guard margin must be in [0, 1)")
        if min_scored < 1:
            raise ValueError("guard min_scored must be >= 1")
        self.margin = margin
        self.min_scored = min_scored
        window = max(reference_rows, min_scored)
        #: The model's Recall@K over the last ``min_scored`` rows and the long window, and
        #: the long figure at the last healthy publication: shown, not judged.
        self.recent = Rolling(min_scored)
        self.long = Rolling(window)
        self.reference: float | None = None
        self.cusums = {name: Cusum(margin, 0.5 if name == "paired" else None, window)
                       for name in SIGNALS}
        self.shares = {name: Concentration(window=window) for name in SHARES}
        self.detectors: dict[str, Cusum | Concentration] = {**self.cusums, **self.shares}
        self.signals = RowSignals()
        self.served: Callable[[ScoredRows], np.ndarray | None] | None = None
        self.scored = 0
        self.held = False
        self.held_since: int | None = None
        #: When the current hold began (the clock given to :meth:`check`); None: not held.
        self.held_at: datetime | None = None
        self.holds = 0
        self.rollbacks = 0
        self.last: Decision | None = None
        self._clean_from = 0
        #: Distinct items of the recent targets: at the newest scored row, and at the last
        #: healthy publication (what ``unexplained`` measures rarity by; 0: none yet).
        self._items_now = 0
        self._items = 0
        #: (label, scored rows at publication, full version?) of recent publications.
        self._published: deque[tuple[str, int, bool]] = deque(maxlen=10_000)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.margin > 0.0

    def observe(self, rows: ScoredRows) -> None:
        """A scored head, in training order (``Evaluator.listeners``)."""
        if not rows.hits.size:
            return
        served = self.served(rows) if self.served is not None and self.enabled else None
        with self._lock:
            self._items_now = rows.recent_items or self._items_now
            signals = self.signals.signals(rows, served, recent_items=self._items)
            self.recent.add(rows.hits)
            self.long.add(rows.hits)
            for name, cusum in self.cusums.items():
                cusum.add(signals[name], self.scored)
            self.shares["one_user"].add(np.asarray(rows.user_keys, np.int64).tolist(), self.scored)
            self.shares["one_item"].add(np.asarray(rows.item_keys, np.int64).tolist(), self.scored)
            self.scored += int(rows.hits.size)

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

    def _tripped(self) -> tuple[int, str] | None:
        """(first row of the evidence, reason) of the tripped detector whose evidence began
        first, all CUSUMs restarted; None: none tripped."""
        tripped = [(c.start, name, c) for name, c in self.detectors.items() if c.tripped]
        if not tripped:
            return None
        start, name, c = min(tripped, key=lambda t: t[0])
        reason = c.reason(name)
        for cusum in self.detectors.values():
            cusum.reset()
        return start, reason

    def _check(self) -> Decision:
        cur, ref = self._current(), self.reference
        if not self.enabled:
            return Decision("publish", cur, ref, self.scored)
        trip = self._tripped()
        if self.held:
            assert self.held_since is not None
            if trip is not None:  # still bad: the hold's clock starts again
                self.held_since = self.scored
                return Decision("held", cur, ref, self.scored, trip[1])
            if self.scored - self.held_since >= self.min_scored:
                self.held, self.held_since = False, None
                self._clean_from = self.scored
                return Decision("resume", cur, ref, self.scored,
                                f"{self.min_scored} rows without a trip")
            return Decision("held", cur, ref, self.scored)
        if trip is None:
            return Decision("publish", cur, ref, self.scored)
        since, reason = trip
        self.held, self.held_since = True, self.scored
        self.holds += 1
        suspect = tuple(label for label, at, _ in self._published if at > since)
        older = tuple(reversed([label for label, at, full in self._published
                                if full and at <= since])) if suspect else ()
        target = older[0] if older else None
        if target is not None:
            self.rollbacks += 1
        return Decision("hold", cur, ref, self.scored, reason, target, suspect, older)

    def published(self, label: str, full: bool) -> None:
        """A publication went out (a delta ``full`` False, a version True): its state is the
        new healthy one; the reference figures move to the long ones now."""
        with self._lock:
            self._published.append((label, self.scored, full))
            # the references move only over rows all scored after the last hold ended (a
            # burst's rows would shift them for as long as they stay in the long window)
            clean = self.scored - self._clean_from >= self.long.window
            if self.held:
                return
            if (self.reference is None or clean) and self.long.n >= self.min_scored:
                self.reference = self.long.value
            if clean or not self._items:
                self._items = self._items_now
            for detector in self.detectors.values():
                if clean or not detector.judging:
                    detector.rebase(self.min_scored)

    #: Publications a checkpoint keeps (the newest; and the newest full versions).
    SAVED_PUBLICATIONS = 1000
    SAVED_VERSIONS = 20

    def to_json(self) -> dict[str, Any]:
        """Everything a decision depends on, for the trainer checkpoint's JSON state: a
        trainer restarted during a hold goes on holding against the same references."""
        with self._lock:
            published = list(self._published)
            start = max(len(published) - self.SAVED_PUBLICATIONS, 0)
            full = [i for i, p in enumerate(published[:start]) if p[2]][-self.SAVED_VERSIONS:]
            kept = [published[i] for i in full] + published[start:]
            return {
                "margin": self.margin, "scored": self.scored, "reference": self.reference,
                "held": self.held, "held_since": self.held_since,
                "held_at": None if self.held_at is None else self.held_at.isoformat(),
                "holds": self.holds, "rollbacks": self.rollbacks,
                "clean_from": self._clean_from, "recent": self.recent.to_json(),
                "recent_items": self._items,
                "long": self.long.to_json(), "published": [list(p) for p in kept],
                "signals_version": SIGNALS_VERSION,
                "detectors": {name: c.to_json() for name, c in self.detectors.items()},
            }

    def restore(self, data: dict[str, Any], now: datetime | None = None) -> None:
        """Back to a state of :meth:`to_json` (this guard's settings are kept). A hold
        checkpointed without its start (an older checkpoint) counts from ``now``."""
        with self._lock:
            self.scored = int(data.get("scored", 0))
            ref = data.get("reference")
            self.reference = None if ref is None else float(ref)
            self.held = bool(data.get("held", False))
            since = data.get("held_since")
            self.held_since = int(since) if self.held and since is not None else (
                self.scored if self.held else None)
            held_at = data.get("held_at")
            self.held_at = (None if not self.held else
                            datetime.fromisoformat(held_at) if held_at else now)
            self.holds = int(data.get("holds", 0))
            self.rollbacks = int(data.get("rollbacks", 0))
            self._clean_from = int(data.get("clean_from", 0))
            self._items = int(data.get("recent_items", 0))
            self.recent.load(data.get("recent", {}))
            self.long.load(data.get("long", {}))
            same = data.get("signals_version", 1) == SIGNALS_VERSION
            for name, state in (data.get("detectors", {}) if same else {}).items():
                if name in self.detectors:
                    self.detectors[name].load(state)
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
                "signals": {name: c.status() for name, c in self.detectors.items()},
                "newest_event_ms": self.signals.newest or None,
                "unexplained_not_judged": dict(self.signals.unjudged),
                "last_action": last.action if last else None,
                "last_reason": last.reason if last else None,
            }
