"""What the feature job's keyed stages share: state handling. A :class:`StateCache` of
unpacked states in front of a keyed ``MapState`` (with the Redis TTL), states written back once
per batch, the store generation of each part (``stream.flink.rehydrate``) and local metric
counts. The stages themselves are :mod:`stream.flink.functions`."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from pyflink.common.time import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, StateTtlConfig, ValueStateDescriptor

from feature_store.features import FeatureParams
from feature_store.store import Mark, open_store
from stream.flink.rehydrate import CHECK_EVERY_S, REHYDRATE_TICK_MS, PartGuard, RetryingWrites
from stream.gc_tuning import tune_gc
from streamrec.settings import Settings


class StateCache:
    """This subtask's unpacked states by id, in front of a keyed ``MapState``.

    Only this subtask writes the keys of its buckets, and every batch writes the states it
    touched through (``put_all``), so an entry equals what the ``MapState`` holds, except where
    the state's TTL expired it there (processing time since its last write): an entry older
    than ``ttl_s`` is dropped when next used. At most ``capacity`` entries; when full, the
    least recently used half goes. A new function instance (restart, restore) starts empty.
    """

    def __init__(self, capacity: int, ttl_s: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[Any, float]] = {}

    def get(self, key: str, now_s: float) -> Any:
        """The state of ``key``, or ``None`` if not cached (or expired)."""
        entry = self._entries.pop(key, None)
        if entry is None or (self.ttl_s > 0 and now_s - entry[1] > self.ttl_s):
            return None
        self._entries[key] = entry  # most recently used last
        return entry[0]

    def put_all(self, states: dict[str, Any], now_s: float) -> None:
        """Cache ``states`` as written at ``now_s``."""
        entries = self._entries
        for key, state in states.items():
            entries.pop(key, None)
            entries[key] = (state, now_s)
        if len(entries) > self.capacity:
            for key in list(itertools.islice(entries, len(entries) - self.capacity // 2)):
                del entries[key]

    def __len__(self) -> int:
        return len(self._entries)


def _ttl_descriptor(descriptor: Any, ttl_s: int) -> Any:
    if ttl_s > 0:
        # State of a key idle for the Redis TTL is dropped too (processing time, as Redis).
        # Explicit incremental cleanup: PyFlink's default background cleanup builds a
        # RocksDB filter config through a Py4J gateway, which a TaskManager does not have.
        ttl = (
            StateTtlConfig.new_builder(Time.seconds(ttl_s))
            .disable_cleanup_in_background()
            .cleanup_incrementally(10, False)
            .build()
        )
        descriptor.enable_time_to_live(ttl)
    return descriptor


class Stage(KeyedProcessFunction):
    """What the stages share: settings, feature parameters, the store, local metric counts,
    and the store generation of each part (``stream.flink.rehydrate``)."""

    #: part -> its generation bookkeeping; None (off) until ``_generation`` runs in ``open``
    #: (the unit tests of the batch logic build stages without it).
    _guards: dict[str, PartGuard] | None = None
    _part_prefix = ""

    def __init__(self, settings_json: str, bucket_ms: int, cache_size: int = 0) -> None:
        self._settings_json = settings_json
        self._bucket_ms = bucket_ms
        self._cache_size = cache_size

    def _setup(self, runtime_context: RuntimeContext) -> None:
        tune_gc()
        settings = Settings(**json.loads(self._settings_json))
        self.params = FeatureParams.from_settings(settings.features, bucket_ms=self._bucket_ms)
        self.store = RetryingWrites(open_store(settings))
        self.metrics = runtime_context.get_metrics_group()
        self._counters: dict[str, Any] = {}
        self._counts: dict[str, int] = {}

    def _keyed_states(
        self, runtime_context: RuntimeContext, name: str, ttl_s: int, unpack: Any, new: Any
    ) -> None:
        """The stage's ``MapState`` (id -> packed state) and the cache in front of it."""
        descriptor = MapStateDescriptor(name, Types.STRING(), Types.PICKLED_BYTE_ARRAY())
        self.states = runtime_context.get_map_state(_ttl_descriptor(descriptor, ttl_s))
        self.cache = StateCache(self._cache_size, ttl_s)
        self._unpack, self._new = unpack, new

    def _touch(self, touched: dict[str, Any], key: str, now_s: float) -> Any:
        """The state of ``key``, entered in ``touched`` (the batch's states): from the batch,
        else the cache, else Flink's ``MapState`` (unpacked), else a new one."""
        state = touched.get(key)
        if state is None:
            state = self.cache.get(key, now_s)
            if state is None:
                packed = self.states.get(key)
                state = self._unpack(packed) if packed is not None else self._new()
            touched[key] = state
        return state

    def _write_back(self, touched: dict[str, Any], pack: Any, now_s: float) -> None:
        self.states.put_all({key: pack(state) for key, state in touched.items()})
        self.cache.put_all(touched, now_s)

    def _generation(self, runtime_context: RuntimeContext, part_prefix: str) -> None:
        """Count write batches per part in keyed state and check them against the store."""
        self._part_prefix = part_prefix
        self._guards = {}
        self.writes = runtime_context.get_state(ValueStateDescriptor("writes", Types.LONG()))
        self._counter("store_rehydrated")

    def _guard(self, ctx: Any) -> PartGuard | None:
        """The current key's part, or None when the generation is off."""
        if self._guards is None:
            return None
        key = ctx.get_current_key()
        part = f"{self._part_prefix}/{key if isinstance(key, str) else key[0]}"
        guard = self._guards.get(part)
        if guard is None:
            guard = self._guards[part] = PartGuard(part, self.store)
        return guard

    def _write_marked(
        self, guard: PartGuard | None, write: Callable[[Mark | None], Any], now_s: float
    ) -> None:
        """``write(mark)`` with the part's next mark (``write(None)`` when the generation is
        off); a verdict of "behind" starts the part's rehydration."""
        if guard is None:
            write(None)
            return
        writes = (self.writes.value() or 0) + 1
        self.writes.update(writes)
        guard.after_write(write(guard.mark(writes)) is not False, now_s)

    def _tend(self, guard: PartGuard | None, ctx: Any, now_s: float) -> None:
        """After a batch and on the part's timer: check the store when due, re-write one
        chunk while rehydrating, keep one timer armed."""
        if guard is None:
            return
        writes = self.writes.value() or 0
        if guard.check_due(now_s):
            guard.check(writes, now_s)
        if guard.rehydrating:
            self._counts["store_rehydrated"] += guard.step(
                self._state_keys, lambda keys: self._rewrite(keys, now_s), writes, now_s)
            self._publish_metrics()
        timers = ctx.timer_service()
        delay = REHYDRATE_TICK_MS if guard.rehydrating else int(CHECK_EVERY_S * 1000)
        at = timers.current_processing_time() + delay
        if guard.timer_at is None or at < guard.timer_at:
            timers.register_processing_time_timer(at)
            guard.timer_at = at

    def _on_check_timer(self, timestamp: int, ctx: Any) -> None:
        guard = self._guard(ctx)
        if guard is None or guard.timer_at not in (None, timestamp):
            return  # a superseded timer (an earlier one was armed since)
        guard.timer_at = None
        self._tend(guard, ctx, time.time())

    def _state_keys(self) -> Iterable[str]:
        """The ids of the current key's states (what a rehydration re-writes)."""
        return list(self.states.keys())

    def _rewrite(self, keys: list[str], now_s: float) -> int:
        """Write the records of ``keys`` from their states again; returns how many."""
        raise NotImplementedError

    def _states_of(self, keys: list[str], now_s: float) -> dict[str, Any]:
        out = {}
        for key in keys:
            state = self.cache.get(key, now_s)
            if state is None:
                packed = self.states.get(key)
                if packed is None:
                    continue  # expired since it was listed
                state = self._unpack(packed)
            out[key] = state
        return out

    def _counter(self, name: str) -> None:
        self._counters[name] = self.metrics.counter(name)
        self._counts[name] = 0

    def _publish_metrics(self) -> None:
        for name, n in self._counts.items():
            if n:
                self._counters[name].inc(n)
                self._counts[name] = 0

    def _ttl(self, field: str) -> int:
        return int(json.loads(self._settings_json)["features"][field])

    def close(self) -> None:
        self._publish_metrics()
        self.store.close()
