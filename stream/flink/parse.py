"""Parse ``events`` records (wire format in docs/design.md / stream.schema) for the feature job.

Pure: bytes or str in, a :class:`feature_store.features.Event` or a :class:`BadEvent` (the
reason it goes to ``events.dlq``) out. Ingest and replay normalise events to exactly this
shape, so anything else is a producer bug and is reported, never guessed at. The rules are
those of ingest (:mod:`stream.rules`), with deliberate differences because this reads the
wire format, not client input: ``ts`` must be integer epoch milliseconds and ``ts`` and
``event_id`` are required; the future bound applies to ``now_ms`` when given; JSON is read
as ``json`` reads it (a ``NaN`` literal then fails the ``value`` or ``context`` rule; of a
duplicate key the last wins — ingest refuses both, and ingest and replay never write either).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson

from feature_store.features import Event
from stream.errors import StreamError
from stream.rules import (
    EVENT_FIELDS,
    MAX_ID_LEN,
    context_problem,
    ok_event_type,
    ok_id,
    ok_value,
    ts_range_problem,
)


class BadEvent(StreamError, ValueError):
    """A record that is not a valid event; ``str(exc)`` is the DLQ reason."""


@dataclass(frozen=True, slots=True)
class Parsed:
    event: Event | None
    reason: str | None


def _id(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    if not ok_id(value):
        raise BadEvent(f"{name}: expected a string of 1..{MAX_ID_LEN} characters (valid Unicode)")
    return value  # type: ignore[return-value]


_SLOW = object()
#: 19 digits in a row: a number orjson may read differently from ``json`` (an integer past
#: 64 bits becomes a float there).
_LONG_NUMBER = re.compile(r"[0-9]{19}")
_LONG_NUMBER_B = re.compile(rb"[0-9]{19}")


def _fast_loads(raw: bytes | str) -> Any:
    """``json.loads(raw)`` by orjson (~2x cheaper) where both read the same document;
    :data:`_SLOW` where they may not: orjson refuses some documents ``json`` reads (1e400,
    NaN, lone surrogates, UTF-16 bytes), words its errors differently, and turns integers
    past 64 bits into floats. ``json`` decides those, as it always did."""
    long_number = (
        _LONG_NUMBER_B.search(raw) if isinstance(raw, bytes) else _LONG_NUMBER.search(raw)
    )
    if long_number is not None:
        return _SLOW
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _SLOW


def parse_event(
    raw: bytes | str, event_types: Collection[str], now_ms: int | None = None
) -> Event:
    """The event in ``raw``; raises :class:`BadEvent` naming the first problem.

    ``now_ms`` (the processing time, injected) bounds ``ts`` from above as ingest's receive
    time does; without it only the lower bound applies.
    """
    data = _fast_loads(raw)
    if data is _SLOW:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadEvent(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadEvent("not a JSON object")
    unknown = sorted(set(data) - EVENT_FIELDS)
    if unknown:
        raise BadEvent(f"unknown field: {unknown[0]}")
    event_type = data.get("event_type")
    if not ok_event_type(event_type, event_types):
        raise BadEvent(f"event_type: unknown {event_type!r}")
    ts = data.get("ts")
    if type(ts) is not int:
        raise BadEvent("ts: expected epoch milliseconds (an integer)")
    problem = ts_range_problem(ts, now_ms)
    if problem is not None:
        raise BadEvent(f"ts: {problem}")
    value = data.get("value")
    if not ok_value(value):
        raise BadEvent("value: expected a finite number or null")
    context = data.get("context")
    problem = context_problem(context)
    if problem is not None:
        raise BadEvent(f"context: {problem}")
    return Event(
        event_id=_id(data, "event_id"),
        user_id=_id(data, "user_id"),
        item_id=_id(data, "item_id"),
        event_type=event_type,  # type: ignore[arg-type]  # checked by ok_event_type
        ts_ms=ts,
        value=None if value is None else float(value),
        context=context,
    )


def try_parse(
    raw: bytes | str, event_types: Collection[str], now_ms: int | None = None
) -> Parsed:
    try:
        return Parsed(parse_event(raw, event_types, now_ms), None)
    except BadEvent as exc:
        return Parsed(None, str(exc))
