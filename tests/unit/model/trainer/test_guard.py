"""The quality guard's decision logic (model.trainer.guard_rule), on hand-made scored heads
(``guard_traffic.Traffic``): benign shifts of traffic never hold, regressions do."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from model.artifact.registry import Registry
from model.trainer.guard_rule import MIN_EVIDENCE, THRESHOLD, Cusum, Guard, RowSignals
from tests.unit.model.artifact.test_artifact import make
from tests.unit.model.trainer.guard_traffic import Traffic, healthy, paired


def _until_hold(guard: Guard, traffic: Traffic, limit: int, head: int = 32,
                **shift: Any) -> int:
    """Rows of ``shift`` fed (a check after each head) until the guard holds; -1: never."""
    for n in range(head, limit + 1, head):
        guard.observe(traffic.rows(head, **shift))
        if not guard.check().publishes:
            return n
        guard.published(f"d{n}", full=False)
    return -1


def test_off_with_margin_zero_publishes_whatever_the_rows() -> None:
    traffic = Traffic(1)
    guard = Guard(0.0, 100)
    traffic.feed(guard, 1000)
    guard.published("v1", full=True)
    traffic.feed(guard, 1000, random_share=1.0, broken=True)
    assert guard.check().action == "publish"
    assert not guard.held


def test_no_reference_no_judgement_of_the_rates() -> None:
    guard = Guard(0.2, 100)
    Traffic(2).feed(guard, 640, random_share=1.0)
    assert guard.check().action == "publish"  # no healthy publication yet
    guard.published("v1", full=True)
    # random targets: ranked outside the top 100 19 times in 20, rare half the time
    assert guard.cusums["unexplained"].p0 == pytest.approx(0.475, abs=0.06)


@pytest.mark.parametrize("shift", [
    {}, {"new_users": True}, {"tail": 0.08}, {"users": 20}, {"served_better": 0.0},
])
def test_benign_traffic_never_holds(shift: dict[str, Any]) -> None:
    """A steady stream, a burst of new users (no histories), a slightly longer tail, a
    handful of users, the served state equal to the trained one: 20,000 rows, no hold."""
    users = shift.pop("users", 500)
    traffic = Traffic(3, users=users)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    healthy(guard, traffic)
    assert _until_hold(guard, traffic, 20_000, **shift) == -1
    assert guard.holds == 0


def test_a_replayed_user_old_events_are_not_a_lost_history() -> None:
    """A replayed (older) event's point-in-time history is empty when the user's history
    already holds newer events: not judged. A history empty twice running, at event times
    no older than the user's last, is."""
    lost = RowSignals()._lost
    assert np.isnan(lost([1, 2], [3, 0], [100, 100])).all()  # first sight: nothing to lose
    assert lost([1], [4], [110]).tolist() == [0.0]  # a history again
    assert np.isnan(lost([1, 1, 1], [0, 0, 0], [50, 60, 70])).all()  # a replay of older events
    assert np.isnan(lost([1], [0], [120])).all()  # empty once, now: not yet
    assert lost([1], [1], [130]).tolist() == [0.0]
    assert np.isnan(lost([1], [0], [140])).all()
    assert lost([1], [0], [150]).tolist() == [1.0]  # twice running: lost
    assert np.isnan(lost([2], [0], [160])).all()  # never seen with a history: not judged


def test_worse_recall_alone_is_not_a_regression() -> None:
    """Traffic the model predicts less well (a new mix, a new catalogue) lowers the trained
    and the served state's hits alike: no hold, whatever the recall does."""
    traffic = Traffic(4)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    healthy(guard, traffic)
    before = guard.recent.value
    assert _until_hold(guard, traffic, 5000, new_users=True, tail=0.04) == -1
    for _ in range(40):  # nothing hits at all: both states miss every row alike
        rows = traffic.rows(32, new_users=True)
        traffic.served = rows.ranks + 50
        guard.observe(type(rows)(rows.hits * 0, rows.ranks + 50, rows.candidates,
                                 rows.user_keys, rows.item_keys, rows.history))
        assert guard.check().publishes
    assert guard.recent.value < before / 2


