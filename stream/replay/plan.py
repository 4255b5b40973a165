"""A replay's plan: every row of every file read (:mod:`stream.replay.formats`), checked
against the ingest schema, filtered, deduplicated and ordered by (event time, file order,
line); rejected rows are counted in the :class:`ReplayReport`. Sending is
:mod:`stream.replay.runner`.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import orjson

from stream.errors import StreamError
from stream.replay.formats import detect_format, read_rows
from stream.schema import EventNormalizer, EventValidationError, parse_ts

P = ParamSpec("P")
R = TypeVar("R")

MAX_SHOWN = 10


class ReplayError(StreamError):
    """Replay stopped: a malformed row under ``strict``, a bad state file, or Kafka failed."""


@dataclass(frozen=True)
class ReplaySource:
    path: Path
    fmt: str

    @classmethod
    def of(cls, path: Path, fmt: str | None = None) -> ReplaySource:
        if not path.is_file():
            raise ReplayError(f"{path}: no such file")
        return cls(path, fmt or detect_format(path))


@dataclass(frozen=True)
class ReplayOptions:
    speed: float | None = None  # None: as fast as possible
    limit: int | None = None
    since_ms: int | None = None  # inclusive
    until_ms: int | None = None  # exclusive
    strict: bool = False
    like_threshold: float = 4.0
    mapping: dict[str, str] = field(default_factory=dict)
    event_type: str | None = None
    checkpoint_every: int = 10_000
    checkpoint_interval_s: float = 1.0

    def plan_fields(self) -> dict[str, Any]:
        """What defines the ordered plan (speed and checkpointing do not)."""
        return {
            "limit": self.limit,
            "since_ms": self.since_ms,
            "until_ms": self.until_ms,
            "like_threshold": self.like_threshold,
            "mapping": self.mapping,
            "event_type": self.event_type,
        }


@dataclass
class ReplayReport:
    """Counts of one replay run; :meth:`summary` is the closing line, :meth:`as_dict` the JSON."""

    sent: int = 0
    planned: int = 0
    filtered: int = 0  # outside --since/--until or beyond --limit
    resumed: int = 0  # acknowledged by an earlier run
    already_in_kafka: int = 0  # found in the topic after the last checkpoint
    already_replayed: int = 0  # delivered by an earlier replay (the ledger holds the id)
    rejected: dict[str, int] = field(default_factory=dict)
    malformed: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    first_ts: int | None = None
    last_ts: int | None = None
    topic: str = ""

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def skipped(self) -> int:
        return self.filtered + self.resumed + self.already_in_kafka + self.already_replayed

    def reject(self, file: str, line_no: int, reason: str, detail: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if len(self.malformed) < MAX_SHOWN:
            self.malformed.append({"file": file, "line": line_no, "reason": detail})

    def summary(self) -> str:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.rejected.items())) or "none"
        rate = self.sent / self.seconds if self.seconds > 0 else 0.0
        return (
            f"replay: sent {self.sent}, skipped {self.skipped} (filtered {self.filtered}, "
            f"resumed {self.resumed + self.already_in_kafka}, already replayed "
            f"{self.already_replayed}), rejected {self.rejected_total} "
            f"({reasons}), {self.seconds:.2f} s, {rate:,.0f} events/s"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "planned": self.planned,
            "skipped": self.skipped,
            "filtered": self.filtered,
            "resumed": self.resumed,
            "already_in_kafka": self.already_in_kafka,
            "already_replayed": self.already_replayed,
            "rejected": self.rejected_total,
            "rejected_by_reason": dict(sorted(self.rejected.items())),
            "malformed_first": self.malformed,
            "seconds": round(self.seconds, 3),
            "events_per_s": round(self.sent / self.seconds, 1) if self.seconds > 0 else 0.0,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "topic": self.topic,
        }


#: (ts_ms, file index, line number, key, value): sorting the tuples gives the replay order.
PlanRow = tuple[int, int, int, bytes, bytes]


def _collector_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """Run ``fn`` with the cyclic garbage collector paused (restored after)."""

    @functools.wraps(fn)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    return paused


@_collector_paused
def build_plan(
    sources: Sequence[ReplaySource],
    options: ReplayOptions,
    event_types: Sequence[str],
    now_ms: int,
    report: ReplayReport,
) -> list[PlanRow]:
    """Read, validate, filter and order every row; malformed rows go to ``report``.

    The cyclic collector is paused meanwhile: the plan's rows are acyclic tuples, and
    collecting while millions of them pile up (each full collection walking all of them)
    cost a third of the plan's CPU at 1M rows."""
    normalizer = EventNormalizer(event_types, clock_ms=lambda: now_ms)
    normalize = normalizer.normalize_one

    def dumps(obj: Any) -> bytes:
        # orjson hands back bytes with a 4 KiB allocation whatever their length; a plan
        # keeps every row, so each is copied to its own size (a 1M-row plan: 8.3 GB of RSS -> 0.8 GB)
        return memoryview(orjson.dumps(obj)).tobytes()

    rows: list[PlanRow] = []
    identity: list[str | bytes] = []
    for file_index, source in enumerate(sources):
        name = source.path.name
        for raw in read_rows(
            source.path, source.fmt, options.mapping, options.like_threshold, options.event_type
        ):
            if raw.event is None:
                _reject(report, options, name, raw.line_no, f"parse:{raw.kind}",
                        raw.error or "unreadable")
                continue
            if raw.event.get("ts") is None:
                _reject(report, options, name, raw.line_no, "invalid:ts", "ts: missing")
                continue
            try:
                wire = normalize(raw.event, now_ms)
            except EventValidationError as exc:
                first = exc.errors[0]
                detail = "; ".join(f"{e.field}: {e.error}" for e in exc.errors)
                _reject(report, options, name, raw.line_no, f"invalid:{first.field}", detail)
                continue
            ts = wire["ts"]
            if (options.since_ms is not None and ts < options.since_ms) or (
                options.until_ms is not None and ts >= options.until_ms
            ):
                report.filtered += 1
                continue
            rows.append(
                (
                    ts,
                    file_index,
                    raw.line_no,
                    wire["user_id"].encode(),
                    dumps(wire),
                )
            )
            # a row's identity: its own event id, else its content (the derived id differs
            # per line, so a line logged twice would pass as two events)
            identity.append(wire["event_id"] if raw.own_id else dumps(
                (wire["user_id"], wire["item_id"], wire["event_type"], ts, wire.get("value"),
                 wire.get("context"))))
    rows = _drop_duplicates(rows, identity, sources, options, report)
    rows.sort()
    if options.limit is not None and len(rows) > options.limit:
        report.filtered += len(rows) - options.limit
        del rows[options.limit :]
    report.planned = len(rows)
    if rows:
        report.first_ts, report.last_ts = rows[0][0], rows[-1][0]
    return rows


