"""Redis backend of the online store.

The key layout and the write rule are the written spec ``feature_store/FORMAT.md``; the pure
encode/decode functions below are its only implementation. Writes go through one Lua script
(:data:`WRITE_IF_NEWER`, run with ``EVALSHA`` on up to :data:`SCRIPT_CHUNK` records at a time,
in a pipeline) so "only if newer ``(as_of, seq)``" is atomic per record; a whole batch is one
round trip and one script call per chunk, not one command per record. The script is called
by its SHA, not as a registered ``Script`` (whose pipeline asks ``SCRIPT EXISTS`` first, a
second round trip; why: ``docs/decisions.md#redis-writes``); on ``NOSCRIPT`` the script is
loaded and the batch resent. redis-py uses hiredis for parsing when it is installed (it is a
dependency).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from feature_store.errors import OnlineStoreError
from feature_store.store import (
    CatalogueItem,
    Generation,
    HistoryEntry,
    ItemFeatures,
    Mark,
    OnlineStore,
    Trending,
    UserFeatures,
    UserRow,
)
from streamrec.ids import item_key
from streamrec.settings import FeatureSettings, RedisSettings

log = logging.getLogger(__name__)

#: Bump on an incompatible change of FORMAT.md.
LAYOUT_VERSION = "1"

#: KEYS = record keys; ARGV = (as_of, seq, payload, ttl_s) per key, in order. Each record is
#: written only if its (as_of, seq) is not older than the stored one; returns how many were.
WRITE_IF_NEWER = """
local written = 0
for i = 1, #KEYS do
  local j = (i - 1) * 4
  local na = tonumber(ARGV[j + 1])
  local ns = tonumber(ARGV[j + 2])
  local cur = redis.call('HMGET', KEYS[i], 'as_of', 'seq')
  local stale = false
  if cur[1] then
    local a = tonumber(cur[1])
    local s = tonumber(cur[2] or '0') or 0
    stale = na < a or (na == a and ns < s)
  end
  if not stale then
    redis.call('HSET', KEYS[i], 'as_of', ARGV[j + 1], 'seq', ARGV[j + 2], 'v', ARGV[j + 3])
    local ttl = tonumber(ARGV[j + 4])
    if ttl > 0 then redis.call('EXPIRE', KEYS[i], ttl) end
    written = written + 1
  end
end
return written
"""

#: KEYS[1] = the generation hash; ARGV = (part, prev, new, writer token, now_ms). Creates the
#: epoch (``token-now_ms``) if the hash has none; while the part is flagged rehydrating returns 0 and changes
#: nothing else; if the stored count is behind ``prev`` (the store lost writes) flags the part
#: and returns 0; else stores ``new`` and returns 1 (FORMAT.md "Generation").
MARK_WRITES = """
local g = KEYS[1]
if redis.call('HEXISTS', g, 'epoch') == 0 then
  redis.call('HSET', g, 'epoch', ARGV[4] .. '-' .. ARGV[5], 'since', ARGV[5])
end
if redis.call('HEXISTS', g, 'r:' .. ARGV[1]) == 1 then return 0 end
local cur = tonumber(redis.call('HGET', g, 'w:' .. ARGV[1]) or '0') or 0
if cur < tonumber(ARGV[2]) then
  redis.call('HSET', g, 'r:' .. ARGV[1], ARGV[5])
  return 0