@pytest.mark.parametrize(("shift", "signal"), [
    ({"random_share": 0.3}, "unexplained"),
    ({"broken": True}, "lost_history"),
    ({"bot_share": 0.3}, "one_user"),
    ({"served_better": 0.1}, "paired"),
])
def test_a_regression_holds_within_2000_rows_and_names_its_signal(
    shift: dict[str, Any], signal: str,
) -> None:
    traffic = Traffic(5)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    healthy(guard, traffic)
    rows = _until_hold(guard, traffic, 2000, **shift)
    assert 0 < rows <= 2000, guard.status()
    assert guard.last is not None and guard.last.reason.startswith(signal), guard.last
    assert rows >= MIN_EVIDENCE


def test_a_hold_rolls_back_to_the_newest_full_version_before_the_evidence() -> None:
    traffic = Traffic(6)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    healthy(guard, traffic)  # v190 the newest full version, then v190#1..#9
    traffic.feed(guard, 20, head=20, random_share=1.0)  # the evidence begins: too few rows
    assert guard.check().publishes
    guard.published("v60", full=True)
    decision = None
    for i in range(1, 60):
        traffic.feed(guard, 32, random_share=0.3)
        decision = guard.check()
        if not decision.publishes:
            break
        guard.published(f"v60#{i}", full=False)
    assert decision is not None and decision.action == "hold"
    assert decision.suspect and decision.suspect[0] == "v60"
    assert decision.rollback_to == "v190"


def test_a_burst_since_the_last_publication_holds_with_nothing_served_suspect() -> None:
    traffic = Traffic(7)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    healthy(guard, traffic)
    traffic.feed(guard, 128, random_share=1.0)
    d = guard.check()
    assert d.action == "hold" and guard.held
    # nothing trained on the burst was published; the publication just before it may be
    # suspect (a CUSUM's excursion can begin on an ordinary row a few rows earlier)
    assert d.suspect in ((), ("v190#9",)) and d.rollback_to in (None, "v190")
    assert guard.check().action == "held"


def test_resumes_after_min_scored_rows_without_a_trip_and_keeps_its_references() -> None:
    traffic = Traffic(8)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    healthy(guard, traffic)
    p0 = guard.detectors["unexplained"].p0
    traffic.feed(guard, 128, random_share=1.0)
    assert guard.check().action == "hold"
    traffic.feed(guard, 480)
    assert guard.check().action == "held"  # fewer than min_scored rows since the hold
    traffic.feed(guard, 64)
    d = guard.check()
    assert d.action == "resume" and d.publishes and not guard.held
    guard.published("v99", full=True)
    assert guard.detectors["unexplained"].p0 == p0  # the burst's rows do not move it


def test_a_regression_that_goes_on_keeps_holding() -> None:
    traffic = Traffic(9)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    healthy(guard, traffic)
    traffic.feed(guard, 512, bot_share=0.5)
    assert guard.check().action == "hold"
    for _ in range(30):
        traffic.feed(guard, 64, bot_share=0.5)
        assert guard.check().action == "held"


def test_cusum_false_alarms_are_rare_at_the_reference_rate() -> None:
    """200 runs of 5,000 rows at the reference rate: no trip (the threshold allows
    ``FALSE_ALARM`` per excursion); the same CUSUM trips on the tested rate."""
    rng = np.random.default_rng(10)
    trips = 0
    for _ in range(200):
        c = Cusum(0.2, 0.1)
        c.add((rng.random(5000) < 0.1).astype(np.float64), 0)
        trips += c.tripped
    assert trips == 0
    c = Cusum(0.2, 0.1)
    c.add((rng.random(400) < 0.3).astype(np.float64), 1000)
    assert c.tripped and c.s >= THRESHOLD and c.start >= 1000
    assert THRESHOLD == pytest.approx(math.log(1e4))
    high = Cusum(0.2, 0.9)  # a rate that cannot rise by the shift is not judged
    high.add(np.ones(1000), 0)
    assert not high.active and not high.tripped


def test_bad_arguments_refused() -> None:
    with pytest.raises(ValueError):
        Guard(1.0, 10)
    with pytest.raises(ValueError):
        Guard(0.2, 0)


class _Deltas:
    def __init__(self) -> None:
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1


