"""Process settings the training loop applies while it runs (``model.trainer.loop_options``)."""

from __future__ import annotations

import sys

import pytest

from model.trainer.loop_options import LoopOptions, delta_interval, process_tuning


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_switch_interval_and_blas_threads_hold_while_running_and_are_restored() -> None:
    pytest.importorskip("threadpoolctl")
    import numpy  # noqa: F401 - loads the BLAS library threadpoolctl inspects

    before_switch, before_blas = sys.getswitchinterval(), _blas_threads()
    with process_tuning(LoopOptions(gil_switch_interval_s=0.002, blas_threads=1)):
        assert sys.getswitchinterval() == pytest.approx(0.002)
        assert _blas_threads() and set(_blas_threads()) == {1}
    assert sys.getswitchinterval() == pytest.approx(before_switch)
    assert _blas_threads() == before_blas


def test_none_leaves_process_settings_alone() -> None:
    before = sys.getswitchinterval()
    with process_tuning(LoopOptions(gil_switch_interval_s=None, blas_threads=None)):
        assert sys.getswitchinterval() == before


def test_offsets_beyond_a_topic_end_are_refused() -> None:
    from model.trainer.checkpoint import OffsetsBeyondTopic, check_offsets

    saved = {"s:0": 10, "s:1": 4, "other:0": 99}
    check_offsets(saved, {0: 10, 1: 7}, "s", "ckpt")  # at or behind the end: resumable
    with pytest.raises(OffsetsBeyondTopic, match=r"s:1 saved 4 > end 0"):
        check_offsets(saved, {0: 12, 1: 0}, "s", "ckpt")
    with pytest.raises(OffsetsBeyondTopic, match=r"s:1 saved 4 > end 0"):
        check_offsets(saved, {0: 12}, "s", "ckpt")  # a partition the topic no longer has


def test_deltas_slow_down_while_the_trainer_catches_up() -> None:
    loop = LoopOptions(delta_every_s=1.0, delta_catchup_every_s=10.0)
    assert delta_interval(loop, waited=True) == 1.0  # keeping up: every second
    assert delta_interval(loop, waited=False) == 10.0  # a backlog: every 10 s
    assert delta_interval(LoopOptions(delta_every_s=1.0, delta_catchup_every_s=0.0), False) == 1.0
    assert delta_interval(LoopOptions(delta_every_s=20.0, delta_catchup_every_s=10.0), False) == 20.0


def test_deltas_slow_down_while_the_trainer_trains_only_history() -> None:
    loop = LoopOptions(delta_every_s=1.0, delta_catchup_every_s=10.0, delta_history_lag_s=300.0)
    now = 1_800_000_000_000
    # a backfill of an old log the trainer keeps up with (the feature job is slower)
    assert delta_interval(loop, True, now - 301_000, now) == 10.0
    assert delta_interval(loop, True, now - 299_000, now) == 1.0  # live: every second
    assert delta_interval(loop, True, None, now) == 1.0  # nothing trained since the last delta
    assert delta_interval(loop, False, now - 1_000, now) == 10.0  # a live backlog
    # the backlog drained: a second without samples sends what it trained at once
    assert delta_interval(loop, True, now - 10**9, now, quiet_s=1.0) == 1.0
    assert delta_interval(loop, True, now - 10**9, now, quiet_s=0.5) == 10.0
    assert delta_interval(loop, False, now - 1_000, now, quiet_s=2.0) == 1.0
    off = LoopOptions(delta_every_s=1.0, delta_catchup_every_s=10.0, delta_history_lag_s=0.0)
    assert delta_interval(off, True, now - 10**9, now) == 1.0
    none = LoopOptions(delta_every_s=1.0, delta_catchup_every_s=0.0, delta_history_lag_s=300.0)
    assert delta_interval(none, True, now - 10**9, now) == 1.0


def test_loop_options_carry_the_settings_cadence_under_the_cli_overrides() -> None:
    from streamrec.settings import Settings, TrainerSettings, with_trainer

    settings = Settings(trainer=TrainerSettings(
        delta_every_s=2.0, delta_catchup_every_s=20.0, delta_history_lag_s=60.0,
        export_every_s=7.0))
    loop = LoopOptions.from_settings(with_trainer(settings, export_every_s=3.0), max_samples=5)
    assert (loop.delta_every_s, loop.delta_catchup_every_s, loop.delta_history_lag_s) == (
        2.0, 20.0, 60.0)
    assert (loop.export_every_s, loop.max_samples) == (3.0, 5)
    assert loop.export_every_samples == settings.trainer.export_every_samples
    # a knob the settings own is overridden in the settings, never beside them
    with pytest.raises(ValueError, match="export_every_s"):
        LoopOptions.from_settings(settings, export_every_s=3.0)
