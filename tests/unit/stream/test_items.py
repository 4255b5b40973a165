"""The item record: validation names the field, wire format, catalogue files (NDJSON,
MovieLens movies.csv with tags.csv)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from feature_store.catalogue import FeatureSpec, Slot
from stream.items import (
    ITEM_WIRE_FIELDS,
    BadItem,
    CatalogueError,
    ItemNormalizer,
    ItemValidationError,
    decode_items,
    item_record,
    parse_item_record,
    read_catalogue,
)

NOW_MS = int(datetime(2025, 6, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)
SPEC = FeatureSpec()


def normalize(*items: Any) -> list[dict[str, Any]]:
    return ItemNormalizer(SPEC, clock_ms=lambda: NOW_MS).normalize(list(items))


def problems(*items: Any) -> list[tuple[int | None, str]]:
    with pytest.raises(ItemValidationError) as info:
        normalize(*items)
    return [(e.index, e.field) for e in info.value.errors]


def test_wire_format_is_exactly_the_four_fields() -> None:
    [wire] = normalize({"item_id": "i1", "attributes": {"genres": ["a", "b", "a"], "price": 3}})
    assert tuple(wire) == ITEM_WIRE_FIELDS
    assert wire == {
        "item_id": "i1",
        "attributes": {"genres": ["a", "b"], "price": 3},
        "ts": NOW_MS,
        "deleted": False,
    }
    key, value = item_record(wire)
    assert key == b"i1" and orjson.loads(value) == wire


def test_ts_follows_the_event_rule_and_deleted_is_kept() -> None:
    [a, b] = normalize(
        {"item_id": "i1", "ts": "2025-06-01T11:00:00Z", "deleted": True},
        {"item_id": "i2", "ts": 1_748_775_600},  # epoch seconds
    )
    assert a["ts"] == NOW_MS - 3_600_000 and a["deleted"] is True and a["attributes"] == {}
    assert b["ts"] == 1_748_775_600_000
    [c] = normalize({"item_id": "i3", "ts": 0})
    assert c["ts"] == 0


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"item_id": "i", "attributes": {"colour": "red"}}, "attributes.colour"),
        ({"item_id": "i", "attributes": {"genres": ["a", 3]}}, "attributes.genres[1]"),
        ({"item_id": "i", "attributes": {"genres": "a"}}, "attributes.genres"),
        ({"item_id": "i", "attributes": {"price": "3"}}, "attributes.price"),
        ({"item_id": "i", "attributes": {"title": "x" * 1001}}, "attributes.title"),
        ({"item_id": "i", "attributes": {"hour": "3"}}, "attributes.hour"),
        ({"item_id": "i", "attributes": {"price": 10**400}}, "attributes.price"),
        ({"item_id": "i", "attributes": {"price": True}}, "attributes.price"),
        ({"item_id": "i", "attributes": {"tags": ["ok", "\udc00"]}}, "attributes.tags[1]"),
        ({"item_id": "i", "attributes": ["genres"]}, "attributes"),
        ({"item_id": "x" * 129}, "item_id"),
        ({"item_id": 7}, "item_id"),
        ({"item_id": "i", "ts": "yesterday"}, "ts"),
        ({"item_id": "i", "ts": 1.5e20}, "ts"),
        ({"item_id": "i", "deleted": 1}, "deleted"),
        ({"item_id": "i", "score": 1}, "score"),
        ({"attributes": {}}, "item_id"),
        ("i1", "(item)"),
    ],
)
def test_errors_name_the_field(item: Any, field: str) -> None:
    assert problems({"item_id": "ok"}, item) == [(1, field)]


def test_decode_items_reads_object_array_and_ndjson() -> None:
    one = {"item_id": "i1"}
    assert decode_items(json.dumps(one).encode(), ndjson=False) == [one]
    assert decode_items(b'{"item_id": "a"}\n\n{"item_id": "b"}\n', ndjson=True) == [
        {"item_id": "a"},
        {"item_id": "b"},
    ]
    with pytest.raises(ItemValidationError) as info:
        decode_items(b"", ndjson=True)
    assert info.value.errors[0].error == "no items in the body"
    with pytest.raises(ItemValidationError):
        decode_items(b'{"item_id": "a", "item_id": "b"}', ndjson=False)


def test_parse_item_record_reads_the_wire_and_reports_the_reason() -> None:
    wire = {"item_id": "i1", "attributes": {"tags": ["x"]}, "ts": 0, "deleted": False}
    assert parse_item_record(orjson.dumps(wire), SPEC) == wire
    bad = [
        (b"{nope", "not JSON"),
        (b"[1]", "not a JSON object"),
        (orjson.dumps({**wire, "extra": 1}), "fields must be exactly"),
        (orjson.dumps({**wire, "ts": -1}), "ts:"),
        (orjson.dumps({**wire, "ts": "0"}), "ts:"),
        (orjson.dumps({**wire, "deleted": 0}), "deleted:"),
        (orjson.dumps({**wire, "item_id": ""}), "item_id:"),
        (orjson.dumps({**wire, "attributes": {"tags": [1]}}), "attributes.tags[0]"),
    ]
    for raw, reason in bad:
        with pytest.raises(BadItem, match=reason.replace("[", r"\[")):
            parse_item_record(raw, SPEC)


MOVIES = """movieId,title,genres
1,Toy Story (1995),Adventure|Animation|Children|Comedy|Fantasy
2,"American President, The (1995)",Comedy|Drama|Romance
3,Nothing Listed (2000),(no genres listed)
"""
TAGS = """userId,movieId,tag,timestamp
1,1,pixar,1139045764
2,1,fun,1139045765
3,1,pixar,1139045766
4,3,  quiet ,1139045767
5,999,orphan,1139045768
"""


def test_movies_csv_with_tags(tmp_path: Path) -> None:
    movies = tmp_path / "movies.csv"
    movies.write_text(MOVIES)
    tags = tmp_path / "tags.csv"
    tags.write_text(TAGS)
    items = list(read_catalogue(movies, tags=tags))
    assert [i["item_id"] for i in items] == ["m1", "m2", "m3"]
    assert items[0] == {
        "item_id": "m1",
        "attributes": {
            "genres": ["Adventure", "Animation", "Children", "Comedy", "Fantasy"],
            "title": "Toy Story (1995)",
            "tags": ["pixar", "fun"],  # most used first
        },
        "ts": 0,
        "deleted": False,
    }
    assert items[1]["attributes"]["title"] == "American President, The (1995)"
    assert items[2]["attributes"] == {"title": "Nothing Listed (2000)", "tags": ["quiet"]}
    assert all(tuple(i) == ITEM_WIRE_FIELDS for i in items)
    # without tags, and under a spec that has no title slot: the attribute is left out
    spec = FeatureSpec((Slot("genres", "multi"),))
    plain = list(read_catalogue(movies, "movielens", spec=spec))
    assert plain[0]["attributes"] == {
        "genres": ["Adventure", "Animation", "Children", "Comedy", "Fantasy"]
    }
    assert plain[2]["attributes"] == {}


def test_tags_are_capped_at_the_slot_limit(tmp_path: Path) -> None:
    movies = tmp_path / "movies.csv"
    movies.write_text("movieId,title,genres\n1,A,Drama\n")
    tags = tmp_path / "tags.csv"
    rows = [f"{u},1,t{u % 5},1" for u in range(40)] + [f"99,1,rare{n},1" for n in range(40)]
    tags.write_text("userId,movieId,tag,timestamp\n" + "\n".join(rows) + "\n")
    spec = FeatureSpec((Slot("tags", "multi", max_values=6),))
    [item] = read_catalogue(movies, tags=tags, spec=spec)
    assert item["attributes"]["tags"] == ["t0", "t1", "t2", "t3", "t4", "rare0"]


def test_ndjson_catalogue(tmp_path: Path) -> None:
    path = tmp_path / "items.ndjson"
    path.write_text(
        '{"item_id": "a", "attributes": {"category": "shoes", "price": 42.5}}\n'
        "\n"
        '{"item_id": "b", "ts": "2024-01-01T00:00:00Z", "deleted": true}\n'
    )
    a, b = read_catalogue(path)
    assert a == {
        "item_id": "a",
        "attributes": {"category": "shoes", "price": 42.5},
        "ts": 0,
        "deleted": False,
    }
    assert b["ts"] == 1_704_067_200_000 and b["deleted"] is True
    # a file of wire records reads back: ts 0 is "since always", as a file without one
    again = tmp_path / "again.ndjson"
    again.write_text("\n".join(json.dumps(item) for item in (a, b)) + "\n")
    assert list(read_catalogue(again)) == [a, b]
    # detected from the first line when the name says nothing
    other = tmp_path / "catalogue.txt"
    other.write_bytes(path.read_bytes())
    assert len(list(read_catalogue(other))) == 2


def test_bad_catalogue_rows_name_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "items.ndjson"
    path.write_text('{"item_id": "a"}\n{"item_id": "b", "attributes": {"brand": 3}}\n')
    reader = read_catalogue(path)
    assert next(reader)["item_id"] == "a"
    with pytest.raises(CatalogueError, match=r"items.ndjson:2: attributes.brand: should be"):
        next(reader)
    movies = tmp_path / "movies.csv"
    movies.write_text("movieId,title,genres\n1,A\n")
    with pytest.raises(CatalogueError, match="movies.csv:2: expected 3 fields"):
        list(read_catalogue(movies))
    unknown = tmp_path / "what.csv"
    unknown.write_text("a,b,c\n")
    with pytest.raises(CatalogueError, match="cannot tell its format"):
        list(read_catalogue(unknown))
    with pytest.raises(CatalogueError, match="movies.csv only"):
        list(read_catalogue(path, tags=movies))