def _service(tmp_path: Path, guard: Guard) -> Any:
    """The service's guard glue (``GuardedPublishing``, as ``TrainerService._guarded``
    calls it) on a real registry, without a trainer."""
    from model.trainer.guard_publishing import GuardedPublishing
    from model.trainer.metrics import TrainerMetrics


    reg = Registry(tmp_path, "tt", keep=10)
    for v in ("v1", "v2", "v3"):
        reg.publish(v, lambda d, v=v: make(d, version=v))
    glue = GuardedPublishing(guard, reg, TrainerMetrics(), lambda: datetime.now(UTC))
    deltas = _Deltas()
    return SimpleNamespace(glue=glue, registry=reg, metrics=glue.metrics, deltas=deltas,
                           _guarded=lambda: glue.allows(deltas))


def _decline(svc: Any, guard: Guard, traffic: Traffic, published: str) -> None:
    """Random targets after ``published`` was served, a delta each head, until it holds."""
    seq = 0
    while svc._guarded():
        if seq:
            guard.published(f"{published}#{seq}", full=False)
        traffic.feed(guard, 32, random_share=0.5)
        seq += 1


def _served_v3_after_v1_v2(svc: Any, guard: Guard, traffic: Traffic) -> None:
    for v in ("v1", "v2"):  # healthy versions, v2 long before the decline
        traffic.feed(guard, 6400)
        assert svc._guarded()
        guard.published(v, full=True)
    traffic.feed(guard, 640)
    traffic.feed(guard, 20, head=20, random_share=1.0)  # the decline begins: too few rows
    assert svc._guarded()
    guard.published("v3", full=True)  # served, then the decline shows


def test_the_loop_pins_the_healthy_version_on_a_served_suspect_and_unpins_on_resume(
    tmp_path: Path,
) -> None:
    traffic = Traffic(11)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    svc = _service(tmp_path, guard)
    _served_v3_after_v1_v2(svc, guard, traffic)
    _decline(svc, guard, traffic, "v3")
    assert svc.registry.current() == "v2" and svc.registry.pinned() == "v2"
    note = svc.registry.guard()
    assert note["held"] and note["pinned"] == "v2" and note["suspect"][0] == "v3"
    assert note["reason"].startswith("unexplained")
    assert svc.metrics.guard_held._value.get() == 1
    traffic.feed(guard, 600)
    assert svc._guarded()
    assert svc.deltas.resets == 1  # a new full version (a new lineage) comes next...
    assert svc.registry.current() == "v2"  # ...and until it is out, serving stays on v2
    assert not svc.registry.guard()["held"]
    svc.registry.publish("v4", lambda d: make(d, version="v4"))  # the version after resume
    assert svc.registry.current() == "v2"  # still pinned while it is being published
    svc.glue.published("v4", full=True)  # what export() does once that version is out
    assert svc.registry.pinned() is None and svc.registry.current() == "v4"
    assert svc.registry.guard()["pinned"] is None


def test_a_pin_by_hand_is_left_alone(tmp_path: Path) -> None:
    traffic = Traffic(12)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    svc = _service(tmp_path, guard)
    for v in ("v1", "v2"):
        traffic.feed(guard, 6400)
        guard.published(v, full=True)
    svc.registry.pin("v3")
    traffic.feed(guard, 640)
    traffic.feed(guard, 20, head=20, random_share=1.0)
    guard.published("v3", full=True)
    _decline(svc, guard, traffic, "v3")
    assert guard.last is not None and guard.last.rollback_to == "v2"  # would roll back...
    assert svc.registry.pinned() == "v3" and svc.glue.pin is None  # ...but the pin wins


def test_a_restarted_trainer_keeps_holding_against_the_same_references(tmp_path: Path) -> None:
    import json

    from model.trainer.checkpoint import LoopState

    traffic = Traffic(13)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    svc = _service(tmp_path, guard)
    _served_v3_after_v1_v2(svc, guard, traffic)
    _decline(svc, guard, traffic, "v3")
    reference, holds = guard.reference, guard.holds
    p0 = {name: c.p0 for name, c in guard.cusums.items()}
    assert guard.held and svc.glue.pin == "v2"
    # what TrainerService.checkpoint saves and restore reads back (the store's JSON)
    saved = json.loads(json.dumps(LoopState(guard=svc.glue.to_json()).to_json()))
    fresh = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    again = _service(tmp_path / "again", fresh)
    again.glue.registry = svc.registry
    again.glue.restore(LoopState.from_json(saved).guard or {})
    assert fresh.held and fresh.reference == reference and fresh.holds == holds
    assert {name: c.p0 for name, c in fresh.cusums.items()} == p0
    assert fresh.shares["one_user"].reference == guard.shares["one_user"].reference
    assert again.glue.pin == "v2" and again.metrics.guard_held._value.get() == 1
    traffic.feed(fresh, 480)
    assert fresh.check().action == "held"  # still min_scored rows after the hold to go
    traffic.feed(fresh, 64)
    assert again.glue.allows(again.deltas) and again.deltas.resets == 1
    again.glue.published("v4", full=True)  # the new lineage after the resume drops the pin
    assert svc.registry.pinned() is None
    # a guard that never held restores as not holding, with no reference yet
    idle = Guard(0.2, 500)
    idle.restore(Guard(0.2, 500).to_json())
    assert not idle.held and idle.reference is None and idle.check().action == "publish"


