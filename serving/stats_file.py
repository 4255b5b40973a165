"""The dashboard collector's output: one JSON snapshot in the run folder, replaced whole.

The stack's one collector (``streamrec dashboard-collector``) writes the body of ``GET /stats``
after every tick with :func:`write_stats` (a temp file renamed over the old one, so a reader
never sees half a file); the serving workers answer ``GET /stats`` with :func:`read_stats`.
Without a fresh snapshot (no collector, or one that stopped writing) ``/stats`` still answers
200, with every component marked down and the reason, so the page says what is wrong.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from streamrec.settings import Settings

#: Age of the snapshot beyond which the collector counts as stopped (it writes every 2 s).
STALE_AFTER_S = 15.0

#: The sources the page shows (``serving.stats``, imported inside :func:`empty_snapshot`: the
#: stack runner imports this module for :func:`stats_path` alone).
_COMPONENTS = ("serving", "ingest", "kafka", "trainer")


def stats_path(settings: Settings) -> Path:
    """Where the stack's collector writes its snapshot: ``<run_dir>/dashboard/stats.json``."""
    return settings.stack.run_dir / "dashboard" / "stats.json"


def encode(snapshot: dict[str, Any]) -> bytes:
    """A snapshot as the strict JSON the page gets (no NaN: the collector writes ``null``)."""
    return json.dumps(snapshot, allow_nan=False, separators=(",", ":")).encode()


def write_stats(path: Path, snapshot: dict[str, Any]) -> None:
    """Replace ``path`` with ``snapshot`` atomically. Not fsynced: the next tick rewrites it,
    and a crash loses only a picture of the last minutes."""
    body = encode(snapshot)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_bytes(body)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_stats(path: Path, now_s: float, max_age_s: float = STALE_AFTER_S) -> bytes:
    """The JSON body of ``GET /stats`` at ``now_s``: the snapshot in ``path`` as written; one
    older than ``max_age_s`` with its components marked down (its series kept); without a
    snapshot, an empty one with every component down."""
    try:
        with path.open("rb") as f:
            written_s = os.fstat(f.fileno()).st_mtime
            body = f.read()
    except FileNotFoundError:
        return encode(empty_snapshot(
            now_s, "no dashboard collector (`streamrec dashboard-collector`) is running"))
    age = now_s - written_s
    if age <= max_age_s:
        return body
    try:
        snapshot = json.loads(body)
    except ValueError:  # not one of ours: say so rather than pass it on
        return encode(empty_snapshot(now_s, f"unreadable dashboard snapshot at {path}"))
    return encode(marked_down(snapshot, f"the dashboard collector stopped {age:.0f} s ago"))


def empty_snapshot(now_s: float, reason: str) -> dict[str, Any]:
    """A snapshot with no points and every component down for ``reason``."""
    from serving.stats import INTERVAL_S, RATE_WINDOW_S, SERIES, TOP_K, WINDOW_S

    now_ms = int(now_s * 1000)
    return {
        "now_ms": now_ms,
        "interval_s": INTERVAL_S,
        "window_s": WINDOW_S,
        "rate_window_s": RATE_WINDOW_S,
        "k": TOP_K,
        "components": {name: _down(reason, now_ms) for name in _COMPONENTS},
        "model": {"version": None, "age_s": None},
        "latest": None,
        "cluster": None,
        "series": {name: [] for name in ("t_ms", *SERIES)},
    }


def marked_down(snapshot: dict[str, Any], reason: str) -> dict[str, Any]:
    """``snapshot`` with each of its components down for ``reason`` (a stale picture)."""
    components = snapshot.get("components")
    if isinstance(components, dict):
        snapshot["components"] = {
            name: {**(state if isinstance(state, dict) else {}), "up": False, "reason": reason}
            for name, state in components.items()}
    return snapshot


def _down(reason: str, now_ms: int) -> dict[str, Any]:
    return {"up": False, "reason": reason, "checked_ms": now_ms, "since_ms": None,
            "last_up_ms": None}

