"""Readers of historical logs for replay: each turns a file into raw events, row by row.

Formats (``--format``, or detected from the name and first line): ``movielens``
(``ratings.csv``), ``ml-1m`` (``ratings.dat``), ``ml-100k`` (``u.data``), ``ndjson`` (the
ingest schema, ``ts`` required) and ``csv`` with a column mapping (``--map
user_id=COL,item_id=COL,ts=COL[,value=COL][,event_type=COL][,event_id=COL]``). Ratings at or
above ``like_threshold`` (4.0) become ``like``, others ``rating``. A row without an
``event_id`` gets ``blake2b(basename, line number, raw line bytes)``, so the same file
replayed again yields the same ids (the replay ledger skips them); renaming the file changes
them. Unreadable rows are reported by kind (:data:`ERROR_KINDS`). Each format's columns:
docs/internals.md.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from stream.errors import StreamError
from stream.schema import loads_strict

FORMATS = ("movielens", "ml-1m", "ml-100k", "ndjson", "csv")
MAPPABLE = ("user_id", "item_id", "ts", "value", "event_type", "event_id")
NDJSON_SUFFIXES = (".ndjson", ".jsonl", ".json")


class ReplayFormatError(StreamError, ValueError):
    """A file or a mapping cannot be read as the requested format."""


class RawRow(NamedTuple):
    """One data row of a file: its 1-based line number and either an event dict or an error
    (with its kind: :data:`ERROR_KINDS`)."""

    line_no: int
    event: dict[str, Any] | None
    error: str | None = None
    kind: str = "fields"
    #: Whether the event's id came from the row itself (False: derived from the line).
    own_id: bool = False


#: Kinds of unreadable rows: not UTF-8; binary data (NUL or other control bytes); not JSON
#: (e.g. a truncated line); wrong fields (count, numbers, times).
ERROR_KINDS = ("encoding", "binary", "json", "fields")


#: Control bytes that mark a line as binary (tab, newline, vertical tab, form feed and
#: carriage return excepted).
_CONTROL = bytes([*range(0, 9), *range(14, 32)])


def _undecodable(raw: bytes) -> RawRow | None:
    """The error row of a line that is binary (a NUL, or more than two control bytes in its
    first 256) or not UTF-8, else None."""
    head = raw[:256]
    if b"\x00" in raw or len(head) - len(head.translate(None, _CONTROL)) > 2:
        return RawRow(0, None, "binary data", "binary")
    try:
        raw.decode()
    except UnicodeDecodeError as exc:
        return RawRow(0, None, f"not UTF-8 ({exc.reason} at byte {exc.start})", "encoding")
    return None


_INT64 = float(2**63)


def _loads_flat(raw: bytes) -> dict[str, Any] | None:
    """What :func:`stream.schema.loads_strict` returns for a line holding one flat JSON
    object (values strings, numbers, booleans or null) without a backslash, decoded by
    orjson (~5x cheaper); None for any other line (the caller then uses ``loads_strict``,
    which also words the errors). orjson rejects NaN and Infinity as ``loads_strict`` does,
    but keeps the last of duplicate keys: without backslashes every ``"`` delimits a key or
    a string value, so a line whose quotes outnumber those of its decoded keys and string
    values had a member dropped, and goes to ``loads_strict``. orjson also reads an integer
    beyond 64 bits as a float, where ``loads_strict`` keeps it an int: a float that large goes
    to ``loads_strict`` too."""
    if b"\\" in raw:
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    strings = 0
    for value in obj.values():
        kind = type(value)
        if kind is str:
            strings += 1
        elif kind is dict or kind is list:
            return None
        elif kind is float and not -_INT64 < value < _INT64:
            return None
    if raw.count(b'"') != 2 * (len(obj) + strings):
        return None
    return obj


def row_event_id(basename: str, line_no: int, raw: bytes) -> str:
    """Deterministic id of one source row (see the module docstring)."""
    material = b"%s\x1f%d\x1f%s" % (basename.encode(), line_no, raw)
    return hashlib.blake2b(material, digest_size=12).hexdigest()


def rating_event_type(rating: float, like_threshold: float) -> str:
    return "like" if rating >= like_threshold else "rating"


def parse_mapping(spec: str | None) -> dict[str, str]:
    """``"user_id=userId,item_id=movieId,ts=timestamp"`` -> field -> column name."""
    if not spec:
        return {}
    mapping: dict[str, str] = {}
    for part in spec.split(","):
        field, sep, column = part.partition("=")
        field, column = field.strip(), column.strip()
        if not sep or not column:
            raise ReplayFormatError(f"--map entry {part!r} is not FIELD=COLUMN")
        if field not in MAPPABLE:
            raise ReplayFormatError(f"--map field {field!r} is not one of {', '.join(MAPPABLE)}")
        mapping[field] = column
    missing = [f for f in ("user_id", "item_id", "ts") if f not in mapping]
    if missing:
        raise ReplayFormatError(f"--map must name a column for {', '.join(missing)}")
    return mapping


def detect_format(path: Path) -> str:
    """The format of ``path`` from its name, or its first line when the name says nothing."""
    name = path.name.lower()
    if name.endswith(NDJSON_SUFFIXES):
        return "ndjson"
    if name.endswith(".dat"):
        return "ml-1m"
    if name == "u.data" or name.endswith((".data", ".base", ".test")):
        return "ml-100k"
    with path.open("rb") as fh:
        first = fh.readline().strip()
    if first.replace(b" ", b"").lower() == b"userid,movieid,rating,timestamp":
        return "movielens"
    if first.startswith(b"{"):
        return "ndjson"
    if first.count(b"\t") == 3:
        return "ml-100k"
    if first.count(b"::") == 3:
        return "ml-1m"
    return "csv"


def _number(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"not a finite number: {text!r}")
    return value


def _epoch(text: str) -> int | float:
    """A timestamp column: digits are epoch seconds/ms (the schema rule decides), else text."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"timestamp {text!r} is not an epoch number") from None


