"""The event schema: validation of incoming events and normalisation to the ``events`` wire format.

One set of rules serves the ingest API and the replay of NDJSON logs (docs/design.md, "Contracts");
its limits and predicates live in :mod:`stream.rules`, shared with the Flink parser.

Input: ``user_id``, ``item_id`` (1–128 characters), ``event_type`` (``features.event_weights``),
``ts`` (:func:`parse_ts`; defaults to the receive time), optional ``event_id`` (1–128; the
dedupe key, generated if absent), ``value`` (finite number) and ``context`` (a flat object of
at most :data:`MAX_CONTEXT_KEYS` entries). Any other field is rejected; types are strict.
Wire format (``events``, UTF-8 JSON, key ``user_id``): exactly ``event_id, user_id, item_id,
event_type, ts (epoch ms), value (float|null), context (obj|null)``. The full rules, with the
timestamp bands: docs/internals.md.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from feature_store.catalogue import AttributeProblem
from stream.errors import StreamError
from stream.rules import (
    EVENT_FIELDS,
    INT64_MAX,
    INT64_MIN,
    MAX_CONTEXT_KEY_LEN,
    MAX_CONTEXT_KEYS,
    MAX_CONTEXT_STR_LEN,
    MAX_FUTURE_MS,
    MAX_ID_LEN,
    MIN_TS_MS,
    REQUIRED_FIELDS,
    SECONDS_MS_BOUNDARY,
    WIRE_FIELDS,
    SchemaError,
    context_problem,
    ok_event_type,
    ok_id,
    ok_value,
    parse_ts,
)

__all__ = [
    "MAX_CONTEXT_KEYS",
    "MAX_CONTEXT_KEY_LEN",
    "MAX_CONTEXT_STR_LEN",
    "MAX_FUTURE_MS",
    "MAX_ID_LEN",
    "MIN_TS_MS",
    "SECONDS_MS_BOUNDARY",
    "WIRE_FIELDS",
    "EventIn",
    "EventNormalizer",
    "EventValidationError",
    "FieldError",
    "SchemaError",
    "decode_events",
    "field_errors",
    "loads_strict",
    "new_event_id",
    "parse_ts",
]


def _finite_float(value: object) -> float:
    if type(value) is not float or not math.isfinite(value):
        raise SchemaError("Input should be a finite number")
    return value


#: A JSON number with a fraction or exponent that is finite (ints are not coerced into it).
FiniteFloat = Annotated[float, PlainValidator(_finite_float), WithJsonSchema({"type": "number"})]

Id = Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_LEN)]
ContextKey = Annotated[StrictStr, Field(min_length=1, max_length=MAX_CONTEXT_KEY_LEN)]
ContextValue = Union[  # noqa: UP007 - pydantic's smart union keeps bool/int/float apart
    Annotated[StrictStr, Field(max_length=MAX_CONTEXT_STR_LEN)],
    StrictBool,
    Annotated[StrictInt, Field(ge=INT64_MIN, le=INT64_MAX)],
    FiniteFloat,
]


def context_ts(value: int | float | str | None, info: ValidationInfo) -> int | None:
    """A record's ``ts`` (:func:`parse_ts`) against the receive time the validation was given
    (``context={"now_ms": ...}``); None stays None (the receive time fills it in)."""
    if value is None:
        return None
    now_ms = (info.context or {}).get("now_ms")
    if now_ms is None:
        raise SchemaError("internal: no receive time given to the validator")
    return parse_ts(value, now_ms)


class EventIn(BaseModel):
    """One event as clients send it (the body of ``POST /events``, or one element of a batch)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    user_id: Id
    item_id: Id
    event_type: StrictStr
    ts: StrictInt | StrictFloat | StrictStr | None = Field(
        None, description="RFC 3339 with zone, or epoch seconds (<1e11) / milliseconds."
    )
    event_id: Id | None = Field(None, description="Dedupe key; generated if absent.")
    value: Annotated[StrictFloat, Field(allow_inf_nan=False)] | StrictInt | None = None
    context: (
        Annotated[dict[ContextKey, ContextValue], Field(max_length=MAX_CONTEXT_KEYS)] | None
    ) = None

    @field_validator("event_type")
    @classmethod
    def _known_type(cls, value: str, info: ValidationInfo) -> str:
        types = (info.context or {}).get("event_types")
        if types is not None and value not in types:
            raise SchemaError(f"unknown event_type {value!r}; expected one of {sorted(types)}")
        return value

    @field_validator("ts")
    @classmethod
    def _event_time(cls, value: int | float | str | None, info: ValidationInfo) -> int | None:
        return context_ts(value, info)

    @field_validator("value")
    @classmethod
    def _finite(cls, value: float | int | None) -> float | None:
        if value is None:
            return None
        if not ok_value(value):
            raise SchemaError("value is too large")
        return float(value)


