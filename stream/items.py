"""The item record: catalogue entries from the edge (``POST /items``, catalogue files) to the
``items`` topic and through the feature job into the online store.

Input (:class:`ItemIn`): ``item_id`` (1–128 characters, the rule of events), ``attributes``
(an object checked against the feature spec's item slots by
:func:`feature_store.catalogue.check_attributes`; default ``{}``), optional ``ts`` (the rule of
events' ``ts``, :func:`stream.rules.parse_ts`; defaults to the receive time) and optional
``deleted`` (a bool). Any other field is rejected; types are strict. An upsert replaces the
item's attributes as a whole; ``deleted: true`` removes the item (both only when not older
than what the store holds: ``feature_store/FORMAT.md``).

Wire format (``items``, UTF-8 JSON, key ``item_id``): exactly ``item_id, attributes (the
normalised object), ts (epoch ms), deleted (bool)``. :func:`parse_item_record` reads it back
for the feature job, whose invalid records go to the DLQ with the reason.

:func:`read_catalogue` turns catalogue files into wire-ready records: NDJSON of item
records, or MovieLens ``movies.csv`` (``movieId,title,genres``; id ``"m" + movieId``) with an
optional ``tags.csv`` merged in as ``tags``. Items of a file have ``ts`` 0 unless they give
one, so anything posted later wins over a catalogue replay.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from feature_store.catalogue import (
    MAX_VALUE_LEN,
    AttributeProblem,
    FeatureSpec,
    check_attributes,
)
from stream.errors import StreamError
from stream.rules import MAX_FUTURE_MS, SchemaError, ok_id
from stream.schema import (
    EventValidationError,
    Id,
    context_ts,
    decode_events,
    field_errors,
    loads_strict,
)

__all__ = [
    "CATALOGUE_FORMATS",
    "ITEM_WIRE_FIELDS",
    "BadItem",
    "CatalogueError",
    "ItemIn",
    "ItemNormalizer",
    "ItemValidationError",
    "decode_items",
    "item_record",
    "parse_item_record",
    "read_catalogue",
]

#: The keys of an ``items`` record, in order.
ITEM_WIRE_FIELDS = ("item_id", "attributes", "ts", "deleted")
CATALOGUE_FORMATS = ("ndjson", "movielens")
MOVIELENS_NO_GENRES = "(no genres listed)"
#: The receive-time bound of a file's ``ts`` values when no clock is given (no future bound).
_NO_FUTURE_BOUND = 2**62


class ItemIn(BaseModel):
    """One item as clients send it (the body of ``POST /items``, or one element of a batch)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    item_id: Id
    attributes: dict[str, Any] = Field(
        default_factory=dict, description="Item attributes, one per item slot of the feature spec."
    )
    ts: StrictInt | StrictFloat | StrictStr | None = Field(
        None,
        description="RFC 3339 with zone, or epoch seconds (<1e11) / milliseconds; 0: a version "
        "from before any event (what catalogue files carry without a ts).",
    )
    deleted: StrictBool = Field(False, description="True removes the item from the catalogue.")

    @field_validator("attributes", mode="before")
    @classmethod
    def _spec(cls, value: Any, info: ValidationInfo) -> dict[str, Any]:
        spec = (info.context or {}).get("spec")
        if spec is None:
            raise SchemaError("internal: no feature spec given to the validator")
        return check_attributes(spec, value)

    @field_validator("ts")
    @classmethod
    def _item_time(cls, value: int | float | str | None, info: ValidationInfo) -> int | None:
        if type(value) is int and value == 0:
            return 0  # the wire's "since always", so a file of wire records reads back
        return context_ts(value, info)


_BATCH = TypeAdapter(list[ItemIn])


class ItemValidationError(EventValidationError):
    """A batch of items broke the schema; ``errors`` lists every bad index and field."""


class BadItem(StreamError, ValueError):
    """An ``items`` record that is not a valid item; ``str(exc)`` is the DLQ reason."""


class CatalogueError(StreamError, ValueError):
    """A catalogue file (or one of its rows) cannot be read; the message names file and line."""


def item_record(wire: dict[str, Any]) -> tuple[bytes, bytes]:
    """The Kafka ``(key, value)`` of a wire item."""
    return wire["item_id"].encode(), orjson.dumps(wire)


