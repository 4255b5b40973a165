"""Event schema: validation rules, timestamp rule, JSON decoding, fast path == reference path."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from stream.schema import (
    MAX_CONTEXT_KEYS,
    MIN_TS_MS,
    WIRE_FIELDS,
    EventNormalizer,
    EventValidationError,
    SchemaError,
    decode_events,
    parse_ts,
)
from streamrec.settings import DEFAULT_EVENT_WEIGHTS

NOW_MS = int(datetime(2025, 6, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)
DAY_MS = 86_400_000


def make_normalizer() -> EventNormalizer:
    counter = itertools.count()
    return EventNormalizer(
        DEFAULT_EVENT_WEIGHTS, clock_ms=lambda: NOW_MS, id_factory=lambda: f"gen-{next(counter)}"
    )


def event(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"user_id": "u1", "item_id": "i1", "event_type": "click"}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


def errors_of(items: list[Any]) -> list[tuple[int | None, str]]:
    with pytest.raises(EventValidationError) as info:
        make_normalizer().normalize(items)
    return [(e.index, e.field) for e in info.value.errors]


# ---- accepted events and the wire format -------------------------------------------------


def test_minimal_event_gets_receive_time_and_generated_id() -> None:
    [wire] = make_normalizer().normalize([event()])
    assert tuple(wire) == WIRE_FIELDS
    assert wire == {
        "event_id": "gen-0",
        "user_id": "u1",
        "item_id": "i1",
        "event_type": "click",
        "ts": NOW_MS,
        "value": None,
        "context": None,
    }


def test_full_event_is_kept_field_by_field() -> None:
    ctx = {"page": "home", "pos": 3, "score": 0.5, "mobile": True}
    [wire] = make_normalizer().normalize(
        [event(event_id="e-1", ts="2024-05-01T12:00:00.250+02:00", value=4, context=ctx)]
    )
    assert wire["event_id"] == "e-1"
    assert wire["ts"] == int(datetime(2024, 5, 1, 10, 0, 0, 250_000, tzinfo=UTC).timestamp() * 1000)
    assert wire["value"] == 4.0 and isinstance(wire["value"], float)
    assert wire["context"] == ctx


@pytest.mark.parametrize("uid", ["ü", "用户-42", "🙂" * 128, "x" * 128, " spaced id "])
def test_unicode_and_boundary_length_ids_are_accepted(uid: str) -> None:
    [wire] = make_normalizer().normalize([event(user_id=uid, item_id=uid, event_id=uid)])
    assert wire["user_id"] == wire["item_id"] == wire["event_id"] == uid


@pytest.mark.parametrize("field", ["user_id", "item_id", "event_id"])
@pytest.mark.parametrize("bad", ["", "x" * 129, "🙂" * 129, 5, ["a"]])
def test_bad_ids_are_rejected(field: str, bad: Any) -> None:
    assert errors_of([event(**{field: bad})]) == [(0, field)]


@pytest.mark.parametrize("field", ["user_id", "item_id"])
def test_null_ids_are_rejected(field: str) -> None:
    assert errors_of([event(**{field: None})]) == [(0, field)]


@pytest.mark.parametrize("missing", ["user_id", "item_id", "event_type"])
def test_required_fields(missing: str) -> None:
    assert errors_of([event(**{missing: _DROP})]) == [(0, missing)]


def test_unknown_field_and_unknown_event_type_are_rejected() -> None:
    assert errors_of([event(colour="red")]) == [(0, "colour")]
    assert errors_of([event(event_type="view")]) == [(0, "event_type")]
    assert errors_of([event(event_type="Click")]) == [(0, "event_type")]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), True, "4.5", 2**60])
def test_bad_values_are_rejected(value: Any) -> None:
    assert errors_of([event(value=value)]) == [(0, "value")]


@pytest.mark.parametrize(
    "ctx",
    [
        {"nested": {"a": 1}},
        {"list": [1]},
        {"": 1},
        {"k" * 65: 1},
        {"s": "x" * 257},
        {"f": float("nan")},
        {"big": 2**63},
        {f"k{i}": i for i in range(MAX_CONTEXT_KEYS + 1)},
        ["not", "a", "dict"],
    ],
)
def test_bad_contexts_are_rejected(ctx: Any) -> None:
    errs = errors_of([event(context=ctx)])
    assert errs and all(index == 0 and field.startswith("context") for index, field in errs)


def test_every_bad_index_and_field_is_listed() -> None:
    items = [event(), event(user_id="", ts="yesterday"), event(), "not an object", event(x=1)]
    assert errors_of(items) == [(1, "user_id"), (1, "ts"), (3, "(event)"), (4, "x")]


# ---- timestamps --------------------------------------------------------------------------


def test_epoch_seconds_and_milliseconds_are_told_apart() -> None:
    ms = int(datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp() * 1000)
    assert parse_ts(ms // 1000, NOW_MS) == ms
    assert parse_ts(ms, NOW_MS) == ms
    assert parse_ts(ms / 1000 + 0.25, NOW_MS) == ms + 250
    assert parse_ts(float(ms), NOW_MS) == ms


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2020-01-02T03:04:05Z", datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2020-01-02t03:04:05z", datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2020-01-02 05:04:05+02:00", datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2020-01-02T03:04:05.123456789Z", datetime(2020, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)),
    ],
)
def test_rfc3339_strings(text: str, expected: datetime) -> None:
    assert parse_ts(text, NOW_MS) == int(expected.timestamp() * 1000)


@pytest.mark.parametrize(
    "bad",
    [
        "2020-01-02T03:04:05",  # no zone: ambiguous
        "2020-01-02",  # no time
        "1577934245",  # digits in a string
        "2020-13-02T03:04:05Z",  # no such month
        "02/01/2020 03:04",
        "",
        True,
        float("nan"),
        50_000_000_000,  # 5e10: seconds -> year 3554
        1_700_000_000_000_000,  # microseconds
        MIN_TS_MS - 1,  # before 1990
        100_000_000,  # 1973 in seconds
        -1,
        1_700_000_000_000.5,  # fractional milliseconds
    ],
)
def test_bad_and_ambiguous_timestamps_are_rejected(bad: Any) -> None:
    with pytest.raises(SchemaError):
        parse_ts(bad, NOW_MS)
    assert errors_of([event(ts=bad)]) == [(0, "ts")]


def test_future_bound_is_one_day_after_receive_time() -> None:
    assert parse_ts(NOW_MS + DAY_MS, NOW_MS) == NOW_MS + DAY_MS
    with pytest.raises(SchemaError, match="future"):
        parse_ts(NOW_MS + DAY_MS + 1, NOW_MS)
    assert errors_of([event(ts=NOW_MS + DAY_MS + 1)]) == [(0, "ts")]


# ---- fast path and reference path agree --------------------------------------------------

AGREEMENT_CASES: list[dict[str, Any]] = [
    event(),
    event(ts=NOW_MS - 5, value=1.5, event_id="abc", context={"a": "b", "n": 1, "t": False}),
    event(ts=1_600_000_000, value=3),
    event(ts=1_600_000_000.5),
    event(ts="2021-03-04T05:06:07+01:00", value=-0.0),
    event(ts=MIN_TS_MS),
    event(ts=NOW_MS + DAY_MS),
    event(context={}),
    event(value=2**53),
]


@pytest.mark.parametrize("case", AGREEMENT_CASES)
def test_fast_path_matches_pydantic_model(case: dict[str, Any]) -> None:
    fast = make_normalizer().normalize([case])
    strict = make_normalizer().normalize_strict([case], NOW_MS)
    assert fast == strict
    assert make_normalizer().normalize_one(case, NOW_MS) == strict[0]
    assert [type(v) for v in fast[0].values()] == [type(v) for v in strict[0].values()]


# ---- decoding request bodies -------------------------------------------------------------


def test_decode_object_array_and_ndjson() -> None:
    one = event()
    assert decode_events(json.dumps(one).encode(), ndjson=False) == [one]
    assert decode_events(json.dumps([one, one]).encode(), ndjson=False) == [one, one]
    body = (json.dumps(one) + "\n\n" + json.dumps(one) + "\n").encode()
    assert decode_events(body, ndjson=True) == [one, one]


@pytest.mark.parametrize(
    "body",
    [
        b'{"user_id": "a", "user_id": "b", "item_id": "i", "event_type": "click"}',
        b'[{"user_id": "a", "item_id": "i", "event_type": "click", "context": {"k": 1, "k": 2}}]',
        b'{"user_id": "a", "item_id": "i", "event_type": "click", "value": NaN}',
        b'{"user_id": "a", "item_id": "i", "event_type": "click", "value": Infinity}',
        b"[]",
        b"42",
        b'"text"',
        b"{not json",
        b"\xff\xfe",
        b"",
    ],
)
def test_decode_rejects_bad_bodies(body: bytes) -> None:
    with pytest.raises(EventValidationError) as info:
        decode_events(body, ndjson=False)
    assert info.value.errors and info.value.errors[0].field in {"(json)", "(body)"}


def test_ndjson_errors_name_the_event_index_and_line() -> None:
    good = json.dumps(event())
    body = f'{good}\n{{"user_id": 1, "user_id": 2}}\n{good}\nnope\n'.encode()
    with pytest.raises(EventValidationError) as info:
        decode_events(body, ndjson=True)
    assert [(e.index, e.field) for e in info.value.errors] == [(1, "(json)"), (3, "(json)")]
    assert "line 2" in info.value.errors[0].error and "duplicate" in info.value.errors[0].error
