"""Replay: file formats, malformed rows, deterministic ids, ordering, filters, resume logic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from stream.replay.formats import (
    ReplayFormatError,
    detect_format,
    parse_mapping,
    read_rows,
    row_event_id,
)
from stream.replay.runner import (
    ReplayError,
    ReplayOptions,
    ReplayReport,
    ReplayRuntime,
    ReplaySource,
    ReplayState,
    build_plan,
    parse_time_arg,
    plan_id,
    run_replay,
)
from streamrec.settings import DEFAULT_EVENT_WEIGHTS, load_settings

NOW_MS = 1_750_000_000_000
TYPES = list(DEFAULT_EVENT_WEIGHTS)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def plan(sources: list[ReplaySource], **opts: Any) -> tuple[list[Any], ReplayReport]:
    report = ReplayReport()
    rows = build_plan(sources, ReplayOptions(**opts), TYPES, NOW_MS, report)
    return rows, report


def events(rows: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(r[4]) for r in rows]


# ---- formats -----------------------------------------------------------------------------


def test_movielens_csv_rows_and_rating_rule(tmp_path: Path) -> None:
    f = write(
        tmp_path / "ratings.csv",
        "userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n1,1029,4.0,1260759179\n",
    )
    assert detect_format(f) == "movielens"
    rows = list(read_rows(f, "movielens"))
    assert [r.line_no for r in rows] == [2, 3]
    assert rows[0].event == {
        "event_id": row_event_id("ratings.csv", 2, b"1,31,2.5,1260759144"),
        "user_id": "1", "item_id": "31", "event_type": "rating", "ts": 1260759144, "value": 2.5,
    }  # fmt: skip
    assert rows[1].event is not None and rows[1].event["event_type"] == "like"


def test_ml1m_and_ml100k(tmp_path: Path) -> None:
    dat = write(tmp_path / "ratings.dat", "1::1193::5::978300760\n2::661::3::978302109\n")
    udata = write(tmp_path / "u.data", "196\t242\t3\t881250949\n186\t302\t4\t891717742\n")
    assert detect_format(dat) == "ml-1m" and detect_format(udata) == "ml-100k"
    ev = [r.event for r in read_rows(dat, "ml-1m")]
    assert ev[0] is not None and (
        ev[0]["user_id"],
        ev[0]["item_id"],
        ev[0]["ts"],
        ev[0]["value"],
    ) == ("1", "1193", 978300760, 5.0)
    ev = [r.event for r in read_rows(udata, "ml-100k")]
    assert ev[1] is not None and (ev[1]["user_id"], ev[1]["event_type"]) == ("186", "like")


def test_ndjson_keeps_own_ids_and_fills_missing(tmp_path: Path) -> None:
    f = write(
        tmp_path / "log.ndjson",
        '{"user_id": "u", "item_id": "i", "event_type": "click", "ts": 1700000000000, "event_id": "own"}\n'
        '\n{"user_id": "u", "item_id": "j", "event_type": "like", "ts": "2024-01-01T00:00:00Z"}\n',
    )
    rows, report = plan([ReplaySource.of(f)])
    assert [e["event_id"] for e in events(rows)] == [
        "own",
        row_event_id(
            "log.ndjson",
            3,
            json.dumps(
                {"user_id": "u", "item_id": "j", "event_type": "like", "ts": "2024-01-01T00:00:00Z"}
            ).encode(),
        ),
    ]
    assert report.rejected_total == 0


def test_mapped_csv(tmp_path: Path) -> None:
    f = write(
        tmp_path / "clicks.csv",
        "when,who,what,score\n2024-01-01T00:00:00Z,u1,sku9,\n1700000000,u2,sku1,3.5\n",
    )
    mapping = parse_mapping("user_id=who,item_id=what,ts=when,value=score")
    rows, report = plan([ReplaySource.of(f, "csv")], mapping=mapping)
    assert report.rejected_total == 0
    got = {e["user_id"]: e for e in events(rows)}
    assert got["u1"]["event_type"] == "click" and got["u1"]["value"] is None
    assert (
        got["u2"]["event_type"] == "rating"
        and got["u2"]["value"] == 3.5
        and got["u2"]["ts"] == 1_700_000_000_000
    )
    rows, _ = plan([ReplaySource.of(f, "csv")], mapping=mapping, event_type="purchase")
    assert {e["event_type"] for e in events(rows)} == {"purchase"}


@pytest.mark.parametrize(
    "spec", ["user_id=a,item_id=b", "user_id=a,item_id=b,ts=c,colour=d", "user_id=a,item_id,ts=c"]
)
def test_bad_mappings(spec: str) -> None:
    with pytest.raises(ReplayFormatError):
        parse_mapping(spec)


def test_mapping_to_missing_column(tmp_path: Path) -> None:
    f = write(tmp_path / "x.csv", "a,b,c\n1,2,3\n")
    with pytest.raises(ReplayFormatError, match="no column"):
        list(read_rows(f, "csv", parse_mapping("user_id=a,item_id=b,ts=zzz")))


# ---- malformed rows ----------------------------------------------------------------------


def test_malformed_rows_are_counted_with_line_numbers(tmp_path: Path) -> None:
    f = write(
        tmp_path / "ratings.csv",
        "userId,movieId,rating,timestamp\n"
        "1,31,2.5,1260759144\n"
        "1,31,2.5\n"  # line 3: 3 fields
        "1,31,abc,1260759144\n"  # line 4: rating not a number
        "1,31,4,99\n"  # line 5: ts before 1990
        ",31,4,1260759144\n"  # line 6: empty user id
        "2,32,nan,1260759144\n"  # line 7: NaN rating
        "1,31,4,1260759145\n",
    )
    rows, report = plan([ReplaySource.of(f)])
    assert len(rows) == 2
    assert [m["line"] for m in report.malformed] == [3, 4, 5, 6, 7]
    assert report.rejected == {"parse:fields": 3, "invalid:ts": 1, "invalid:user_id": 1}
    assert "1990" in report.malformed[2]["reason"]


def test_only_first_ten_malformed_rows_are_kept_but_all_counted(tmp_path: Path) -> None:
    f = write(tmp_path / "u.data", "".join(f"{i}\tbad\n" for i in range(25)))
    _, report = plan([ReplaySource.of(f)])
    assert report.rejected_total == 25 and len(report.malformed) == 10


def test_strict_stops_at_first_malformed_row(tmp_path: Path) -> None:
    f = write(tmp_path / "u.data", "1\t2\t3\t881250949\n1\t2\t3\n1\tx\n")
    with pytest.raises(ReplayError, match=r"u\.data:2"):
        plan([ReplaySource.of(f)], strict=True)


def test_ndjson_missing_ts_and_duplicate_keys_are_rejected(tmp_path: Path) -> None:
    f = write(
        tmp_path / "e.jsonl",
        '{"user_id": "u", "item_id": "i", "event_type": "click"}\n'
        '{"user_id": "u", "user_id": "v", "item_id": "i", "event_type": "click", "ts": 1700000000}\n',
    )
    _, report = plan([ReplaySource.of(f)])
    assert report.rejected == {"invalid:ts": 1, "parse:json": 1}


# ---- ids, ordering, filters --------------------------------------------------------------


def test_event_ids_are_stable_across_copies_and_appends(tmp_path: Path) -> None:
    text = "userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n2,31,2.5,1260759144\n"
    a = write(tmp_path / "ratings.csv", text)
    (tmp_path / "copy").mkdir()
    b = tmp_path / "copy" / "ratings.csv"
    shutil.copy(a, b)
    (tmp_path / "more").mkdir()
    c = write(tmp_path / "more" / "ratings.csv", text + "3,9,1,1260759999\n")  # appended
    ids_a = [e["event_id"] for e in events(plan([ReplaySource.of(a)])[0])]
    ids_b = [e["event_id"] for e in events(plan([ReplaySource.of(b)])[0])]
    ids_c = [e["event_id"] for e in events(plan([ReplaySource.of(c)])[0])]
    assert ids_a == ids_b == ids_c[:2] and len(set(ids_c)) == 3
    renamed = write(tmp_path / "other.csv", text)
    assert not set(ids_a) & {
        e["event_id"] for e in events(plan([ReplaySource.of(renamed, "movielens")])[0])
    }


def test_order_is_event_time_then_file_then_line(tmp_path: Path) -> None:
    first = write(
        tmp_path / "a.data", "1\t1\t3\t900000002\n1\t2\t3\t900000001\n1\t3\t3\t900000002\n"
    )
    second = write(tmp_path / "b.data", "2\t1\t3\t900000001\n2\t2\t3\t900000000\n")
    rows, _ = plan([ReplaySource.of(first), ReplaySource.of(second)])
    assert [(e["user_id"], e["item_id"]) for e in events(rows)] == [
        ("2", "2"), ("1", "2"), ("2", "1"), ("1", "1"), ("1", "3"),
    ]  # fmt: skip


def test_since_until_and_limit(tmp_path: Path) -> None:
    f = write(tmp_path / "u.data", "".join(f"1\t{i}\t3\t{900000000 + i}\n" for i in range(10)))
    rows, report = plan(
        [ReplaySource.of(f)],
        since_ms=parse_time_arg("900000002", NOW_MS),
        until_ms=parse_time_arg("900000008000", NOW_MS),
        limit=4,
    )
    assert [e["item_id"] for e in events(rows)] == ["2", "3", "4", "5"]
    assert report.filtered == 6 and report.planned == 4
    assert parse_time_arg("1998-07-09T16:00:02Z", NOW_MS) == 900_000_002_000


# ---- sending, checkpoints and resume (in-memory producer) --------------------------------


class FakeFuture:
    def __init__(self, partition: int, offset: int) -> None:
        self.partition, self.offset = partition, offset

    def add_callback(self, fn: Any) -> FakeFuture:
        fn(self)
        return self

    def add_errback(self, fn: Any) -> FakeFuture:
        return self


class FakeProducer:
    """Records what was sent; raises after ``crash_after`` sends (a crash sentinel)."""

    def __init__(self, crash_after: int | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.crash_after = crash_after

    def send(self, topic: str, value: bytes, key: bytes) -> FakeFuture:
        if self.crash_after is not None and len(self.sent) >= self.crash_after:
            raise KeyboardInterrupt("simulated crash")
        self.sent.append(json.loads(value))
        return FakeFuture(0, len(self.sent) - 1)

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def runtime(
    producer: FakeProducer, written: list[dict[str, Any]], clock: FakeClock | None = None
) -> ReplayRuntime:
    clock = clock or FakeClock()
    return ReplayRuntime(
        producer_factory=lambda _s: producer,
        end_offsets=lambda _s, _t: {0: 0},
        ids_after=lambda _s, _t, offsets: {e["event_id"] for e in written[offsets.get(0, 0) :]},
        monotonic=clock.monotonic,
        sleep=clock.sleep,
        wall_ms=lambda: NOW_MS,
    )


def test_resume_after_crash_sends_the_rest_once(tmp_path: Path) -> None:
    f = write(
        tmp_path / "u.data", "".join(f"{i % 7}\t{i}\t4\t{900000000 + i}\n" for i in range(100))
    )
    settings = load_settings(stack={"run_dir": tmp_path / "run"})
    sources = [ReplaySource.of(f)]
    options = ReplayOptions(checkpoint_every=1, checkpoint_interval_s=0.0)
    state_path = tmp_path / "state.json"

    crashing = FakeProducer(crash_after=37)
    with pytest.raises(KeyboardInterrupt):
        run_replay(settings, sources, options, state_path=state_path, runtime=runtime(crashing, []),
                   ledger=False)
    state = ReplayState.load(state_path, plan_id(sources, options, settings.kafka.events_topic))
    assert state is not None and 0 < state.acked <= 37
    # pretend the last records before the crash were written but not checkpointed
    state.acked -= 5
    state.offsets = {0: state.acked}
    state.save()

    resumed = FakeProducer()
    report = run_replay(settings, sources, options, resume=True, state_path=state_path,
                        runtime=runtime(resumed, crashing.sent), ledger=False)  # fmt: skip
    all_ids = [e["event_id"] for e in crashing.sent + resumed.sent]
    assert len(all_ids) == len(set(all_ids)) == 100
    assert report.resumed == 32 and report.already_in_kafka == 5 and report.sent == 63
    assert [e["item_id"] for e in crashing.sent + resumed.sent] == [str(i) for i in range(100)]


class TopicProducer(FakeProducer):
    """Appends to one shared topic (offsets continue across producers)."""

    def __init__(self, topic: list[dict[str, Any]], crash_after: int | None = None) -> None:
        super().__init__(crash_after)
        self.topic = topic

    def send(self, topic: str, value: bytes, key: bytes) -> FakeFuture:
        super().send(topic, value, key)
        self.topic.append(self.sent[-1])
        return FakeFuture(0, len(self.topic) - 1)


def topic_runtime(producer: TopicProducer) -> ReplayRuntime:
    rt = runtime(producer, producer.topic)
    rt.end_offsets = lambda _s, _t: {0: len(producer.topic)}
    return rt


def test_the_ledger_sends_each_row_once_across_crashes_reruns_and_overlaps(
    tmp_path: Path,
) -> None:
    lines = [f"{i % 7}\t{i}\t4\t{900000000 + i}\n" for i in range(130)]
    f = write(tmp_path / "u.data", "".join(lines[:100]))
    settings = load_settings(stack={"run_dir": tmp_path / "run"})
    options = ReplayOptions(checkpoint_every=10, checkpoint_interval_s=1e9)

    topic: list[dict[str, Any]] = []

    def replay(**kw: Any) -> tuple[Any, TopicProducer]:
        producer = TopicProducer(topic, kw.pop("crash_after", None))
        return run_replay(settings, [ReplaySource.of(f)], options,
                          runtime=topic_runtime(producer), **kw), producer

    with pytest.raises(KeyboardInterrupt):
        replay(crash_after=37)  # acknowledged 37, recorded only 30
    report, _ = replay()
    assert report.already_replayed == 37 and report.sent == 63  # 7 of them found in the topic
    assert len({e["event_id"] for e in topic}) == len(topic) == 100

    report, rerun = replay()
    assert report.sent == 0 and report.already_replayed == 100 and rerun.sent == []

    f.write_text("".join(lines))  # the same log with 30 more lines: only those are new
    report, grown = replay()
    assert report.already_replayed == 100
    assert [e["item_id"] for e in grown.sent] == [str(i) for i in range(100, 130)]
    assert "already replayed 100" in report.summary()

    report, _ = replay(ledger=False)
    assert report.sent == 130  # without the ledger every row goes again

    topic.clear()  # the topic was deleted and created again: the ledger starts over
    report, _ = replay()
    assert report.sent == 130 and report.already_replayed == 0


def test_speed_keeps_event_time_gaps_scaled(tmp_path: Path) -> None:
    f = write(tmp_path / "u.data", "1\t1\t4\t900000000\n1\t2\t4\t900000010\n1\t3\t4\t900000030\n")
    clock = FakeClock()
    settings = load_settings(stack={"run_dir": tmp_path / "run"})
    report = run_replay(settings, [ReplaySource.of(f)], ReplayOptions(speed=10.0),
                        state_path=tmp_path / "s.json", runtime=runtime(FakeProducer(), [], clock))  # fmt: skip
    assert report.sent == 3
    assert clock.now - 100.0 == pytest.approx(3.0)  # 30 s of event time at 10x
    assert "sent 3" in report.summary() and report.as_dict()["sent"] == 3


def test_a_plan_holds_each_row_in_about_its_own_size(tmp_path: Path) -> None:
    """A backfill's plan keeps every row in memory: a row's bytes must not carry the
    encoder's working buffer (4 KiB each with orjson; 8.3 GB of RSS for 1M rows)."""
    import tracemalloc

    log = tmp_path / "log.ndjson"
    n = 2_000
    log.write_text("".join(
        json.dumps({"user_id": f"u{i % 97}", "item_id": f"i{i}", "event_type": "click",
                    "ts": 1_704_067_200_000 + i}) + "\n" for i in range(n)))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rows = build_plan([ReplaySource(log, "ndjson")], ReplayOptions(),
                          list(DEFAULT_EVENT_WEIGHTS), 1_800_000_000_000, ReplayReport())
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(rows) == n
    assert held / n < 1_024, f"{held / n:.0f} bytes per planned row"
