"""The pure parts of ``streamrec replay --follow`` (``deploy/cli_backfill.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from deploy import cli_backfill as cb


def test_lag_counts_what_each_partition_still_has_to_read() -> None:
    assert cb._lag({0: 10, 1: 5}, {0: 4}) == 11
    assert cb._lag({0: 10}, {0: 12}) == 0  # a consumer ahead of the snapshot is done


def test_trainer_offsets_are_read_for_one_topic() -> None:
    status = {"offsets": {"x.samples:0": 7, "x.samples:1": 9, "other:0": 3}}
    assert cb._trainer_offsets(status, "x.samples") == {0: 7, 1: 9}


def test_wait_reports_progress_and_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(cb.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(cb.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    left = iter([100, 100, *range(100, 0, -1), 0])
    said: list[str] = []
    cb._wait("features", lambda: next(left), 100, 600, said.append)
    assert said and all("ETA" in line for line in said)
    with pytest.raises(TimeoutError):
        cb._wait("trainer", lambda: 1, 1, 3, said.append)


def test_summary_line_names_every_stage() -> None:
    line = cb.summary_line({
        "events_sent": 1_000_000, "events_rejected": 3, "events_already_replayed": 0,
        "samples": 900_000, "trained": 900_000, "duplicates_dropped": 0,
        "versions_published": 4, "served_version": "v4",
        "seconds_by_stage": {"replay": 50.0, "features": 60.0, "trainer": 5.0, "served": 20.0},
        "seconds_total": 135.0})
    assert "1,000,000 events sent" in line and "features 60.0 s" in line and "total 135.0 s" in line


def test_group_offsets_ask_again_after_a_retriable_kafka_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A coordinator that moved (``NotCoordinator``, retriable) is asked again; an error
    that is not retriable, or one that outlasts the retry time, still ends the follow."""
    import kafka
    from kafka import TopicPartition
    from kafka.errors import GroupAuthorizationFailedError, NotCoordinatorError

    from streamrec.settings import load_settings

    answers: list[Any] = []

    class Admin:
        def __init__(self, **_kw: Any) -> None:
            pass

        def list_group_offsets(self, _spec: Any) -> Any:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        def close(self) -> None:
            pass

    clock = [0.0]
    monkeypatch.setattr(kafka, "KafkaAdminClient", Admin)
    monkeypatch.setattr(cb.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(cb.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    settings = load_settings()
    found = {"g": {TopicPartition("ev", 0): 5, TopicPartition("ev", 1): 7,
                   TopicPartition("other", 0): 1}}
    answers[:] = [NotCoordinatorError("moved"), NotCoordinatorError("moved"), found]
    assert cb._group_offsets(settings, "g", "ev") == {0: 5, 1: 7}
    answers[:] = [GroupAuthorizationFailedError("no")]
    with pytest.raises(GroupAuthorizationFailedError):
        cb._group_offsets(settings, "g", "ev")
    answers[:] = [NotCoordinatorError("moved")] * 1000
    with pytest.raises(NotCoordinatorError):
        cb._group_offsets(settings, "g", "ev", retry_s=5.0)