end
redis.call('HSET', g, 'w:' .. ARGV[1], ARGV[3])
return 1
"""

#: Records per script call (bounds how long one call holds the Redis server).
SCRIPT_CHUNK = 500

def _dumps_bytes(obj: object) -> bytes:
    """Compact UTF-8 JSON. orjson (~5x cheaper than ``json`` on a user record) writes what
    ``json.dumps(separators=(",", ":"), ensure_ascii=False)`` writes for our payloads (strings,
    ints, dicts, lists; a float may spell its exponent differently, same value); what it
    refuses (e.g. a lone surrogate, an int over 64 bits) goes through ``json``."""
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _dumps(obj: object) -> str:
    return _dumps_bytes(obj).decode()


# --- keys (FORMAT.md "key layout") -----------------------------------------------------------


def user_key_name(prefix: str, user_id: str) -> str:
    return f"{prefix}u:{user_id}"


def item_key_name(prefix: str, item_id: str) -> str:
    return f"{prefix}i:{item_id}"


def catalogue_key_name(prefix: str, item_id: str) -> str:
    return f"{prefix}c:{item_id}"


def trending_key_name(prefix: str) -> str:
    return f"{prefix}trending"


def item_ids_key_name(prefix: str) -> str:
    return f"{prefix}item_ids"


def layout_key_name(prefix: str) -> str:
    return f"{prefix}layout"


def generation_key_name(prefix: str) -> str:
    return f"{prefix}gen"


def decode_generation(raw: dict[Any, Any]) -> Generation:
    """The generation hash (``HGETALL``) as a :class:`Generation`."""
    fields = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes)
                                                            else v) for k, v in raw.items()}
    try:
        return Generation(
            epoch=fields.get("epoch"),
            since_ms=int(fields.get("since", 0)),
            writes={k[2:]: int(v) for k, v in fields.items() if k.startswith("w:")},
            rehydrating={k[2:]: int(v) for k, v in fields.items() if k.startswith("r:")},
        )
    except ValueError as exc:
        raise OnlineStoreError(f"corrupt generation marker: {exc}") from exc


# --- payloads (FORMAT.md "record fields") ----------------------------------------------------


def encode_user(f: UserFeatures) -> str:
    history = [(h.item_id, h.event_type, h.ts_ms) for h in f.history]
    return encode_user_values(history, f.counts, f.last_seen_ms).decode()


def encode_user_values(
    history: Sequence[tuple[str, str, int]], counts: dict[str, dict[str, int]], last_seen_ms: int
) -> bytes:
    """The user payload from its parts (``feature_store.features.user_history`` and
    ``user_counts``), for a writer that skips building :class:`UserFeatures`."""
    return _dumps_bytes({"h": history, "c": counts, "ls": last_seen_ms})


def decode_user(user_id: str, as_of: bytes | str, payload: bytes | str) -> UserFeatures:
    try:
        data = json.loads(payload)
        return UserFeatures(
            user_id=user_id,
            history=tuple(HistoryEntry(str(i), str(t), int(ts)) for i, t, ts in data["h"]),
            counts={w: {t: int(n) for t, n in c.items()} for w, c in data["c"].items()},
            last_seen_ms=int(data["ls"]),
            as_of_ms=int(as_of),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise OnlineStoreError(f"corrupt user record {user_id!r}: {exc}") from exc


def encode_item(f: ItemFeatures) -> str:
    return _dumps({"s": f.score, "c": f.counts})


def decode_item(item_id: str, as_of: bytes | str, payload: bytes | str) -> ItemFeatures:
    try:
        data = json.loads(payload)
        return ItemFeatures(
            item_id=item_id,
            score=float(data["s"]),
            counts={w: int(n) for w, n in data["c"].items()},
            as_of_ms=int(as_of),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise OnlineStoreError(f"corrupt item record {item_id!r}: {exc}") from exc


def encode_catalogue(c: CatalogueItem) -> bytes:
    """``{"a": attributes}``, or ``{"deleted": true}`` for a tombstone."""
    return _dumps_bytes({"deleted": True} if c.deleted else {"a": c.attributes})


def decode_catalogue(item_id: str, as_of: bytes | str, payload: bytes | str) -> CatalogueItem:
    try:
        data = json.loads(payload)
        if data.get("deleted") is True:
            return CatalogueItem(item_id, {}, int(as_of), deleted=True)
        attributes = data["a"]
        if not isinstance(attributes, dict):
            raise TypeError("attributes are not an object")
        return CatalogueItem(item_id, attributes, int(as_of))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise OnlineStoreError(f"corrupt catalogue record {item_id!r}: {exc}") from exc


def encode_trending(t: Trending) -> str:
    return _dumps({"t": [[i, s] for i, s in t.items]})


def decode_trending(as_of: bytes | str, payload: bytes | str, n: int) -> Trending:
    try:
        data = json.loads(payload)
        items = tuple((str(i), float(s)) for i, s in data["t"][: max(n, 0)])
        return Trending(items=items, as_of_ms=int(as_of))
    except (ValueError, KeyError, TypeError) as exc:
        raise OnlineStoreError(f"corrupt trending record: {exc}") from exc


class RedisOnlineStore(OnlineStore):
    """:class:`OnlineStore` on Redis (layout: ``feature_store/FORMAT.md``). Build it with
    ``feature_store.open_store``; ``client`` (a ``redis.Redis``) replaces the connection the
    settings describe (tests pass their own to inspect keys)."""

    def __init__(
        self,
        redis_settings: RedisSettings,
        feature_settings: FeatureSettings | None = None,
        client: Any | None = None,
        socket_timeout_s: float = 5.0,
    ) -> None:
        import redis

        self._prefix = redis_settings.key_prefix
        features = feature_settings or FeatureSettings()
        self._user_ttl = int(features.user_ttl_s)
        self._item_ttl = int(features.item_ttl_s)
        password = redis_settings.password
        self._redis = client or redis.Redis(
            host=redis_settings.host,
            port=redis_settings.port,
            db=redis_settings.db,
            password=password.get_secret_value() if password else None,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            health_check_interval=30,
        )
        self._errors: tuple[type[Exception], ...] = (redis.RedisError,)
        self._write = self._redis.register_script(WRITE_IF_NEWER)
        self._mark = self._redis.register_script(MARK_WRITES)
        self._no_script: type[Exception] = redis.exceptions.NoScriptError
        self._token = uuid.uuid4().hex[:16]

    def close(self) -> None:
        self._redis.close()

    def write_batch(
        self,
        users: Sequence[UserFeatures] = (),
        items: Sequence[ItemFeatures] = (),
        trending: Trending | None = None,
        *,
        user_seqs: Sequence[int] | None = None,
        item_seqs: Sequence[int] | None = None,
        trending_seq: int = 0,
        mark: Mark | None = None,
    ) -> bool:
        """Write records in one pipeline; each is written only if newer (FORMAT.md)."""
        _check_seqs("user_seqs", user_seqs, users)
        _check_seqs("item_seqs", item_seqs, items)
        return self._write_encoded(
            users=[
                (u.user_id, u.as_of_ms, user_seqs[n] if user_seqs else 0, encode_user(u))
                for n, u in enumerate(users)
            ],
            items=[
                (it.item_id, it.as_of_ms, item_seqs[n] if item_seqs else 0, encode_item(it))
                for n, it in enumerate(items)
            ],
            trending=None
            if trending is None
            else (trending.as_of_ms, trending_seq, encode_trending(trending)),
            mark=mark,
        )

    def write_user_rows(self, rows: Iterable[UserRow], mark: Mark | None = None) -> bool:
        """Users from their parts, encoded straight into payloads (:func:`encode_user_values`)."""
        return self._write_encoded(users=(
            (user_id, as_of_ms, seq, encode_user_values(history, counts, last_seen_ms))
            for user_id, as_of_ms, seq, history, counts, last_seen_ms in rows
        ), mark=mark)

    def read_generation(self) -> Generation:
        try:
            raw: Any = self._redis.hgetall(generation_key_name(self._prefix))
        except self._errors as exc:
            raise OnlineStoreError(f"redis read failed: {exc}") from exc
        return decode_generation(raw)

    def finish_rehydration(self, part: str, writes: int) -> None:
        try:
            pipe = self._redis.pipeline(transaction=True)
            key = generation_key_name(self._prefix)
            pipe.hset(key, f"w:{part}", str(writes))
            pipe.hdel(key, f"r:{part}")
            pipe.execute()
        except self._errors as exc:
            raise OnlineStoreError(f"redis write failed: {exc}") from exc

    def write_catalogue(self, records: Sequence[CatalogueItem]) -> int:
        """Catalogue records through the same only-if-newer script (``seq`` 0, no TTL)."""
        if not records:
            return 0
        p = self._prefix
        keys: list[str] = []
        args: list[Any] = []
        for c in records:
            keys.append(catalogue_key_name(p, c.item_id))
            args += (c.ts_ms, 0, encode_catalogue(c), 0)
        named = [(c.item_id,) for c in records if not c.deleted]
        try:
            try:
                results = self._run_pipeline(keys, args, named, None)
            except self._no_script:
                self._redis.script_load(WRITE_IF_NEWER)
                results = self._run_pipeline(keys, args, named, None)
        except self._errors as exc:
            raise OnlineStoreError(f"redis write failed: {exc}") from exc
        first = 1 if named else 0
        return sum(int(n) for n in results[first : first + -(-len(keys) // SCRIPT_CHUNK)])

    def read_catalogue(self, item_ids: Sequence[str]) -> list[CatalogueItem | None]:
        rows = self._read_hashes([catalogue_key_name(self._prefix, i) for i in item_ids])
        out: list[CatalogueItem | None] = []
        for i, (as_of, v) in zip(item_ids, rows, strict=True):
            record = decode_catalogue(i, as_of, v) if as_of is not None and v is not None else None
            out.append(None if record is None or record.deleted else record)
        return out

    def _write_encoded(
        self,
        users: Iterable[tuple[str, int, int, str | bytes]] = (),
        items: Sequence[tuple[str, int, int, str | bytes]] = (),
        trending: tuple[int, int, str | bytes] | None = None,
        mark: Mark | None = None,
    ) -> bool:
        """Encoded records: ``(id, as_of_ms, seq, payload)`` per user and item,
        ``(as_of_ms, seq, payload)`` for trending, and the batch's ``mark``; one pipeline for
        all of them. Returns the mark's verdict (True without a mark)."""
        p = self._prefix
        keys: list[str] = []
        args: list[Any] = []
        ttl = self._user_ttl
        for user_id, as_of, seq, payload in users:
            keys.append(user_key_name(p, user_id))
            args += (as_of, seq, payload, ttl)
        ttl = self._item_ttl
        for item_id, as_of, seq, payload in items:
            keys.append(item_key_name(p, item_id))
            args += (as_of, seq, payload, ttl)
        if trending is not None:
            keys.append(trending_key_name(p))
            args += (*trending, 0)
        if not keys and mark is None:
            return True
        try:
            try:
                return self._write_pipeline(keys, args, items, mark)
            except self._no_script:
                # The server lost its script cache (restart, SCRIPT FLUSH): load the scripts
                # and retry once (a mark already applied by the first try is a check now).
                self._redis.script_load(WRITE_IF_NEWER)
                self._redis.script_load(MARK_WRITES)
                return self._write_pipeline(keys, args, items, mark)
        except self._errors as exc:
            raise OnlineStoreError(f"redis write failed: {exc}") from exc

    def _write_pipeline(
        self,
        keys: list[str],
        args: list[Any],
        items: Sequence[tuple[Any, ...]],
        mark: Mark | None,
    ) -> bool:
        results = self._run_pipeline(keys, args, items, mark)
        return mark is None or bool(results[-1])

    def _run_pipeline(
        self,
        keys: list[str],
        args: list[Any],
        items: Sequence[tuple[Any, ...]],
        mark: Mark | None,
    ) -> list[Any]:
        """One round trip: the script by its SHA (``EVALSHA``; a pipeline running a
        registered script would first ask ``SCRIPT EXISTS``, a second round trip per write).
        Records are written only if newer, so a retry after ``NOSCRIPT`` rewrites nothing.
        ``items`` (tuples led by an item id) enter the reverse map; returns the pipeline's
        results: the ``HSET`` of the reverse map if any, one count per script chunk, ...."""
        p = self._prefix
        pipe = self._redis.pipeline(transaction=False)
        if items:
            pipe.hset(item_ids_key_name(p), mapping={str(item_key(i[0])): i[0] for i in items})
        sha = self._write.sha
        for start in range(0, len(keys), SCRIPT_CHUNK):
            chunk = keys[start : start + SCRIPT_CHUNK]
            chunk_args = args[4 * start : 4 * (start + len(chunk))]
            pipe.evalsha(sha, len(chunk), *chunk, *chunk_args)
        if keys:
            pipe.set(layout_key_name(p), LAYOUT_VERSION)
        if mark is not None:
            # after the records: a count the store holds implies the records before it
            pipe.evalsha(self._mark.sha, 1, generation_key_name(p), mark.part, str(mark.prev),
                         str(mark.new), self._token, str(time.time_ns() // 1_000_000))
        return list(pipe.execute())

    def _read_hashes(self, keys: list[str]) -> list[list[Any]]:
        try:
            pipe = self._redis.pipeline(transaction=False)
            for k in keys:
                pipe.hmget(k, ["as_of", "v"])
            return list(pipe.execute())
        except self._errors as exc:
            raise OnlineStoreError(f"redis read failed: {exc}") from exc

    def read_users(self, user_ids: Sequence[str]) -> list[UserFeatures | None]:
        rows = self._read_hashes([user_key_name(self._prefix, u) for u in user_ids])
        return [
            decode_user(u, as_of, v) if as_of is not None and v is not None else None
            for u, (as_of, v) in zip(user_ids, rows, strict=True)
        ]

    def read_items(self, item_ids: Sequence[str]) -> list[ItemFeatures | None]:
        rows = self._read_hashes([item_key_name(self._prefix, i) for i in item_ids])
        return [
            decode_item(i, as_of, v) if as_of is not None and v is not None else None
            for i, (as_of, v) in zip(item_ids, rows, strict=True)
        ]

    def read_trending(self, n: int) -> Trending | None:
        rows: list[Any] = self._read_hashes([trending_key_name(self._prefix)])
        as_of, v = rows[0]
        if as_of is None or v is None:
            return None
        return decode_trending(as_of, v, n)

    def read_item_ids(self, keys: Sequence[int]) -> list[str | None]:
        if not keys:
            return []
        try:
            fields = [str(k) for k in keys]
            raw: Any = self._redis.hmget(item_ids_key_name(self._prefix), fields)
        except self._errors as exc:
            raise OnlineStoreError(f"redis read failed: {exc}") from exc
        return [r.decode() if isinstance(r, bytes) else r for r in raw]


def _check_seqs(name: str, seqs: Sequence[int] | None, records: Sequence[Any]) -> None:
    if seqs is not None and len(seqs) != len(records):
        raise ValueError(f"{name} has {len(seqs)} entries for {len(records)} records")
