"""The online store seam: ``open_store`` picks the backend from settings; the interface's
user-rows write equals its record write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from feature_store.store import (
    HistoryEntry,
    ItemFeatures,
    OnlineStore,
    Trending,
    UserFeatures,
    open_store,
)
from streamrec.settings import load_settings


class RecordingStore(OnlineStore):
    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []

    def write_batch(self, users: Sequence[UserFeatures] = (), items: Sequence[ItemFeatures] = (),
                    trending: Trending | None = None, **seqs: Any) -> None:
        self.writes.append({"users": list(users), **seqs})

    def read_users(self, user_ids: Sequence[str]) -> list[UserFeatures | None]:
        return [None for _ in user_ids]

    def read_items(self, item_ids: Sequence[str]) -> list[ItemFeatures | None]:
        return [None for _ in item_ids]

    def read_trending(self, n: int) -> Trending | None:
        return None

    def read_item_ids(self, keys: Sequence[int]) -> list[str | None]:
        return [None for _ in keys]


def test_user_rows_default_to_the_record_write() -> None:
    store = RecordingStore()
    store.write_user_rows(iter([
        ("u1", 20, 3, [("a", "click", 20), ("b", "rating", 10)], {"1h": {"click": 1}}, 20),
        ("u2", 5, 1, [], {}, 5),
    ]))
    (write,) = store.writes
    assert write["users"] == [
        UserFeatures("u1", (HistoryEntry("a", "click", 20), HistoryEntry("b", "rating", 10)),
                     {"1h": {"click": 1}}, 20, 20),
        UserFeatures("u2", (), {}, 5, 5),
    ]
    assert write["user_seqs"] == [3, 1]
    store.write_user_rows([])
    assert len(store.writes) == 1  # nothing to write, no call
    store.close()  # the default close has nothing to release


def test_open_store_builds_the_configured_backend() -> None:
    from feature_store.redis_store import RedisOnlineStore

    settings = load_settings(redis={"port": 1, "key_prefix": "x:"})
    assert settings.store.backend == "redis"
    store = open_store(settings, timeout_s=0.2)  # redis-py connects lazily: nothing dialled
    try:
        assert isinstance(store, RedisOnlineStore)
    finally:
        store.close()


def test_unknown_backend_is_rejected_by_the_settings() -> None:
    with pytest.raises(ValidationError):
        load_settings(store={"backend": "memcached"})


def test_redis_backend_checks_seq_lengths() -> None:
    from feature_store.redis_store import RedisOnlineStore

    store = RedisOnlineStore(load_settings().redis, client=_NoServer())
    with pytest.raises(ValueError, match="user_seqs"):
        store.write_batch(users=[UserFeatures("u", (), {}, 1, 1)], user_seqs=[1, 2])


class _NoServer:
    """Enough of a ``redis.Redis`` to build the backend; any call to a server fails."""

    def register_script(self, script: str) -> Any:
        return type("Script", (), {"sha": "0" * 40})()

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected redis call {name}")
