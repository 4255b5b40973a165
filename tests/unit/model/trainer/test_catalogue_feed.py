"""The trainer's catalogue feed (pure logic: records offered as the items topic holds them)."""

from __future__ import annotations

import orjson
import pytest

from feature_store.catalogue import FeatureSpec
from model.trainer.catalogue_feed import CatalogueFeed


def _record(item_id: str, ts: int, deleted: bool = False, **attributes: object) -> bytes:
    return orjson.dumps({"item_id": item_id, "attributes": attributes, "ts": ts,
                         "deleted": deleted})


def test_the_feed_keeps_what_the_online_store_keeps_and_skips_bad_ones() -> None:
    feed = CatalogueFeed(lambda: None, FeatureSpec())
    feed.offer([
        _record("a", 10, category="x"),
        _record("b", 5, category="y"),
        _record("a", 7, category="old"),  # older than what came: ignored
        b"{not json",
        _record("c", 1, colour="red"),  # not an attribute of the spec
        _record("b", 5, deleted=True),  # the same ts: the later record wins
    ])
    got = {it["item_id"]: it for it in feed.take()}
    assert set(got) == {"a", "b"}
    assert got["a"]["attributes"] == {"category": "x"} and got["a"]["ts"] == 10
    assert got["b"]["deleted"] is True
    assert feed.records == 6 and feed.rejected == 2
    assert feed.take() == []
    feed.offer([_record("a", 10, category="x"), _record("a", 11, category="z")])
    assert [it["attributes"] for it in feed.take()] == [{"category": "z"}]
    feed.offer([_record("b", 5, category="back")])  # a tie again: the upsert after the delete
    assert [(it["item_id"], it["deleted"]) for it in feed.take()] == [("b", False)]


def test_a_feed_that_cannot_read_raises_on_the_training_thread() -> None:
    def broken() -> None:
        raise ConnectionError("no broker")

    feed = CatalogueFeed(broken, FeatureSpec())
    feed.start()
    feed.stop()
    with pytest.raises(ConnectionError, match="no broker"):
        feed.take()
