"""The store generation without services: the feature job's parts re-write their state when the
store lost writes (``stream.flink.rehydrate``), and serving's reading of it
(``serving.store_health``). The Redis script itself is tested on a real Redis in
``tests/integration/test_store_generation.py``."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyflink")

from feature_store.features import UserState, unpack_user, user_features
from feature_store.redis_store import decode_user, encode_user_values
from feature_store.store import Generation, Mark
from serving.store_health import LOST, REHYDRATING, UNKNOWN, WHOLE, StoreHealth
from stream.cli.features import settings_json
from stream.flink.functions import StateCache, UserBatchStage, user_input
from stream.flink.rehydrate import PartGuard
from streamrec.settings import DEFAULT_EVENT_WEIGHTS, load_settings
from tests.unit.stream.flink.test_flink_functions import (
    FakeCounter,
    FakeCtx,
    FakeMapState,
    FakeState,
    wire,
)

T0 = 1_700_000_040_000


class MemoryStore:
    """User records and the generation hash, with the rule of ``MARK_WRITES``."""

    def __init__(self) -> None:
        self.users: dict[str, Any] = {}
        self.gen: dict[str, str] = {}
        self.finished: list[tuple[str, int]] = []

    def _mark(self, mark: Mark | None) -> bool:
        if mark is None:
            return True
        self.gen.setdefault("epoch", "e1")
        if f"r:{mark.part}" in self.gen:
            return False
        if int(self.gen.get(f"w:{mark.part}", 0)) < mark.prev:
            self.gen[f"r:{mark.part}"] = "1"
            return False
        self.gen[f"w:{mark.part}"] = str(mark.new)
        return True

    def write_batch(self, mark: Mark | None = None, **kw: Any) -> bool:
        return self._mark(mark)

    def write_user_rows(self, rows: Any, mark: Mark | None = None) -> bool:
        for uid, as_of, _seq, h, c, ls in rows:
            self.users[uid] = decode_user(uid, str(as_of), encode_user_values(h, c, ls))
        return self._mark(mark)

    def finish_rehydration(self, part: str, writes: int) -> None:
        self.gen[f"w:{part}"] = str(writes)
        self.gen.pop(f"r:{part}", None)
        self.finished.append((part, writes))

    def read_generation(self) -> Generation | None:
        g = self.gen
        return Generation(g.get("epoch"), int(g.get("since", 0)),
                          {k[2:]: int(v) for k, v in g.items() if k.startswith("w:")},
                          {k[2:]: int(v) for k, v in g.items() if k.startswith("r:")})

    def close(self) -> None:
        pass


class KeyedCtx(FakeCtx):
    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    def get_current_key(self) -> Any:
        return (self.key,)  # a Row of the bucket, as keyed_by_first_field gives it


class KeyedMapState(FakeMapState):
    def keys(self) -> list[str]:
        return list(self.by_key.get(self.key, {}))


def stage_with_generation(store: MemoryStore) -> UserBatchStage:
    from feature_store.features import FeatureParams

    params = FeatureParams(event_weights=DEFAULT_EVENT_WEIGHTS, history_len=3)
    stage = UserBatchStage(settings_json(load_settings()), 60_000, "ev", 10)
    stage.params, stage.store = params, store  # type: ignore[assignment]
    stage._counters, stage._counts = {}, {}
    stage.states = KeyedMapState()
    stage.cache = StateCache(10, 0)  # smaller than the users: rehydration reads MapState too
    stage._unpack, stage._new = unpack_user, UserState
    stage._types = frozenset(params.event_weights)
    for name in ("events_bad", "events_duplicate", "events_late", "events_applied",
                 "samples_emitted", "store_rehydrated"):
        stage._counters[name] = FakeCounter()
        stage._counts[name] = 0
    stage._part_prefix, stage._guards = "users", {}
    stage.writes = FakeState()
    return stage


def feed(stage: UserBatchStage, ctx: KeyedCtx, events: list[tuple[str, str, int]],
         offset: int) -> None:
    from feature_store.features import Event

    values = [user_input(u, 0, offset + n, wire(Event(eid, u, "i1", "click", ts)))
              for n, (eid, u, ts) in enumerate(events)]
    list(stage.process_element(values, ctx))  # type: ignore[arg-type]


def expected(stage: UserBatchStage) -> dict[str, Any]:
    return {u: user_features(unpack_user(p), u, stage.params)
            for u, p in stage.states.all().items()}


def test_a_store_that_lost_everything_gets_every_user_back_in_chunks() -> None:
    store = MemoryStore()
    stage = stage_with_generation(store)
    ctx = KeyedCtx("3")
    feed(stage, ctx, [(f"e{n}", f"u{n}", T0 + n) for n in range(40)], 0)
    assert store.users == expected(stage) and store.gen["w:users/3"] == "1"
    stage._guards["users/3"].chunk = 7  # type: ignore[index]

    store.users.clear()
    store.gen.clear()  # Redis restarted empty
    feed(stage, ctx, [("late", "u99", T0 + 100)], 40)
    guard = stage._guards["users/3"]  # type: ignore[index]
    assert guard.rehydrating and "r:users/3" in store.gen
    assert "u99" in store.users  # new events are written while the part rehydrates
    calls = 1
    while guard.rehydrating:
        assert calls < 20, "rehydration does not finish"
        at = ctx.timers.registered[-1]
        list(stage.on_timer(at, ctx))  # type: ignore[arg-type]
        calls += 1
    assert calls >= 41 // 7  # one chunk per call: new events were never blocked behind it
    assert store.users == expected(stage)
    assert "r:users/3" not in store.gen and store.finished == [("users/3", 2)]
    assert stage._counters["store_rehydrated"].count == 41


def test_a_store_restored_from_an_older_snapshot_is_detected_by_its_write_count() -> None:
    store = MemoryStore()
    stage = stage_with_generation(store)
    ctx = KeyedCtx("a")
    feed(stage, ctx, [("e1", "u1", T0)], 0)
    snapshot = (dict(store.users), dict(store.gen))
    feed(stage, ctx, [("e2", "u2", T0 + 1)], 1)
    feed(stage, ctx, [("e3", "u3", T0 + 2)], 2)
    store.users, store.gen = dict(snapshot[0]), dict(snapshot[1])  # the last writes are lost
    feed(stage, ctx, [("e4", "u1", T0 + 3)], 3)
    assert store.users == expected(stage)  # rehydrated in the same call (one chunk)
    assert set(store.users) == {"u1", "u2", "u3"} and "r:users/a" not in store.gen
    assert store.gen["w:users/a"] == "4"


def test_a_quiet_part_checks_on_its_timer() -> None:
    store = MemoryStore()
    stage = stage_with_generation(store)
    ctx = KeyedCtx("0")
    feed(stage, ctx, [("e1", "u1", T0)], 0)
    store.users.clear()
    store.gen.clear()
    guard = stage._guards["users/0"]  # type: ignore[index]
    guard.last_check_s = float("-inf")  # the check interval has passed
    list(stage.on_timer(ctx.timers.registered[-1], ctx))  # type: ignore[arg-type]
    assert store.users == expected(stage) and not guard.rehydrating


def test_a_restored_job_behind_the_store_does_not_rehydrate() -> None:
    store = MemoryStore()
    store.gen.update({"epoch": "e1", "w:users/1": "9"})  # the store saw writes after the checkpoint
    guard = PartGuard("users/1", store)  # type: ignore[arg-type]
    guard.after_write(store.write_batch(mark=guard.mark(5)), 0.0)
    guard.check(5, 1.0)
    assert not guard.rehydrating and store.gen["w:users/1"] == "5"


class GenStore:
    def __init__(self, gen: Generation | None) -> None:
        self.gen = gen

    def read_generation(self) -> Generation | None:
        return self.gen


def test_store_health_states() -> None:
    clock = [100.0]
    store = GenStore(Generation(None, 0, {}, {}))
    health = StoreHealth(store, ttl_s=0, grace_s=3, monotonic=lambda: clock[0],  # type: ignore[arg-type]
                         wall_ms=lambda: 9_900_000 + int(clock[0] * 1000))
    assert health.status().state == UNKNOWN  # no marker ever seen: nothing claimed
    store.gen = Generation("e1", 0, {"users/0": 4}, {})
    assert health.status().state == WHOLE and not health.status().degraded
    store.gen = Generation(None, 0, {}, {})
    lost = health.status()
    assert lost.state == LOST and lost.degraded and "restarted empty" in (lost.reason or "")
    store.gen = Generation("e2", 9_999_000, {}, {"users/0": 9_999_000})
    assert health.status().state == REHYDRATING and health.status().parts_rehydrating == 1
    store.gen = Generation("e2", 9_999_000, {"users/0": 5}, {})
    assert health.status().state == REHYDRATING  # new epoch: within the grace
    clock[0] += 3.5
    assert health.status().state == WHOLE


def test_writes_are_retried_through_a_short_outage_then_fail() -> None:
    from feature_store.store import OnlineStoreError
    from stream.flink.rehydrate import RetryingWrites

    class Flaky(MemoryStore):
        failures = 3

        def write_user_rows(self, rows: Any, mark: Mark | None = None) -> bool:
            if self.failures:
                self.failures -= 1
                raise OnlineStoreError("connection refused")
            return super().write_user_rows(rows, mark)

    clock = [0.0]

    def sleep(s: float) -> None:
        clock[0] += s

    flaky = Flaky()
    store = RetryingWrites(flaky, deadline_s=5, sleep=sleep, monotonic=lambda: clock[0])  # type: ignore[arg-type]
    rows = iter([("u1", T0, 1, [], {}, T0)])  # a generator: it must survive the retries
    assert store.write_user_rows(rows) is True and "u1" in flaky.users
    assert clock[0] == 0.1 + 0.2 + 0.4

    flaky.failures = 1_000
    with pytest.raises(OnlineStoreError):  # down past the deadline: the task fails
        store.write_user_rows([("u2", T0, 1, [], {}, T0)])
    assert clock[0] <= 0.7 + 5