def test_a_rollback_skips_versions_the_registry_pruned(tmp_path: Path) -> None:
    from model.trainer.guard_rule import Decision

    svc = _service(tmp_path, Guard(0.2, 500))  # the registry holds v1, v2, v3
    d = Decision("hold", 0.1, 0.3, 1000, "unexplained: ...", "v9", ("v9#1",),
                 ("v9", "v8", "v2", "v1"))
    svc.glue.rollback(d)
    assert svc.registry.pinned() == "v2" and svc.glue.pin == "v2"
    gone = Decision("hold", 0.1, 0.3, 1000, "unexplained: ...", "v9", ("v9#1",), ("v9",))
    svc.glue.unpin()
    svc.glue.rollback(gone)  # nothing before the evidence is left: serving stays
    assert svc.registry.pinned() is None and svc.glue.pin is None


def test_unexplained_is_a_target_outside_the_top_100_that_the_traffic_hardly_goes_to() -> None:
    from model.trainer.guard_rule import BACKFILL_MS, RARE, UNEXPLAINED_RANK
    from model.trainer.rolling import ScoredRows

    def row(rank: int, rarity: float, history: bool = True, ts: int = 0) -> ScoredRows:
        h = np.array([[5, 6]]) if history else np.zeros((1, 2), np.int64)
        return ScoredRows(np.zeros(1), np.array([rank]), 1000, np.array([1]), np.array([2]), h,
                          np.array([ts], np.int64), np.array([rarity]))

    now = 10 * BACKFILL_MS
    signals = RowSignals()

    def unexplained(r: ScoredRows) -> list[float]:
        return signals.signals(r, None)["unexplained"].tolist()

    assert unexplained(row(UNEXPLAINED_RANK, RARE, ts=now)) == [1.0]
    assert unexplained(row(900, 3.0, history=False, ts=now)) == [1.0]  # a cold user alike
    assert unexplained(row(UNEXPLAINED_RANK - 1, 3.0, ts=now)) == [0.0]  # the model's guess
    assert unexplained(row(900, RARE - 0.01, ts=now)) == [0.0]  # what the traffic goes to
    for old_or_unknown in (row(900, 3.0, ts=now - BACKFILL_MS - 1), row(-1, np.inf, ts=now),
                           row(900, np.nan, ts=now)):  # NaN: too few targets seen yet
        assert np.isnan(signals.signals(old_or_unknown, None)["unexplained"]).all()
    assert signals.unjudged == {"backfill": 1, "not_a_candidate": 1, "warming_up": 1}


def test_rarity_counts_the_candidates_more_popular_than_the_target_per_recent_item() -> None:
    from model.trainer.rolling import Evaluator, Popularity

    seen: list = []
    ev = Evaluator(k=2)
    ev.listeners.append(seen.append)
    head = SimpleNamespace(user_keys=np.array([7, 8, 9, 9]), item_keys=np.array([1, 2, 3, 4]),
                           history=np.zeros((4, 2), np.int64), times=None)
    ev.popularity = Popularity(recent=3)
    ev.popularity.observe(np.array([1, 2, 1]))  # two distinct items among the recent targets
    # the prior's q: item 1 the most popular of late, then 2, then 3
    ev.set_candidates(np.array([1, 2, 3]), np.zeros((3, 2), np.float32),
                      np.log(np.array([5.0, 3.0, 2.0]) / 1000))
    ev.evaluate(np.zeros((4, 3), np.float32), np.array([0, 1, 2, -1]), head=head)
    assert seen[0].rarity.tolist() == [0.0, 0.5, 1.0, np.inf]
    counted = Evaluator(k=2)  # without a prior: the counts so far
    counted.popularity = Popularity(recent=6)
    counted.listeners.append(seen.append)
    counted.popularity.observe(np.array([1, 1, 1, 2, 3, 3]))
    counted.set_candidates(np.array([1, 2, 3]), np.zeros((3, 2), np.float32))
    counted.evaluate(np.zeros((4, 3), np.float32), np.array([0, 1, 2, -1]), head=head)
    assert seen[1].rarity == pytest.approx([0.0, 2 / 3, 1 / 3, np.inf])
    ring = Popularity(recent=4)  # the recent targets are the last ones only
    ring.observe(np.array([1, 2, 3]))
    assert ring.recent_items == 0  # too few seen to say
    ring.observe(np.array([4, 4, 4]))
    assert ring.recent_items == 2
    ring.observe(np.arange(10, 20))
    assert ring.recent_items == 4
    fresh = Evaluator(k=2)
    fresh.listeners.append(seen.append)
    fresh.set_candidates(np.array([1, 2, 3]), np.zeros((3, 2), np.float32))
    fresh.evaluate(np.zeros((4, 3), np.float32), np.array([0, 1, 2, -1]), head=head)
    assert np.isnan(seen[2].rarity).all()


