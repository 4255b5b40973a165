"""Fixtures shared by the integration tests (the stack itself: ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from feature_store.redis_store import RedisOnlineStore
from streamrec.settings import Settings


@pytest.fixture
def client(settings: Settings) -> Iterator[Any]:
    """A plain Redis client on the test server, to look at the keys the store writes."""
    import redis

    c = redis.Redis(host=settings.redis.host, port=settings.redis.port, db=settings.redis.db)
    yield c
    c.close()


@pytest.fixture
def store(settings: Settings, client: Any) -> Iterator[RedisOnlineStore]:
    """The Redis store of the test's key prefix; its keys are deleted afterwards."""
    s = RedisOnlineStore(settings.redis, settings.features, client=client)
    yield s
    keys = list(client.scan_iter(match=f"{settings.redis.key_prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    s.close()
