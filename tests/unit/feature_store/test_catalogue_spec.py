"""The feature spec: slots, attribute checks, tokens and keys (feature_store/catalogue.py)."""

from __future__ import annotations

import json

import pytest

from feature_store.catalogue import (
    AttributeProblem,
    FeatureSpec,
    Slot,
    attribute_row,
    check_attributes,
    slot_keys,
    slot_tokens,
)
from streamrec.ids import item_key


def test_default_spec_has_item_context_and_time_slots() -> None:
    spec = FeatureSpec()
    assert {s.source for s in spec.slots} == {"item", "context", "time"}
    assert "genres" in spec.by_name and spec.by_name["genres"].kind == "multi"
    assert FeatureSpec.from_json(spec.to_json()) == spec
    assert len(spec.digest) == 16


def test_spec_file_round_trip_and_errors(tmp_path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"slots": [{"name": "genres", "kind": "multi", "max_values": 8}]}))
    spec = FeatureSpec.load(path)
    assert [s.name for s in spec.slots] == ["genres"] and spec.slots[0].max_values == 8
    assert spec.digest != FeatureSpec().digest
    for bad in (
        {"slots": [{"name": "x", "kind": "colour"}]},
        {"slots": [{"name": "x", "kind": "numeric"}]},
        {"slots": [{"name": "x", "kind": "numeric", "buckets": [2, 1]}]},
        {"slots": [{"name": "x", "kind": "hour"}]},
        {"slots": [{"name": "x", "kind": "multi", "colour": 1}]},
        {"slots": [{"name": "x", "kind": "multi"}, {"name": "x", "kind": "text"}]},
        {"slots": [{"name": "Bad Name", "kind": "multi"}]},
        [],
    ):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="feature spec"):
            FeatureSpec.load(path)


def test_check_attributes_names_the_field() -> None:
    spec = FeatureSpec()
    ok = check_attributes(spec, {"genres": ["Drama", "War", "Drama"], "price": 9, "title": "Heat"})
    assert ok["genres"] == ["Drama", "War"]
    cases = {
        "attributes.colour": {"colour": "red"},
        "attributes.device": {"device": "phone"},  # a context slot is not an item attribute
        "attributes.genres": {"genres": "Drama"},
        "attributes.genres[1]": {"genres": ["Drama", 3]},
        "attributes.price": {"price": "cheap"},
        "attributes.category": {"category": ""},
        "attributes.title": {"title": "x" * 1001},
    }
    for field, attrs in cases.items():
        with pytest.raises(AttributeProblem) as err:
            check_attributes(spec, attrs)
        assert err.value.field == field
    with pytest.raises(AttributeProblem, match="more than 32"):
        check_attributes(spec, {"tags": [f"t{i}" for i in range(33)]})
    with pytest.raises(AttributeProblem):
        check_attributes(spec, {"price": float("nan")})


def test_tokens_per_kind() -> None:
    price = Slot("price", "numeric", buckets=(1, 10, 100))
    assert [slot_tokens(price, v)[0] for v in (0.5, 1, 9.9, 10, 1e6)] == ["b0", "b1", "b1", "b2", "b3"]
    title = Slot("title", "text", max_values=3)
    assert slot_tokens(title, "The Lord of the Rings (2001)") == ["the", "lord", "of"]
    assert slot_tokens(Slot("genres", "multi"), ["A", "B"]) == ["A", "B"]
    # 2026-12-07 10:30 UTC is a Monday
    ms = 1796639400000
    assert slot_tokens(Slot("hour", "hour", source="time"), ms) == ["10"]
    assert slot_tokens(Slot("weekday", "weekday", source="time"), ms) == ["0"]
    assert slot_tokens(title, None) == []


def test_keys_are_per_slot_and_apart_from_item_ids() -> None:
    genres, tags = Slot("genres", "multi"), Slot("tags", "multi")
    assert slot_keys(genres, ["x"]) != slot_keys(tags, ["x"])
    assert slot_keys(genres, ["x"])[0] != item_key("x")
    keys, weights = attribute_row(FeatureSpec(), {"genres": ["Drama", "War"]}, 4)
    assert keys.tolist() == [*slot_keys(genres, ["Drama", "War"]), 0, 0]
    assert weights.tolist() == [0.5, 0.5, 0.0, 0.0]
