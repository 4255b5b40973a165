"""How long a quality guard hold has lasted, and where it shows: the guard's status and
checkpoint, the trainer's metric and ``/health``, the ``GUARD.json`` note serving reads."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from model.artifact.guard_note import hold_reason, note_held_since
from model.artifact.registry import Registry
from model.trainer.guard_publishing import GuardedPublishing
from model.trainer.guard_rule import Guard
from model.trainer.metrics import TrainerMetrics
from streamrec import metric_names as names
from tests.unit.model.artifact.test_artifact import make
from tests.unit.model.trainer.guard_traffic import Traffic, healthy

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    """A hand-moved clock."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _healthy(guard: Guard, seed: int) -> None:
    healthy(guard, Traffic(seed))


def _holding(guard: Guard, glue: GuardedPublishing | None = None) -> None:
    """A burst: every target since the last publication random, the guard holds."""
    Traffic(99).feed(guard, 128, random_share=1.0)
    allowed = glue.allows(None) if glue is not None else guard.check(T0).publishes
    assert not allowed and guard.held


def _glue(tmp_path: Path, clock: Clock, alarm_s: float = 60.0) -> GuardedPublishing:
    reg = Registry(tmp_path, "tt", keep=10)
    reg.publish("v1", lambda d: make(d, version="v1"))
    guard = Guard(0.2, 500, reference_rows=5000)
    _healthy(guard, 1)
    return GuardedPublishing(guard, reg, TrainerMetrics(), clock, alarm_s)


