"""The guard benchmark's pure logic (bench/guard.py): the schedule, counter growth, held
seconds, caught-after, per-hour rates and the table; and the bad rows it makes."""

from __future__ import annotations

import numpy as np
import pytest

from bench.guard import (
    BENIGN,
    DEFAULT_MINUTES,
    REGRESSIONS,
    Reading,
    Scenario,
    benign_rates,
    caught_after,
    first_growth,
    grew,
    held_seconds,
    not_up,
    per_hour,
    schedule,
    summarize,
    table,
)
from bench.guard_traffic import broken, poisoned
from feature_store.sample import Sample


def test_the_schedule_plays_benign_first_and_the_default_totals_30_benign_minutes() -> None:
    plan = schedule(DEFAULT_MINUTES)
    assert [s.name for s in plan] == list(BENIGN + REGRESSIONS)
    assert [s.kind for s in plan] == ["benign"] * 6 + ["regression"] * 3
    assert sum(s.seconds for s in plan if s.kind == "benign") == pytest.approx(30 * 60)
    short = schedule(0.5, ["bot", "drift"])
    assert [(s.name, s.seconds) for s in short] == [("drift", 30.0), ("bot", 30.0)]
    with pytest.raises(ValueError, match="unknown"):
        schedule(1, ["drift", "nope"])
    with pytest.raises(ValueError):
        schedule(0)


def test_a_counter_grows_by_its_difference_or_restarts_from_zero() -> None:
    assert grew(3, 5) == 2
    assert grew(7, 2) == 2  # the trainer restarted: what it counted since
    assert grew(None, 5) is None and grew(1, None) is None


def test_held_seconds_sum_the_intervals_that_began_holding() -> None:
    rs = [Reading(0, held=False), Reading(1, held=True), Reading(3, held=True),
          Reading(4, held=False), Reading(6, held=None)]
    assert held_seconds(rs) == 3.0
    assert held_seconds([]) == 0.0


def test_caught_after_counts_scored_rows_and_seconds_to_the_first_new_hold() -> None:
    rs = [Reading(0.0, holds=2, rollbacks=1, scored=1000, bad_rows=0),
          Reading(1.0, holds=2, rollbacks=1, scored=1400, bad_rows=120),
          Reading(2.5, holds=3, rollbacks=1, scored=1900, bad_rows=260),
          Reading(4.0, holds=3, rollbacks=2, scored=2300, bad_rows=400)]
    assert caught_after(rs, "holds") == {"rows": 900, "seconds": 2.5, "bad_rows": 260}
    assert caught_after(rs, "rollbacks") == {"rows": 1300, "seconds": 4.0, "bad_rows": 400}
    assert caught_after(rs[:2], "holds") is None  # not caught
    assert caught_after([], "holds") is None


def test_a_counter_unread_at_the_start_counts_from_its_first_reading() -> None:
    rs = [Reading(0, holds=None), Reading(1, holds=4), Reading(2, holds=4), Reading(3, holds=5)]
    hit = first_growth(rs, "holds")
    assert hit is not None and hit.t == 3


def test_per_hour() -> None:
    assert per_hour(2, 1800) == 4.0
    assert per_hour(None, 60) is None and per_hour(1, 0) is None


def _readings(holds: tuple[int, int], rollbacks: tuple[int, int], span: float) -> list[Reading]:
    return [Reading(0.0, holds[0], rollbacks[0], 10.0, False, 0),
            Reading(span, holds[1], rollbacks[1], 10.0 + span, False, 100)]


def test_summaries_and_the_benign_rates_per_hour() -> None:
    a = summarize(Scenario("drift", "benign", 600), _readings((0, 1), (0, 0), 600.0))
    b = summarize(Scenario("replay", "benign", 600), _readings((1, 2), (0, 1), 600.0),
                  replay_exit=0)
    r = summarize(Scenario("bot", "regression", 60), _readings((2, 3), (1, 1), 60.0))
    assert a["holds"] == 1 and a["deltas_per_s"] == 1.0 and a["scored"] == 100
    assert b["replay_exit"] == 0 and "first_hold" not in b
    assert r["first_hold"] == {"rows": 100, "seconds": 60.0, "bad_rows": 0}
    assert r["first_rollback"] is None
    rates = benign_rates([a, b, r])
    assert rates["seconds"] == 1200 and rates["holds"] == 2 and rates["rollbacks"] == 1
    assert rates["holds_per_hour"] == 6.0 and rates["rollbacks_per_hour"] == 3.0
    text = table([a, b, r], rates)
    assert "not caught" in text and "100 rows, 60 s" in text
    assert "holds 2 (6.0/h), rollbacks 1 (3.0/h)" in text


def test_unknown_counters_stay_unknown() -> None:
    s = summarize(Scenario("drift", "benign", 60), [Reading(0.0), Reading(60.0)])
    assert s["holds"] is None and s["deltas_per_s"] is None
    rates = benign_rates([s])
    assert rates["holds"] is None and rates["holds_per_hour"] is None
    assert "holds ?" in table([s], rates)


def test_the_refusal_names_what_is_down() -> None:
    assert not_up({"ingest": True, "trainer": True}) is None
    message = not_up({"ingest": True, "serving": False, "trainer": False})
    assert message is not None and "serving, trainer" in message and "streamrec up" in message


def test_bad_rows_poison_a_share_and_break_the_history() -> None:
    s = Sample("s1", "u1", "i1", "click", 1.0, 5, ("i2", "i3"))
    rng = np.random.default_rng(0)
    out = [poisoned(s, rng, 1000, 0.3, lambda i: f"x{i}") for _ in range(2000)]
    share = sum(bad for _, bad in out) / len(out)
    assert 0.27 < share < 0.33
    assert all(p.history == s.history and p.item_id.startswith("x") for p, bad in out if bad)
    assert all(p == s for p, bad in out if not bad)
    assert broken(s) == (Sample("s1", "u1", "i1", "click", 1.0, 5, ()), True)


def test_a_regression_that_began_during_a_hold_says_so() -> None:
    r = summarize(Scenario("poisoned", "regression", 60), _readings((1, 1), (0, 0), 60.0),
                  started_held=True)
    assert "held from the start" in table([r], benign_rates([r]))