def test_a_bot_rolls_back_to_the_version_before_its_window_after_a_restart() -> None:
    """The concentration's evidence is numbered like the guard's rows, restored ones too."""
    import json

    traffic = Traffic(14)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    healthy(guard, traffic)  # v190 the newest full version
    again = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    again.restore(json.loads(json.dumps(guard.to_json())))
    traffic.feed(again, 2000)
    again.published("v300", full=True)
    traffic.feed(again, 2000)
    again.published("v300#1", full=False)
    d = None
    for _ in range(40):
        traffic.feed(again, 64, bot_share=0.5)
        d = again.check()
        if not d.publishes:
            break
    assert d is not None and d.action == "hold" and d.reason.startswith("one_user")
    assert d.rollback_to == "v300" and d.suspect == ("v300#1",)


def test_a_checkpoint_of_other_signals_restores_the_hold_not_their_references() -> None:
    import json

    from model.trainer.guard_rule import SIGNALS_VERSION

    traffic = Traffic(15)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    healthy(guard, traffic)
    state = json.loads(json.dumps(guard.to_json()))
    assert state["signals_version"] == SIGNALS_VERSION
    same = Guard(0.2, 500, reference_rows=5000)
    same.restore(state)
    assert same.cusums["unexplained"].p0 == guard.cusums["unexplained"].p0
    state["signals_version"] = SIGNALS_VERSION - 1
    other = Guard(0.2, 500, reference_rows=5000)
    other.restore(state)
    assert other.cusums["unexplained"].p0 is None and other.scored == guard.scored
    del state["signals_version"]  # a checkpoint from before the versions: the first meaning
    older = Guard(0.2, 500, reference_rows=5000)
    older.restore(state)
    assert older.cusums["unexplained"].p0 is None


def test_a_long_burst_does_not_make_itself_the_traffic_it_is_judged_against() -> None:
    """Random targets swell the recent targets' distinct items, which would make them look
    less rare as the burst goes on: the guard measures rarity by its healthy figure."""
    from dataclasses import replace

    traffic = Traffic(16)
    guard = paired(Guard(0.2, 500, reference_rows=5000), traffic)
    for i in range(200):  # healthy: 1,000 distinct items among the recent targets
        guard.observe(replace(traffic.rows(64), recent_items=1000))
        assert guard.check().publishes
        guard.published(f"v{i}", full=i % 10 == 0)
    held = 0
    for k in range(100):  # 3,200 rows of a burst: each random item one more distinct item
        rows = traffic.rows(32, random_share=0.5)
        assert rows.rarity is not None
        items = 1000 + 16 * (k + 1)
        guard.observe(replace(rows, rarity=rows.rarity * 1000 / items, recent_items=items))
        d = guard.check()
        held += not d.publishes
        if d.publishes:
            guard.published("burst", full=False)
    assert guard.holds >= 1 and held >= 95, (guard.holds, held)
    signals = RowSignals()
    row = replace(traffic.rows(1), ranks=np.array([900]), rarity=np.array([0.6]),
                  recent_items=2000)
    assert signals.signals(row, None)["unexplained"].tolist() == [0.0]
    assert signals.signals(row, None, recent_items=1000)["unexplained"].tolist() == [1.0]