def _sample(metrics: TrainerMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


def test_a_hold_keeps_its_start_and_its_age_until_it_resumes() -> None:
    traffic = Traffic(2)
    guard = Guard(0.2, 500, reference_rows=5000)
    healthy(guard, traffic)
    assert guard.status(T0)["held_for_s"] is None and guard.held_at is None
    _holding(guard)
    assert guard.held_at == T0
    assert guard.check(T0 + timedelta(seconds=30)).action == "held"
    assert guard.held_at == T0  # a check while holding does not move the start
    status = guard.status(T0 + timedelta(seconds=75))
    assert status["held"] and status["held_for_s"] == 75.0
    assert status["held_at"] == T0.isoformat()
    assert guard.status()["held_for_s"] is None  # no clock, no age
    traffic.feed(guard, 544)
    assert guard.check(T0 + timedelta(seconds=90)).action == "resume"
    assert guard.held_at is None
    assert guard.status(T0 + timedelta(seconds=95))["held_for_s"] is None


def test_the_start_of_a_hold_survives_a_checkpoint_and_old_checkpoints_restore() -> None:
    guard = Guard(0.2, 500, reference_rows=5000)
    _healthy(guard, 3)
    _holding(guard)
    saved = json.loads(json.dumps(guard.to_json()))
    later = T0 + timedelta(minutes=5)
    again = Guard(0.2, 500, reference_rows=5000)
    again.restore(saved, now=later)
    assert again.held and again.held_at == T0
    assert again.held_for_s(later) == 300.0
    # a checkpoint from before the start was kept: the hold counts from the restore
    old = {k: v for k, v in saved.items() if k != "held_at"}
    older = Guard(0.2, 500, reference_rows=5000)
    older.restore(old, now=later)
    assert older.held and older.held_at == later
    assert older.held_for_s(later + timedelta(seconds=10)) == 10.0
    # not holding: no start whatever the checkpoint says
    idle = Guard(0.2, 500)
    idle.restore({**Guard(0.2, 500).to_json(), "held_at": T0.isoformat()}, now=later)
    assert idle.held_at is None and idle.held_for_s(later) is None


def test_the_trainer_exports_the_hold_age_and_degrades_past_the_alarm(tmp_path: Path) -> None:
    clock = Clock()
    glue = _glue(tmp_path, clock, alarm_s=60.0)
    metrics = glue.metrics
    assert _sample(metrics, names.TRAINER_GUARD_HELD_SECONDS) == 0.0
    _holding(glue.guard, glue)
    note = glue.registry.guard()
    assert note is not None and note["held"] and note["held_since"] == T0.isoformat()
    clock.advance(45)
    assert _sample(metrics, names.TRAINER_GUARD_HELD_SECONDS) == 45.0
    assert glue.degraded() == []  # a short hold is the guard doing its job
    assert glue.status()["held_for_s"] == 45.0 and glue.status()["hold_alarm_s"] == 60.0
    clock.advance(30)
    assert _sample(metrics, names.TRAINER_GUARD_HELD_SECONDS) == 75.0
    assert glue.degraded() == [
        f"model publication held by the quality guard since {T0.isoformat()} (75 s)"]


def test_a_resume_clears_the_hold_everywhere(tmp_path: Path) -> None:
    clock = Clock()
    glue = _glue(tmp_path, clock)
    _holding(glue.guard, glue)
    clock.advance(120)
    assert glue.degraded()
    Traffic(4).feed(glue.guard, 544)
    assert glue.allows(None)
    assert glue.degraded() == []
    assert _sample(glue.metrics, names.TRAINER_GUARD_HELD_SECONDS) == 0.0
    note = glue.registry.guard()
    assert note is not None and not note["held"] and note["held_since"] is None
    assert note_held_since(note) is None


def test_a_restored_hold_goes_on_counting(tmp_path: Path) -> None:
    clock = Clock()
    glue = _glue(tmp_path, clock)
    _holding(glue.guard, glue)
    saved = json.loads(json.dumps(glue.to_json()))
    clock.advance(200)
    again = _glue(tmp_path / "again", clock)
    again.restore(saved)
    assert _sample(again.metrics, names.TRAINER_GUARD_HELD_SECONDS) == 200.0
    assert again.degraded()[0].endswith("(200 s)")


def test_the_trainer_health_is_degraded_by_a_long_hold(tmp_path: Path) -> None:
    from model.trainer.service import TrainerService

    clock = Clock()
    glue = _glue(tmp_path, clock)
    state = SimpleNamespace(samples_trained=1, duplicates_dropped=0, digest=0, dlq_records=0,
                            offsets={}, last_version="v1", trained_through_ms=None)
    service = SimpleNamespace(
        running=True, guarding=glue, state=state,
        trainer=SimpleNamespace(evaluator=SimpleNamespace(summary=dict)),
        delta_status=lambda: None, guard_status=glue.status)

    def health() -> dict:
        return TrainerService.status(service)  # type: ignore[arg-type]

    assert health()["status"] == "ok" and health()["degraded"] == []
    _holding(glue.guard, glue)
    clock.advance(61)
    body = health()
    assert body["status"] == "degraded"
    assert body["degraded"] == [
        f"model publication held by the quality guard since {T0.isoformat()} (61 s)"]
    assert body["guard"]["held_for_s"] == 61.0
    service.running = False
    assert health()["status"] == "starting"  # not running yet says so first
    service.guarding = None
    service.running = True
    assert health()["status"] == "ok"  # the guard off: nothing to degrade


@pytest.mark.parametrize(("note", "expected"), [
    (None, None),
    ({}, None),
    ({"held": False, "held_since": T0.isoformat()}, None),
    ({"held": True}, None),  # a note written before holds kept their start
    ({"held": True, "held_since": "not a time"}, None),
    ({"held": True, "held_since": "2026-03-01T12:00:00"}, None),  # naive: not trusted
    ({"held": True, "held_since": T0.isoformat()}, T0),
])
def test_the_start_of_a_hold_read_from_a_note(note: dict | None, expected: datetime | None) -> None:
    assert note_held_since(note) == expected


def test_the_hold_reason_names_its_start_and_age() -> None:
    assert hold_reason(None, T0, 60.0) is None
    assert hold_reason(T0, T0 + timedelta(seconds=60), 60.0) is None  # over, not at
    assert hold_reason(T0, T0 + timedelta(seconds=61.4), 60.0) == (
        "model publication held by the quality guard since 2026-03-01T12:00:00+00:00 (61 s)")
    assert hold_reason(T0, T0 + timedelta(seconds=1), 0.0) is not None