class ItemNormalizer:
    """Validates batches of decoded JSON objects and turns them into wire-format item dicts.

    ``clock_ms`` gives the receive time (the default ``ts`` and the "future" bound).
    """

    def __init__(self, spec: FeatureSpec, clock_ms: Callable[[], int]) -> None:
        self.spec = spec
        self.clock_ms = clock_ms

    def normalize(
        self, items: list[Any], now_ms: int | None = None, default_ts: int | None = None
    ) -> list[dict[str, Any]]:
        """Wire dicts for ``items`` (a missing ``ts`` becomes ``default_ts``, else the receive
        time), or :class:`ItemValidationError` naming every bad field."""
        now = self.clock_ms() if now_ms is None else now_ms
        try:
            parsed = _BATCH.validate_python(items, context={"spec": self.spec, "now_ms": now})
        except ValidationError as exc:
            raise ItemValidationError(field_errors(exc, record="(item)")) from exc
        fallback = now if default_ts is None else default_ts
        return [
            {
                "item_id": it.item_id,
                "attributes": it.attributes,
                "ts": it.ts if it.ts is not None else fallback,
                "deleted": it.deleted,
            }
            for it in parsed
        ]


def decode_items(body: bytes, ndjson: bool) -> list[Any]:
    """Decoded items of a request body: one JSON object, a JSON array, or NDJSON lines (the
    rules of :func:`stream.schema.decode_events`), or :class:`ItemValidationError`."""
    try:
        return decode_events(body, ndjson=ndjson, noun="items")
    except ItemValidationError:
        raise
    except EventValidationError as exc:
        raise ItemValidationError(exc.errors) from exc


def parse_item_record(value: bytes | str, spec: FeatureSpec) -> dict[str, Any]:
    """The wire dict of an ``items`` record, or :class:`BadItem` with the reason.

    The rules of ingest, reading the wire format: exactly :data:`ITEM_WIRE_FIELDS`, ``ts`` an
    integer ≥ 0 (catalogue files write 0), ``deleted`` a bool; attributes re-checked against
    the job's spec (a record written under another spec is reported, not guessed at).
    """
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise BadItem(f"not JSON: {exc}") from exc
    if type(obj) is not dict:
        raise BadItem("not a JSON object")
    if tuple(sorted(obj)) != tuple(sorted(ITEM_WIRE_FIELDS)):
        raise BadItem(f"fields must be exactly {', '.join(ITEM_WIRE_FIELDS)}; got {sorted(obj)}")
    if not ok_id(obj["item_id"]):
        raise BadItem("item_id: must be text of 1..128 characters")
    ts = obj["ts"]
    if type(ts) is not int or ts < 0:
        raise BadItem("ts: must be integer epoch milliseconds >= 0")
    if type(obj["deleted"]) is not bool:
        raise BadItem("deleted: must be a boolean")
    try:
        attributes = check_attributes(spec, obj["attributes"])
    except AttributeProblem as exc:
        raise BadItem(str(exc)) from exc
    return {
        "item_id": obj["item_id"],
        "attributes": attributes,
        "ts": ts,
        "deleted": obj["deleted"],
    }


# ---- catalogue files ----------------------------------------------------------------------


def detect_catalogue_format(path: Path) -> str:
    """``ndjson`` or ``movielens`` from the file's name, else its first line."""
    if path.name.lower().endswith((".ndjson", ".jsonl", ".json")):
        return "ndjson"
    with path.open("rb") as fh:
        first = fh.readline().strip().lstrip(b"\xef\xbb\xbf")
    if first.replace(b" ", b"").lower() == b"movieid,title,genres":
        return "movielens"
    if first.startswith(b"{"):
        return "ndjson"
    raise CatalogueError(
        f"{path}: cannot tell its format (a movies.csv header or NDJSON); pass one of "
        f"{', '.join(CATALOGUE_FORMATS)}"
    )


