"""The quality guard's decision logic (model.trainer.guard_rule), on hand-made hit sequences."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from model.artifact.registry import Registry
from model.trainer.guard_rule import Guard
from tests.unit.model.artifact.test_artifact import make


def _rows(rng: np.random.Generator, n: int, recall: float) -> np.ndarray:
    return (rng.random(n) < recall).astype(np.float64)


def _feed(guard: Guard, rng: np.random.Generator, n: int, recall: float, head: int = 32) -> None:
    for _ in range(n // head):
        guard.observe(_rows(rng, head, recall))


def _healthy(guard: Guard, rng: np.random.Generator, recall: float = 0.3) -> None:
    """Publications every 64 rows over a steady stream until the reference is set."""
    for i in range(60):
        _feed(guard, rng, 64, recall)
        d = guard.check()
        assert d.publishes, d
        guard.published(f"v{i}" if i % 10 == 0 else f"v{i - i % 10}#{i % 10}", full=i % 10 == 0)
    assert guard.reference == pytest.approx(recall, abs=0.05)


def test_off_with_margin_zero_publishes_whatever_the_figures() -> None:
    guard = Guard(0.0, 100)
    guard.observe(np.ones(1000))
    guard.published("v1", full=True)
    guard.observe(np.zeros(1000))
    assert guard.check().action == "publish"
    assert not guard.held


def test_no_reference_no_judgement() -> None:
    guard = Guard(0.2, 100)
    guard.observe(np.zeros(50))
    assert guard.check().action == "publish"  # too few rows, no healthy publication yet
    guard.published("v1", full=True)
    assert guard.reference is None  # 50 rows < min_scored


def test_steady_stream_with_ordinary_noise_never_holds() -> None:
    rng = np.random.default_rng(1)
    guard = Guard(0.2, 500, reference_rows=5000)
    _healthy(guard, rng)
    for i in range(300):  # recall drifting 0.30 -> 0.27 over ~19k rows
        _feed(guard, rng, 64, 0.30 - 0.03 * i / 300)
        assert guard.check().publishes
        guard.published(f"d{i}", full=False)
    assert guard.holds == 0


def test_a_bad_window_holds_before_its_publication_and_nothing_served_is_suspect() -> None:
    rng = np.random.default_rng(2)
    guard = Guard(0.2, 500, reference_rows=5000)
    _healthy(guard, rng)
    guard.observe(np.zeros(64))  # a burst: every row since the last publication misses
    d = guard.check()
    assert d.action == "hold" and guard.held
    assert d.suspect == () and d.rollback_to is None  # serving is on the last healthy state
    assert d.reference is not None and d.reference > 0.2
    assert guard.check().action == "held"


def test_a_slow_decline_trips_the_sliding_figure_and_rolls_back_past_the_evidence() -> None:
    rng = np.random.default_rng(3)
    guard = Guard(0.2, 500, reference_rows=5000)
    _healthy(guard, rng)  # v50 is the newest full version, then v50#1..#9
    before = guard.scored
    decision = None
    for i in range(40):  # recall 0.18: each window alone too small to be sure
        _feed(guard, rng, 32, 0.18)
        decision = guard.check()
        if not decision.publishes:
            break
        guard.published(f"v60#{i}" if i else "v60", full=i == 0)
    assert decision is not None and decision.action == "hold"
    assert decision.current is not None and decision.current < 0.8 * decision.reference
    # everything published within the last min_scored rows is suspect; the rollback goes
    # to the newest full version published before them
    assert decision.suspect and "v60" in decision.suspect
    assert decision.rollback_to == "v50"
    assert guard.scored - before < 500 + 32  # caught within one sliding window of it


def test_resumes_only_after_min_scored_rows_after_the_hold_recover() -> None:
    rng = np.random.default_rng(4)
    guard = Guard(0.2, 500, reference_rows=5000)
    _healthy(guard, rng)
    guard.observe(np.zeros(64))
    assert guard.check().action == "hold"
    _feed(guard, rng, 480, 0.3)
    assert guard.check().action == "held"  # fewer than min_scored rows since the hold
    _feed(guard, rng, 64, 0.3)
    d = guard.check()
    assert d.action == "resume" and d.publishes and not guard.held
    reference = guard.reference
    guard.published("v99", full=True)
    assert guard.reference == reference  # the burst's rows do not lower the reference


def test_a_bad_figure_keeps_holding() -> None:
    rng = np.random.default_rng(5)
    guard = Guard(0.2, 500, reference_rows=5000)
    _healthy(guard, rng)
    guard.observe(np.zeros(64))
    guard.check()
    _feed(guard, rng, 2000, 0.1)
    assert guard.check().action == "held"


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


def test_the_loop_pins_the_healthy_version_on_a_served_suspect_and_unpins_on_resume(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(6)
    guard = Guard(0.2, 500, reference_rows=5000)
    svc = _service(tmp_path, guard)
    for v in ("v1", "v2"):  # healthy versions, v2 long before the decline
        _feed(guard, rng, 3000, 0.3)
        assert svc._guarded()
        guard.published(v, full=True)
    _feed(guard, rng, 640, 0.3)  # v2 more than a sliding window before the decline
    assert svc._guarded()
    guard.published("v3", full=True)  # served, then the decline shows
    seq = 0
    while svc._guarded():  # a delta every head: each window too small to be sure alone
        if seq:
            guard.published(f"v3#{seq}", full=False)
        _feed(guard, rng, 32, 0.18)
        seq += 1
    assert svc.registry.current() == "v2" and svc.registry.pinned() == "v2"
    note = svc.registry.guard()
    assert note["held"] and note["pinned"] == "v2" and note["suspect"][0] == "v3"
    assert svc.metrics.guard_held._value.get() == 1
    _feed(guard, rng, 600, 0.3)
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
    rng = np.random.default_rng(7)
    guard = Guard(0.2, 500, reference_rows=5000)
    svc = _service(tmp_path, guard)
    _feed(guard, rng, 3000, 0.3)
    guard.published("v1", full=True)
    _feed(guard, rng, 3000, 0.3)
    guard.published("v2", full=True)
    svc.registry.pin("v3")
    _feed(guard, rng, 640, 0.3)
    guard.published("v3", full=True)
    seq = 0
    while svc._guarded():
        if seq:
            guard.published(f"v3#{seq}", full=False)
        _feed(guard, rng, 32, 0.18)
        seq += 1
    assert guard.last is not None and guard.last.rollback_to == "v2"  # would roll back...
    assert svc.registry.pinned() == "v3" and svc.glue.pin is None  # ...but the pin wins


def test_a_restarted_trainer_keeps_holding_against_the_same_healthy_figure(tmp_path: Path) -> None:
    import json

    from model.trainer.checkpoint import LoopState

    rng = np.random.default_rng(8)
    guard = Guard(0.2, 500, reference_rows=5000)
    svc = _service(tmp_path, guard)
    for v in ("v1", "v2"):
        _feed(guard, rng, 3000, 0.3)
        assert svc._guarded()
        guard.published(v, full=True)
    _feed(guard, rng, 640, 0.3)
    assert svc._guarded()
    guard.published("v3", full=True)
    while svc._guarded():  # the decline: held, serving rolled back to v2
        guard.published("v3#1", full=False)
        _feed(guard, rng, 32, 0.15)
    reference, holds = guard.reference, guard.holds
    assert guard.held and svc.glue.pin == "v2"
    # what TrainerService.checkpoint saves and restore reads back (the store's JSON)
    saved = json.loads(json.dumps(LoopState(guard=svc.glue.to_json()).to_json()))
    fresh = Guard(0.2, 500, reference_rows=5000)
    again = _service(tmp_path / "again", fresh)
    again.glue.registry = svc.registry
    again.glue.restore(LoopState.from_json(saved).guard or {})
    assert fresh.held and fresh.reference == reference and fresh.holds == holds
    assert again.glue.pin == "v2" and again.metrics.guard_held._value.get() == 1
    _feed(fresh, rng, 480, 0.3)
    assert fresh.check().action == "held"  # still min_scored rows after the hold to go
    _feed(fresh, rng, 64, 0.3)
    assert again.glue.allows(again.deltas) and again.deltas.resets == 1
    again.glue.published("v4", full=True)  # the new lineage after the resume drops the pin
    assert svc.registry.pinned() is None
    # a guard that never held restores as not holding, with no reference yet
    idle = Guard(0.2, 500)
    idle.restore(Guard(0.2, 500).to_json())
    assert not idle.held and idle.reference is None and idle.check().action == "publish"
