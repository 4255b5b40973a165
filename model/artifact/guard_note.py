"""The quality guard's hold as ``/health`` tells it, for the trainer (its own guard) and
serving (the ``GUARD.json`` note beside CURRENT, :meth:`Registry.guard`).

The note's ``held`` and ``held_since`` (ISO 8601, timezone-aware; null when not holding) say
whether publication is held and since when; a hold that has lasted longer than the alarm
(``trainer.guard_hold_alarm_s``) is a degradation of both services.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)


def hold_reason(held_since: datetime | None, now: datetime, alarm_s: float) -> str | None:
    """The degraded reason of a hold begun at ``held_since`` when it has lasted more than
    ``alarm_s`` at ``now``; None otherwise (not holding, or not for that long)."""
    if held_since is None:
        return None
    age = (now - held_since).total_seconds()
    if age <= alarm_s:
        return None
    return (f"model publication held by the quality guard since {held_since.isoformat()} "
            f"({age:.0f} s)")


def note_held_since(note: dict[str, Any] | None) -> datetime | None:
    """When the hold of a ``GUARD.json`` note began (None: no hold, no note, or a note
    without a usable start)."""
    if not note or not note.get("held"):
        return None
    since = note.get("held_since")
    if not isinstance(since, str):
        return None
    try:
        at = datetime.fromisoformat(since)
    except ValueError:
        log.warning("the guard's note has an unreadable held_since %r: the hold's age is "
                    "unknown", since)
        return None
    if at.tzinfo is None:
        log.warning("the guard's note has a held_since without a timezone (%r): ignored", since)
        return None
    return at