def read_catalogue(
    path: Path | str,
    fmt: str | None = None,
    *,
    tags: Path | str | None = None,
    spec: FeatureSpec | None = None,
    now_ms: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Wire-ready item dicts of a catalogue file, in file order.

    ``fmt`` is ``ndjson`` or ``movielens`` (default: detected); ``tags`` a MovieLens
    ``tags.csv`` merged into movies as ``tags`` (most used first, at most the slot's
    ``max_values``); ``spec`` the feature spec (default slots when None): a movie attribute
    without an item slot in it is left out; ``now_ms`` the "future" bound of given ``ts``
    values (none when None). A bad row raises :class:`CatalogueError` naming line and field.
    """
    path = Path(path)
    spec = spec or FeatureSpec()
    fmt = fmt or detect_catalogue_format(path)
    now = _NO_FUTURE_BOUND - MAX_FUTURE_MS if now_ms is None else now_ms
    normalizer = ItemNormalizer(spec, clock_ms=lambda: now)
    if fmt == "ndjson":
        if tags is not None:
            raise CatalogueError("tags.csv merges into a MovieLens movies.csv only")
        yield from _read_ndjson(path, normalizer, now)
    elif fmt == "movielens":
        yield from _read_movies(path, None if tags is None else Path(tags), normalizer, now)
    else:
        raise CatalogueError(f"unknown catalogue format {fmt!r}; expected {CATALOGUE_FORMATS}")


def _checked(normalizer: ItemNormalizer, obj: Any, now_ms: int, where: str) -> dict[str, Any]:
    try:
        [wire] = normalizer.normalize([obj], now_ms=now_ms, default_ts=0)
    except ItemValidationError as exc:
        first = exc.errors[0]
        raise CatalogueError(f"{where}: {first.field}: {first.error}") from exc
    return wire


def _read_ndjson(path: Path, normalizer: ItemNormalizer, now_ms: int) -> Iterator[dict[str, Any]]:
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                obj = loads_strict(raw)
            except (ValueError, RecursionError) as exc:
                raise CatalogueError(f"{where}: bad JSON: {exc}") from exc
            yield _checked(normalizer, obj, now_ms, where)


def _csv_rows(path: Path, header: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
    """Data rows of a MovieLens CSV with the given header (checked), with their line numbers."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CatalogueError(f"{path}: not UTF-8: {exc}") from exc
    reader = csv.reader(io.StringIO(text, newline=""))
    first = next(reader, None)
    if first is None or tuple(c.strip() for c in first) != header:
        raise CatalogueError(f"{path}: expected the header {','.join(header)}")
    for row in reader:
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise CatalogueError(
                f"{path}:{reader.line_num}: expected {len(header)} fields, got {len(row)}"
            )
        yield reader.line_num, row


def _movie_tags(path: Path, limit: int) -> dict[str, list[str]]:
    """Per movieId, its distinct tags, most used first (ties in file order), ``limit`` at most."""
    counts: dict[str, Counter[str]] = {}
    for _, (_user, movie, tag, _ts) in _csv_rows(path, ("userId", "movieId", "tag", "timestamp")):
        tag = tag.strip()
        if tag and len(tag) <= MAX_VALUE_LEN:
            counts.setdefault(movie.strip(), Counter())[tag] += 1
    return {m: [t for t, _ in c.most_common(limit)] for m, c in counts.items()}


def _read_movies(
    path: Path, tags_path: Path | None, normalizer: ItemNormalizer, now_ms: int
) -> Iterator[dict[str, Any]]:
    slots = normalizer.spec.by_name
    tags_slot = slots.get("tags")
    tags = _movie_tags(tags_path, tags_slot.max_values) if tags_path and tags_slot else {}
    for line_no, (movie, title, genres) in _csv_rows(path, ("movieId", "title", "genres")):
        movie = movie.strip()
        attributes: dict[str, Any] = {}
        genre_list = [g for g in genres.split("|") if g.strip() and g != MOVIELENS_NO_GENRES]
        if genre_list:
            attributes["genres"] = genre_list
        if title.strip():
            attributes["title"] = title.strip()
        if movie in tags:
            attributes["tags"] = tags[movie]
        attributes = {
            k: v for k, v in attributes.items() if k in slots and slots[k].source == "item"
        }
        yield _checked(
            normalizer,
            {"item_id": f"m{movie}", "attributes": attributes},
            now_ms,
            f"{path}:{line_no}",
        )
