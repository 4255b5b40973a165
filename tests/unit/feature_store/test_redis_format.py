"""The pure parts of the Redis layout (FORMAT.md): key names and payload codecs."""

from __future__ import annotations

import json

import pytest

from feature_store.redis_store import (
    decode_item,
    decode_trending,
    decode_user,
    encode_item,
    encode_trending,
    encode_user,
    item_ids_key_name,
    item_key_name,
    trending_key_name,
    user_key_name,
)
from feature_store.store import HistoryEntry, ItemFeatures, OnlineStoreError, Trending, UserFeatures


def test_key_names_follow_format_md() -> None:
    assert user_key_name("sr:", "42") == "sr:u:42"
    assert item_key_name("t1:", "movie:7") == "t1:i:movie:7"
    assert trending_key_name("sr:") == "sr:trending"
    assert item_ids_key_name("sr:") == "sr:item_ids"


def test_user_round_trip_and_wire_shape() -> None:
    f = UserFeatures(
        user_id="ü1",
        history=(HistoryEntry("b", "like", 20), HistoryEntry("a", "click", 10)),
        counts={"1h": {"click": 1, "like": 1}, "24h": {"click": 1, "like": 1}, "7d": {}},
        last_seen_ms=20,
        as_of_ms=20,
    )
    payload = encode_user(f)
    assert json.loads(payload) == {
        "h": [["b", "like", 20], ["a", "click", 10]],
        "c": {"1h": {"click": 1, "like": 1}, "24h": {"click": 1, "like": 1}, "7d": {}},
        "ls": 20,
    }
    assert decode_user("ü1", b"20", payload.encode()) == f


def test_item_and_trending_round_trip() -> None:
    item = ItemFeatures(item_id="i", score=2.5, counts={"1h": 1, "24h": 3}, as_of_ms=99)
    assert json.loads(encode_item(item)) == {"s": 2.5, "c": {"1h": 1, "24h": 3}}
    assert decode_item("i", b"99", encode_item(item).encode()) == item
    t = Trending(items=(("a", 3.0), ("b", 1.5), ("c", 1.0)), as_of_ms=5)
    assert decode_trending(b"5", encode_trending(t), 2) == Trending(
        items=(("a", 3.0), ("b", 1.5)), as_of_ms=5
    )


@pytest.mark.parametrize("payload", [b"not json", b'{"h": []}', b'{"h": [[1]], "c": {}, "ls": 1}'])
def test_corrupt_payload_is_an_error(payload: bytes) -> None:
    with pytest.raises(OnlineStoreError):
        decode_user("u", b"1", payload)

