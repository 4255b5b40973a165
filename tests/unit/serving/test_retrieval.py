"""Seen filtering and trending padding (the top-k itself: ``test_topk.py``)."""

from __future__ import annotations

from serving.retrieval import Scored, pad, popular


def test_pad_with_trending_skips_taken_and_seen() -> None:
    ranked = [Scored("a", 3.0), Scored("b", 2.0)]
    trending = [("b", 9.0), ("c", 8.0), ("s", 7.0), ("d", 6.0), ("e", 5.0)]
    out = pad(ranked, trending, 4, seen={"s"})
    assert [s.item_id for s in out] == ["a", "b", "c", "d"]
    assert out[2].score == 8.0
    assert [s.item_id for s in pad(ranked, trending, 1, set())] == ["a"]
    assert [s.item_id for s in pad(ranked, trending[:2], 10, set())] == ["a", "b", "c"]


def test_popular_filters_seen() -> None:
    trending = [("x", 3.0), ("y", 2.0), ("z", 1.0)]
    assert [s.item_id for s in popular(trending, 2, {"x"})] == ["y", "z"]
    assert popular((), 5, set()) == []
