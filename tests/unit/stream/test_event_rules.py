"""One table of events, three checkers, the same verdicts: the pydantic model, its fast path
and the Flink parser all apply the rules of ``stream.rules``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from stream.flink.parse import try_parse
from stream.rules import (
    EVENT_FIELDS,
    INT64_MAX,
    INT64_MIN,
    MAX_CONTEXT_KEY_LEN,
    MAX_CONTEXT_KEYS,
    MAX_CONTEXT_STR_LEN,
    MAX_EXACT_INT,
    MAX_FUTURE_MS,
    MAX_ID_LEN,
    MIN_TS_MS,
    WIRE_FIELDS,
)
from stream.schema import EventIn, EventNormalizer, EventValidationError, _fast_wire
from streamrec.settings import DEFAULT_EVENT_WEIGHTS

NOW_MS = int(datetime(2025, 6, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)
TYPES = frozenset(DEFAULT_EVENT_WEIGHTS)


def wire(**change: Any) -> dict[str, Any]:
    """A complete ``events`` record (what the parser reads) with ``change`` applied."""
    base: dict[str, Any] = {
        "event_id": "e1",
        "user_id": "u1",
        "item_id": "i1",
        "event_type": "click",
        "ts": NOW_MS - 1000,
        "value": None,
        "context": None,
    }
    base.update(change)
    return base


#: (label, record, valid). Every record is complete, so no receive-time default applies.
TABLE: list[tuple[str, dict[str, Any], bool]] = [
    ("minimal", wire(), True),
    ("full", wire(value=4.5, context={"page": "home", "pos": 3, "f": 0.5, "m": True}), True),
    ("int value", wire(value=4), True),
    ("largest exact int value", wire(value=MAX_EXACT_INT), True),
    ("negative zero", wire(value=-0.0), True),
    ("unicode ids", wire(user_id="用户-42", item_id="caf\u00e9", event_id="🙂" * MAX_ID_LEN), True),
    ("longest ids", wire(user_id="x" * MAX_ID_LEN, event_id="e" * MAX_ID_LEN), True),
    ("earliest ts", wire(ts=MIN_TS_MS), True),
    ("latest ts", wire(ts=NOW_MS + MAX_FUTURE_MS), True),
    ("empty context", wire(context={}), True),
    ("context limits", wire(context={
        **{f"k{i}": i for i in range(MAX_CONTEXT_KEYS - 3)},
        "k" * MAX_CONTEXT_KEY_LEN: "s" * MAX_CONTEXT_STR_LEN,
        "lo": INT64_MIN,
        "hi": INT64_MAX,
    }), True),
    ("empty context string", wire(context={"s": ""}), True),
    # ids
    ("empty user_id", wire(user_id=""), False),
    ("long item_id", wire(item_id="x" * (MAX_ID_LEN + 1)), False),
    ("long event_id", wire(event_id="e" * (MAX_ID_LEN + 1)), False),
    ("event_id of 256", wire(event_id="e" * 256), False),
    ("long emoji id", wire(user_id="🙂" * (MAX_ID_LEN + 1)), False),
    ("numeric user_id", wire(user_id=5), False),
    ("list item_id", wire(item_id=["a"]), False),
    ("null user_id", wire(user_id=None), False),
    ("lone surrogate id", wire(item_id="i\ud800"), False),
    ("numeric event_id", wire(event_id=7), False),
    # event type
    ("unknown event_type", wire(event_type="view"), False),
    ("event_type case", wire(event_type="Click"), False),
    ("list event_type", wire(event_type=["click"]), False),
    ("null event_type", wire(event_type=None), False),
    # ts
    ("ts before 1990", wire(ts=MIN_TS_MS - 1), False),
    ("ts past the future bound", wire(ts=NOW_MS + MAX_FUTURE_MS + 1), False),
    ("ts negative", wire(ts=-1), False),
    ("ts microseconds", wire(ts=NOW_MS * 1000), False),
    ("ts over 64 bits", wire(ts=2**70), False),
    ("ts boolean", wire(ts=True), False),
    ("ts not a time", wire(ts="yesterday"), False),
    ("ts without zone", wire(ts="2024-01-01T00:00:00"), False),
    # value
    ("value NaN", wire(value=float("nan")), False),
    ("value infinity", wire(value=float("inf")), False),
    ("value too large an int", wire(value=MAX_EXACT_INT + 1), False),
    ("value boolean", wire(value=True), False),
    ("value string", wire(value="4.5"), False),
    # context
    ("context list", wire(context=["a"]), False),
    ("context string", wire(context="page=home"), False),
    ("context nested", wire(context={"a": {"b": 1}}), False),
    ("context list value", wire(context={"a": [1]}), False),
    ("context null value", wire(context={"a": None}), False),
    ("context empty key", wire(context={"": 1}), False),
    ("context long key", wire(context={"k" * (MAX_CONTEXT_KEY_LEN + 1): 1}), False),
    ("context long string", wire(context={"s": "x" * (MAX_CONTEXT_STR_LEN + 1)}), False),
    ("context NaN", wire(context={"f": float("nan")}), False),
    ("context int over 64 bits", wire(context={"n": INT64_MAX + 1}), False),
    ("context int under 64 bits", wire(context={"n": INT64_MIN - 1}), False),
    ("context too many keys", wire(context={f"k{i}": i for i in range(MAX_CONTEXT_KEYS + 1)}),
     False),
    ("context surrogate key", wire(context={"k\udc00": 1}), False),
    ("context surrogate value", wire(context={"k": "v\udc00"}), False),
    # fields
    ("unknown field", {**wire(), "colour": "red"}, False),
]


def pydantic_ok(record: dict[str, Any]) -> bool:
    normalizer = EventNormalizer(TYPES, clock_ms=lambda: NOW_MS)
    try:
        normalizer.normalize_strict([record], NOW_MS)
    except EventValidationError:
        return False
    return True


def fast_ok(record: dict[str, Any]) -> bool:
    return _fast_wire(record, TYPES, NOW_MS, lambda: "gen") is not None


def parser_ok(record: dict[str, Any]) -> bool:
    return try_parse(json.dumps(record), TYPES, NOW_MS).event is not None


@pytest.mark.parametrize(("label", "record", "valid"), TABLE, ids=[t[0] for t in TABLE])
def test_every_checker_gives_the_same_verdict(
    label: str, record: dict[str, Any], valid: bool
) -> None:
    verdicts = {
        "pydantic": pydantic_ok(record),
        "fast path": fast_ok(record),
        "flink parser": parser_ok(record),
    }
    assert verdicts == dict.fromkeys(verdicts, valid), label


def test_the_three_agree_on_the_fields() -> None:
    assert set(EventIn.model_fields) == EVENT_FIELDS == set(WIRE_FIELDS)


#: Input forms only ingest reads (it converts or fills them in); the parser sees the result.
INPUT_ONLY: list[dict[str, Any]] = [
    {"user_id": "u", "item_id": "i", "event_type": "click"},  # ts and event_id defaulted
    {"user_id": "u", "item_id": "i", "event_type": "like", "ts": 1_700_000_000},
    {"user_id": "u", "item_id": "i", "event_type": "like", "ts": 1_700_000_000.25},
    {"user_id": "u", "item_id": "i", "event_type": "rating", "ts": "2024-05-01T12:00:00Z",
     "value": 3},
]


@pytest.mark.parametrize("event", INPUT_ONLY)
def test_the_parser_accepts_what_ingest_writes(event: dict[str, Any]) -> None:
    normalizer = EventNormalizer(TYPES, clock_ms=lambda: NOW_MS)
    [record] = normalizer.normalize([event])
    parsed = try_parse(json.dumps(record), TYPES, NOW_MS)
    assert parsed.event is not None, parsed.reason
    assert parsed.event.ts_ms == record["ts"] and parsed.event.value == record["value"]


def test_the_parser_requires_what_ingest_fills_in() -> None:
    for missing in ("ts", "event_id"):
        record = {k: v for k, v in wire().items() if k != missing}
        assert pydantic_ok(record) and fast_ok(record)
        assert try_parse(json.dumps(record), TYPES, NOW_MS).reason is not None
