"""The freshness bench's decisions (pure logic): its warm-up verdict and the causes it
reads from the trainer's metrics beside the percentiles."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from bench.freshness import WARMUP_FAILED, causes_line, parse_counters, run_causes, warmup_failure
from model.trainer.metrics import TrainerMetrics


def _exposition(holds: int, rollbacks: int, deltas: int) -> str:
    """What the trainer's ``/metrics`` answers with these counts."""
    m = TrainerMetrics()
    m.guard_holds.inc(holds)
    m.guard_rollbacks.inc(rollbacks)
    m.deltas.inc(deltas)
    return generate_latest(m.registry).decode()


def test_the_trainer_counters_are_read_from_its_exposition() -> None:
    assert parse_counters(_exposition(2, 1, 40)) == {
        "guard_holds": 2.0, "guard_rollbacks": 1.0, "deltas": 40.0}
    assert parse_counters("") == {}


def test_the_causes_are_what_the_counters_grew_during_the_run() -> None:
    start = parse_counters(_exposition(1, 0, 100))
    end = parse_counters(_exposition(3, 1, 160))
    assert run_causes(start, end, 60.0) == {
        "guard_holds": 2, "guard_rollbacks": 1, "deltas_per_s": 1.0}


def test_a_trainer_restart_counts_from_its_reset() -> None:
    start = parse_counters(_exposition(5, 2, 1000))
    end = parse_counters(_exposition(1, 0, 30))  # restarted: counters from zero
    assert run_causes(start, end, 30.0) == {
        "guard_holds": 1, "guard_rollbacks": 0, "deltas_per_s": 1.0}


@pytest.mark.parametrize(("start", "end"), [(None, {"deltas": 1.0}), ({"deltas": 1.0}, None),
                                            ({}, {})])
def test_unread_counters_are_unknown_not_zero(start, end) -> None:
    causes = run_causes(start, end, 10.0)
    assert causes == {"guard_holds": None, "guard_rollbacks": None, "deltas_per_s": None}
    assert causes_line(causes) == "during the run    guard holds ?, rollbacks ?, ? deltas/s"


def test_the_causes_line_sits_beside_the_percentiles() -> None:
    line = causes_line({"guard_holds": 2, "guard_rollbacks": 1, "deltas_per_s": 0.987})
    assert line == "during the run    guard holds 2, rollbacks 1, 0.99 deltas/s"


def test_a_steady_warm_up_passes() -> None:
    assert warmup_failure(1.9, 2.0, 120.0) is None
    assert warmup_failure(2.0, 2.0, 120.0) is None


def test_a_lagging_warm_up_fails_naming_the_lag() -> None:
    message = warmup_failure(7.25, 2.0, 120.0)
    assert message is not None and message.startswith("warm-up failed")
    assert "a lag of 7.2 s" in message and "limit 2.0 s" in message and "120 s" in message
    assert "quality guard" not in message
    none = warmup_failure(None, 2.0, 120.0)
    assert none is not None and "no trained-through time" in none
    assert WARMUP_FAILED != 0


def test_a_warm_up_failure_names_a_guard_hold() -> None:
    guard = {"held": True, "held_for_s": 95.4, "last_reason": "recall 0.1000 over 500 rows"}
    message = warmup_failure(40.0, 2.0, 120.0, guard)
    assert message is not None
    assert message.endswith("; the trainer's quality guard holds publication for 95 s "
                            "(recall 0.1000 over 500 rows)")
    later = warmup_failure(40.0, 2.0, 120.0, {"held": True, "held_for_s": None,
                                              "last_reason": ""})  # a check while held
    assert later is not None and later.endswith("the trainer's quality guard holds publication")
    not_held = warmup_failure(40.0, 2.0, 120.0, {"held": False, "held_for_s": None})
    assert not_held is not None and "quality guard" not in not_held
