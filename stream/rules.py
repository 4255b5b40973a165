"""The rules of one event, defined once: limits, the timestamp rule and small predicates.

Three places check events and all take their rules from here: the pydantic model
:class:`stream.schema.EventIn` (the reference, with the error messages), its fast path
(``stream.schema._fast_wire``) and the Flink parser of ``events`` records
(:mod:`stream.flink.parse`), which also sees replayed and foreign records. The rules
themselves are described in :mod:`stream.schema`. Pure Python, no pydantic: the Flink
workers import this module.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from datetime import datetime

from stream.errors import StreamError

MAX_ID_LEN = 128
MAX_CONTEXT_KEYS = 16
MAX_CONTEXT_KEY_LEN = 64
MAX_CONTEXT_STR_LEN = 256
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: The largest integer ``value`` (in magnitude): beyond it a float no longer holds it exactly.
MAX_EXACT_INT = 2**53

#: 1990-01-01T00:00:00Z in epoch milliseconds: the earliest accepted event time.
MIN_TS_MS = 631_152_000_000
#: How far beyond the receive time an event time may lie.
MAX_FUTURE_MS = 86_400_000
#: Epoch numbers below this magnitude are seconds, at or above it milliseconds.
SECONDS_MS_BOUNDARY = 100_000_000_000

#: The keys of an ``events`` record, in order; also every field an input event may carry.
WIRE_FIELDS = ("event_id", "user_id", "item_id", "event_type", "ts", "value", "context")
EVENT_FIELDS = frozenset(WIRE_FIELDS)
#: What an input event must carry; ingest fills in ``ts`` and ``event_id`` when absent.
REQUIRED_FIELDS = frozenset(("user_id", "item_id", "event_type"))

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)
#: Lone surrogates, and U+FFFD: what a decoder leaves for bytes that were not UTF-8 (the
#: feature job's Kafka source decodes records so), which would otherwise pass as altered ids.
_SURROGATE = re.compile("[\ud800-\udfff\ufffd]")


class SchemaError(StreamError, ValueError):
    """A value broke a schema rule; the message names the rule."""


def is_text(value: object) -> bool:
    """A ``str`` that is valid Unicode: no lone surrogates (JSON can carry them, UTF-8 not),
    and no U+FFFD replacement character (the trace of bytes that were not UTF-8)."""
    return type(value) is str and (value.isascii() or _SURROGATE.search(value) is None)


def ok_id(value: object) -> bool:
    """``user_id``, ``item_id``, ``event_id``: text of 1..:data:`MAX_ID_LEN` characters."""
    return type(value) is str and 0 < len(value) <= MAX_ID_LEN and is_text(value)


def ok_event_type(value: object, types: Collection[str]) -> bool:
    """``event_type``: one of the configured types."""
    return type(value) is str and value in types


def ok_value(value: object) -> bool:
    """``value``: null, a finite float, or an integer of magnitude <= :data:`MAX_EXACT_INT`
    (booleans are not numbers)."""
    kind = type(value)
    if kind is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    if kind is int:
        return abs(value) <= MAX_EXACT_INT  # type: ignore[arg-type]
    return value is None


def context_problem(ctx: object) -> str | None:
    """Why ``ctx`` is not a valid ``context`` (a flat object, see :mod:`stream.schema`), or
    None when it is (null included)."""
    if ctx is None:
        return None
    if type(ctx) is not dict:
        return "expected an object or null"
    if len(ctx) > MAX_CONTEXT_KEYS:
        return f"more than {MAX_CONTEXT_KEYS} entries"
    for key, val in ctx.items():
        if not (type(key) is str and 0 < len(key) <= MAX_CONTEXT_KEY_LEN and is_text(key)):
            return f"keys must be text of 1..{MAX_CONTEXT_KEY_LEN} characters"
        kind = type(val)
        if kind is str:
            if len(val) > MAX_CONTEXT_STR_LEN or not is_text(val):
                return f"{key}: strings must be text of at most {MAX_CONTEXT_STR_LEN} characters"
        elif kind is int:
            if not INT64_MIN <= val <= INT64_MAX:
                return f"{key}: integers must fit in 64 bits"
        elif kind is float:
            if not math.isfinite(val):
                return f"{key}: numbers must be finite"
        elif kind is not bool:
            return f"{key}: values must be strings, 64-bit integers, finite numbers or booleans"
    return None


def ts_range_problem(ts_ms: int, now_ms: int | None) -> str | None:
    """Why event time ``ts_ms`` is out of range, or None: it must lie in
    [:data:`MIN_TS_MS`, ``now_ms`` + :data:`MAX_FUTURE_MS`] (no upper bound without ``now_ms``)."""
    if ts_ms < MIN_TS_MS:
        return "before 1990-01-01 (or not epoch seconds/milliseconds)"
    if now_ms is not None and ts_ms > now_ms + MAX_FUTURE_MS:
        return "more than one day in the future"
    return None


def parse_ts(raw: int | float | str, now_ms: int) -> int:
    """Event time in epoch milliseconds from an RFC 3339 string or epoch seconds/milliseconds.

    ``now_ms`` is the receive time (injected); see :mod:`stream.schema` for the rule.
    """
    if isinstance(raw, bool):
        raise SchemaError("ts must be an RFC 3339 string or epoch seconds/milliseconds")
    if isinstance(raw, str):
        if not _RFC3339.match(raw):
            raise SchemaError(
                "ts string must be RFC 3339 with a time zone, e.g. 2024-05-01T12:00:00Z"
            )
        text = raw.replace("z", "Z").replace("t", "T")
        frac = re.search(r"\.(\d+)", text)
        if frac and len(frac.group(1)) > 6:  # fromisoformat takes at most microseconds
            text = text.replace(frac.group(0), "." + frac.group(1)[:6])
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError as exc:
            raise SchemaError(f"ts is not a valid date/time: {exc}") from exc
        if parsed.tzinfo is None:  # the regex requires an offset; kept as a guard
            raise SchemaError("ts has no time zone (ambiguous)")
        ts_ms = int(parsed.timestamp()) * 1000 + parsed.microsecond // 1000
    elif isinstance(raw, int | float):
        if isinstance(raw, float) and not math.isfinite(raw):
            raise SchemaError("ts must be finite")
        if abs(raw) < SECONDS_MS_BOUNDARY:
            ts_ms = round(raw * 1000)
        else:
            if isinstance(raw, float) and not raw.is_integer():
                raise SchemaError("ts in epoch milliseconds must be a whole number")
            ts_ms = int(raw)
    else:
        raise SchemaError("ts must be an RFC 3339 string or epoch seconds/milliseconds")
    problem = ts_range_problem(ts_ms, now_ms)
    if problem is not None:
        raise SchemaError(f"ts is {problem}")
    return ts_ms
