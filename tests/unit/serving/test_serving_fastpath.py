"""serving.fastpath: a well-formed GET /recommend answered before the routing, with the same
answer the FastAPI route gives; anything else left to the route."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from serving.fastpath import parse_recommend
from tests.unit.serving.test_serving_app import env, publish  # noqa: F401 - the fixture

QUERIES = [
    "user_id=alice", "user_id=alice&k=7", "user_id=alice&k=7&exclude_seen=false",
    "user_id=alice&exclude_seen=0", "user_id=alice&exclude_seen=1&k=500",
    "user_id=nobody&k=3", "user_id=a%20b&k=2", "user_id=%C3%A9t%C3%A9", "k=4&user_id=alice",
    "user_id=bob&user_id=alice&k=3", "user_id=alice&k=9&k=2", "user_id=alice&other=1",
    # left to the route (422 or another spelling it accepts)
    "user_id=alice&k=020", "user_id=alice&k=%2B5", "user_id=alice&k=0", "user_id=alice&k=501",
    "user_id=alice&exclude_seen=yes", "user_id=alice&exclude_seen=TRUE", "user_id=&k=3",
    "k=3", "user_id=" + "x" * 129, "user_id=" + "x" * 128, "user_id=alice&k=",
    "user_id=alice&exclude_seen=maybe",
]


def _strip(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "took_ms"}


@pytest.mark.parametrize("query", QUERIES)
def test_fast_answer_equals_the_route(env, query: str) -> None:  # noqa: F811
    app, _, reg = env
    publish(reg, "v1", n=600)
    with TestClient(app) as client:
        fast = client.get("/recommend?" + query)
        # a declared (empty) body sends the request on to the FastAPI route
        routed = client.get("/recommend?" + query, headers={"content-length": "0"})
    assert fast.status_code == routed.status_code
    assert fast.headers["content-type"] == routed.headers["content-type"]
    if routed.status_code == 200:
        assert _strip(fast.json()) == _strip(routed.json())
        assert fast.headers["content-length"] == str(len(fast.content))
    else:
        assert fast.json() == routed.json()


def test_parse_takes_only_what_the_route_accepts_as_is() -> None:
    assert parse_recommend(b"user_id=alice", 20, 500) == ("alice", 20, True)
    assert parse_recommend(b"k=5&user_id=a&exclude_seen=false", 20, 500) == ("a", 5, False)
    assert parse_recommend(b"user_id=b&user_id=a&k=9&k=3", 20, 500) == ("a", 3, True)
    assert parse_recommend(b"user_id=a%2Bb+c", 20, 500) == ("a+b c", 20, True)
    for query in (b"", b"k=3", b"user_id=", b"user_id=a&k=0", b"user_id=a&k=07",
                  b"user_id=a&k=501", b"user_id=a&k=-1", b"user_id=a&k=%2B3",
                  b"user_id=a&exclude_seen=yes", b"user_id=" + b"x" * 129):
        assert parse_recommend(query, 20, 500) is None, query