def _drop_duplicates(
    rows: list[PlanRow],
    identity: list[str | bytes],
    sources: Sequence[ReplaySource],
    options: ReplayOptions,
    report: ReplayReport,
) -> list[PlanRow]:
    """``rows`` without the repeats of an earlier row's identity (in file order), each
    rejected as ``duplicate`` (8 bytes per row: the identities are hashed)."""
    if not rows:
        return rows
    import numpy as np

    from streamrec.idset import id_hashes

    hashes = id_hashes([i if isinstance(i, str) else i.decode() for i in identity])
    _, first = np.unique(hashes, return_index=True)
    if len(first) == len(rows):
        return rows
    keep = np.zeros(len(rows), dtype=bool)
    keep[first] = True
    for i in np.flatnonzero(~keep).tolist():
        _, file_index, line_no, _, _ = rows[i]
        _reject(report, options, sources[file_index].path.name, line_no, "duplicate",
                "the same event as an earlier row (same event_id, or same content)")
    return [row for row, k in zip(rows, keep.tolist(), strict=True) if k]


def _reject(
    report: ReplayReport, options: ReplayOptions, file: str, line_no: int, reason: str, detail: str
) -> None:
    report.reject(file, line_no, reason, detail)
    if options.strict:
        raise ReplayError(f"{file}:{line_no}: {detail} (--strict)")


def plan_id(sources: Sequence[ReplaySource], options: ReplayOptions, topic: str) -> str:
    """Identity of a plan for the resume state: files (name, size, format), options, topic."""
    ident = {
        "files": [[s.path.name, s.path.stat().st_size, s.fmt] for s in sources],
        "options": options.plan_fields(),
        "topic": topic,
    }
    return hashlib.blake2b(json.dumps(ident, sort_keys=True).encode(), digest_size=12).hexdigest()


def parse_time_arg(text: str | None, now_ms: int) -> int | None:
    """``--since``/``--until``: RFC 3339 or epoch seconds/milliseconds (the schema rule)."""
    if text is None:
        return None
    raw: int | float | str = text
    if text.strip().lstrip("-").replace(".", "", 1).isdigit():
        raw = float(text) if "." in text else int(text)
    return parse_ts(raw, now_ms)