_BATCH = TypeAdapter(list[EventIn])


@dataclass(frozen=True)
class FieldError:
    """One rule broken by one event of a batch."""

    index: int | None
    field: str
    error: str

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "field": self.field, "error": self.error}


class EventValidationError(StreamError, ValueError):
    """A batch broke the schema; ``errors`` lists every bad index and field."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__(f"{len(errors)} invalid field(s)")
        self.errors = errors


#: Message for a field whose value matched no branch of its type union.
_UNION_HINTS = {
    "ts": "ts must be an RFC 3339 string or epoch seconds/milliseconds",
    "value": "value must be a finite number",
    "context": "context values must be strings, 64-bit integers, finite numbers or booleans",
}


def field_errors(exc: ValidationError, record: str = "(event)") -> list[FieldError]:
    """One :class:`FieldError` per (record index, field), from pydantic's error list.

    The field is the top-level name, ``context.<key>`` inside the context, or the field an
    :class:`~feature_store.catalogue.AttributeProblem` names (``attributes.genres[1]``);
    pydantic's union-branch tags in the location are dropped, and a value that matched no
    branch of a union gets one plain message instead of one per branch. ``record`` names a
    problem of the whole record (e.g. not an object).
    """
    found: dict[tuple[int | None, str], list[str]] = {}
    for err in exc.errors(include_url=False, include_input=False):
        loc = list(err["loc"])
        index: int | None = None
        if loc and isinstance(loc[0], int):
            index = int(loc.pop(0))
        field = str(loc[0]) if loc else record
        if field == "context" and len(loc) > 1:
            field = f"context.{loc[1]}"
        message = err["msg"].removeprefix("Value error, ")
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, AttributeProblem):
            field, message = cause.field, cause.message
        found.setdefault((index, field), []).append(message)
    errors = []
    for (index, field), messages in found.items():
        if len(messages) > 1 and _no_branch_matched(messages):
            message = _UNION_HINTS.get(field.split(".")[0], messages[0])
        else:
            message = messages[0]
        errors.append(FieldError(index, field, message))
    return errors


def _no_branch_matched(messages: list[str]) -> bool:
    """Several "Input should be ..." type messages: a value that matched no union branch."""
    return all(m.startswith(("Input should be", "Value error, Input should be")) for m in messages)


def new_event_id() -> str:
    """A random 128-bit event id in hex (used when the client sends none)."""
    return os.urandom(16).hex()


def _fast_wire(
    obj: object, types: frozenset[str], now_ms: int, id_factory: Callable[[], str]
) -> dict[str, Any] | None:
    """The wire dict of a *valid* event, or None when any rule might be broken.

    A conservative fast path: it accepts only what :class:`EventIn` accepts and returns the
    same result; anything unusual returns None and goes through the pydantic model, which
    is the authority and produces the error messages (tests check both agree).
    """
    if (
        type(obj) is not dict
        or not REQUIRED_FIELDS.issubset(obj)
        or not EVENT_FIELDS.issuperset(obj)
    ):
        return None
    user_id = obj["user_id"]
    item_id = obj["item_id"]
    event_type = obj["event_type"]
    if not (ok_id(user_id) and ok_id(item_id) and ok_event_type(event_type, types)):
        return None
    ts = obj.get("ts")
    if ts is None:
        ts_ms = now_ms
    elif type(ts) is int and MIN_TS_MS <= ts <= now_ms + MAX_FUTURE_MS:
        ts_ms = ts
    elif type(ts) in (int, float, str):
        try:
            ts_ms = parse_ts(ts, now_ms)
        except SchemaError:
            return None
    else:
        return None
    value = obj.get("value")
    if not ok_value(value):
        return None
    if type(value) is int:
        value = float(value)
    context = obj.get("context")
    if context is not None and context_problem(context) is not None:
        return None
    event_id = obj.get("event_id")
    if event_id is None:
        event_id = id_factory()
    elif not ok_id(event_id):
        return None
    return {
        "event_id": event_id,
        "user_id": user_id,
        "item_id": item_id,
        "event_type": event_type,
        "ts": ts_ms,
        "value": value,
        "context": context,
    }


class EventNormalizer:
    """Validates batches of decoded JSON objects and turns them into wire-format dicts.

    ``clock_ms`` gives the receive time (default for a missing ``ts`` and the "future" bound);
    ``id_factory`` makes ids for events that carry none. Both are injected for tests.
    """

    def __init__(
        self,
        event_types: Collection[str],
        clock_ms: Callable[[], int],
        id_factory: Callable[[], str] = new_event_id,
    ) -> None:
        self.event_types = frozenset(event_types)
        self.clock_ms = clock_ms
        self.id_factory = id_factory

    def normalize(self, items: list[Any], now_ms: int | None = None) -> list[dict[str, Any]]:
        """Wire dicts for ``items``, or :class:`EventValidationError` naming every bad field."""
        now = self.clock_ms() if now_ms is None else now_ms
        types, make_id = self.event_types, self.id_factory
        out = []
        for obj in items:
            wire = _fast_wire(obj, types, now, make_id)
            if wire is None:
                break
            out.append(wire)
        else:
            return out
        return self.normalize_strict(items, now)

    def normalize_one(self, obj: Any, now_ms: int) -> dict[str, Any]:
        """The wire dict of one event (same rules as :meth:`normalize`)."""
        wire = _fast_wire(obj, self.event_types, now_ms, self.id_factory)
        if wire is None:
            [wire] = self.normalize_strict([obj], now_ms)
        return wire

    def normalize_strict(self, items: list[Any], now_ms: int) -> list[dict[str, Any]]:
        """Like :meth:`normalize`, always through the pydantic model (the reference rules)."""
        now = now_ms
        try:
            events = _BATCH.validate_python(
                items, context={"event_types": self.event_types, "now_ms": now}
            )
        except ValidationError as exc:
            raise EventValidationError(field_errors(exc)) from exc
        return [self._wire(e, now) for e in events]

    def _wire(self, event: EventIn, now_ms: int) -> dict[str, Any]:
        return {
            "event_id": event.event_id if event.event_id is not None else self.id_factory(),
            "user_id": event.user_id,
            "item_id": event.item_id,
            "event_type": event.event_type,
            "ts": event.ts if event.ts is not None else now_ms,
            "value": event.value,
            "context": event.context,
        }


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {dup!r}")
    return obj


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_strict(text: bytes | str) -> Any:
    """``json.loads`` that rejects duplicate keys (at any depth) and NaN/Infinity literals."""
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)


def decode_events(body: bytes, ndjson: bool, noun: str = "events") -> list[Any]:
    """Decoded events (or other records: ``noun``) of a request body: one JSON object, a
    JSON array, or NDJSON lines.

    Rejects (with :class:`EventValidationError`) bodies that are not UTF-8 JSON, objects with
    a duplicate key (at any depth), ``NaN``/``Infinity`` literals, and other top-level values.
    For NDJSON the index in an error is the 0-based index of the event (blank lines skipped).
    """
    if ndjson:
        items: list[Any] = []
        errors: list[FieldError] = []
        for line_no, line in enumerate(body.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append(loads_strict(line))
            except ValueError as exc:
                errors.append(FieldError(len(items), "(json)", f"line {line_no}: {exc}"))
                items.append(None)
        if errors:
            raise EventValidationError(errors)
        if not items:
            raise EventValidationError([FieldError(None, "(body)", f"no {noun} in the body")])
        return items
    try:
        doc = loads_strict(body)
    except ValueError as exc:
        raise EventValidationError([FieldError(None, "(json)", str(exc))]) from exc
    if isinstance(doc, dict):
        return [doc]
    if isinstance(doc, list):
        if not doc:
            raise EventValidationError([FieldError(None, "(body)", "empty array")])
        return doc
    raise EventValidationError(
        [FieldError(None, "(body)", "expected a JSON object, an array of objects, or NDJSON")]
    )