def _rating_row(
    parts: list[str], line_no: int, raw: bytes, basename: str, like_threshold: float
) -> RawRow:
    if len(parts) != 4:
        return RawRow(line_no, None, f"expected 4 fields, got {len(parts)}")
    user, item, rating_text, ts_text = parts
    try:
        rating = _number(rating_text)
        ts = _epoch(ts_text)
    except ValueError as exc:
        return RawRow(line_no, None, str(exc))
    return RawRow(
        line_no,
        {
            "event_id": row_event_id(basename, line_no, raw),
            "user_id": user.strip(),
            "item_id": item.strip(),
            "event_type": rating_event_type(rating, like_threshold),
            "ts": ts,
            "value": rating,
        },
    )


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as fh:
        for line_no, line in enumerate(fh, start=1):
            yield line_no, line.rstrip(b"\r\n")


def read_rows(
    path: Path,
    fmt: str,
    mapping: Mapping[str, str] | None = None,
    like_threshold: float = 4.0,
    event_type: str | None = None,
) -> Iterator[RawRow]:
    """Every data row of ``path`` (headers and blank lines skipped) in file order."""
    basename = path.name
    if fmt in ("movielens", "ml-1m", "ml-100k"):
        sep = {"movielens": ",", "ml-1m": "::", "ml-100k": "\t"}[fmt]
        for line_no, raw in _lines(path):
            if not raw.strip() or (fmt == "movielens" and line_no == 1 and raw[:1].isalpha()):
                continue
            bad = _undecodable(raw)
            if bad is not None:
                yield bad._replace(line_no=line_no)
                continue
            yield _rating_row(raw.decode().split(sep), line_no, raw, basename, like_threshold)
    elif fmt == "ndjson":
        for line_no, raw in _lines(path):
            if not raw.strip():
                continue
            bad = _undecodable(raw)
            if bad is not None:
                yield bad._replace(line_no=line_no)
                continue
            try:
                obj = _loads_flat(raw)
                if obj is None:
                    obj = loads_strict(raw)
            except ValueError as exc:
                yield RawRow(line_no, None, f"bad JSON: {exc}", "json")
                continue
            except RecursionError:
                yield RawRow(line_no, None, "bad JSON: nested too deeply", "json")
                continue
            if not isinstance(obj, dict):
                yield RawRow(line_no, None, "not a JSON object", "json")
                continue
            own = obj.get("event_id") is not None
            if not own:
                obj["event_id"] = row_event_id(basename, line_no, raw)
            yield RawRow(line_no, obj, own_id=own)
    elif fmt == "csv":
        yield from _mapped_csv(path, mapping or {}, like_threshold, event_type)
    else:
        raise ReplayFormatError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


def _mapped_csv(
    path: Path, mapping: Mapping[str, str], like_threshold: float, event_type: str | None
) -> Iterator[RawRow]:
    if not mapping:
        raise ReplayFormatError(f"{path}: a generic CSV needs --map user_id=...,item_id=...,ts=...")
    basename = path.name
    lines = _lines(path)
    try:
        _, header_raw = next(lines)
    except StopIteration:
        return
    try:
        header = next(csv.reader([header_raw.decode()]))
    except UnicodeDecodeError as exc:
        raise ReplayFormatError(f"{path}: the CSV header is not UTF-8 ({exc.reason})") from exc
    index = {name.strip(): i for i, name in enumerate(header)}
    unknown = [col for col in mapping.values() if col not in index]
    if unknown:
        raise ReplayFormatError(f"{path}: no column {', '.join(map(repr, unknown))} in {header}")
    cols = {field: index[col] for field, col in mapping.items()}
    for line_no, raw in lines:
        if not raw.strip():
            continue
        bad = _undecodable(raw)
        if bad is not None:
            yield bad._replace(line_no=line_no)
            continue
        try:
            cells = next(csv.reader(io.StringIO(raw.decode())))
            if len(cells) != len(header):
                raise ValueError(f"expected {len(header)} fields, got {len(cells)}")
            event: dict[str, Any] = {
                "user_id": cells[cols["user_id"]],
                "item_id": cells[cols["item_id"]],
                "ts": _epoch_or_text(cells[cols["ts"]]),
            }
            if "value" in cols and cells[cols["value"]].strip():
                event["value"] = _number(cells[cols["value"]])
            if "event_type" in cols:
                event["event_type"] = cells[cols["event_type"]].strip()
            elif event_type is not None:
                event["event_type"] = event_type
            elif "value" in event:
                event["event_type"] = rating_event_type(event["value"], like_threshold)
            else:
                event["event_type"] = "click"
            own_id = cells[cols["event_id"]].strip() if "event_id" in cols else ""
            event["event_id"] = own_id or row_event_id(basename, line_no, raw)
        except (ValueError, UnicodeDecodeError, csv.Error) as exc:
            yield RawRow(line_no, None, str(exc))
            continue
        yield RawRow(line_no, event, own_id=bool(own_id))


def _epoch_or_text(text: str) -> int | float | str:
    """A mapped ``ts`` cell: an epoch number if it looks like one, else an RFC 3339 string."""
    try:
        return _epoch(text)
    except ValueError:
        return text.strip()
