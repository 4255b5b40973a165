"""Replay (backfill) of historical logs into the ``events`` topic, in event-time order.

The plan (rows read, checked and ordered) is :mod:`stream.replay.plan`; this module sends it.
``speed=None`` sends as fast as Kafka takes; ``speed=N`` keeps the gaps between event times,
divided by N. Exactly once across runs: the replay ledger (:mod:`stream.replay.ledger`) holds
every event id delivered, so every run resumes by itself. Without it (``ledger=False``) a
state file written atomically after each producer flush records the acknowledged prefix and
offsets, and ``resume=True`` skips that prefix and the events found on the topic after it;
the state belongs to one plan (files, options, topic), anything else starts over.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from stream.replay.ledger import Ledger, event_id_hashes
from stream.replay.plan import (
    PlanRow,
    ReplayError,
    ReplayOptions,
    ReplayReport,
    ReplaySource,
    build_plan,
    parse_time_arg,
    plan_id,
)
from streamrec.atomic import atomic_write
from streamrec.settings import Settings

__all__ = [
    "PlanRow",
    "ReplayError",
    "ReplayOptions",
    "ReplayReport",
    "ReplayRuntime",
    "ReplaySource",
    "ReplayState",
    "build_plan",
    "default_ledger_dir",
    "default_state_path",
    "event_ids_after",
    "parse_time_arg",
    "plan_id",
    "replay_producer_factory",
    "run_replay",
    "start_offsets",
]

log = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclass
class ReplayState:
    """The resume file: acknowledged prefix of the plan and per-partition offsets after it."""

    path: Path
    plan: str
    acked: int = 0
    offsets: dict[int, int] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, plan: str) -> ReplayState | None:
        """The saved state of ``plan``, or None when there is none (or it is another plan's)."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ReplayError(f"cannot read the resume state {path}: {exc}") from exc
        if data.get("version") != STATE_VERSION or data.get("plan") != plan:
            log.warning("resume state %s belongs to another plan; starting over", path)
            return None
        offsets = {int(p): int(o) for p, o in data.get("offsets", {}).items()}
        return cls(path, plan, int(data["acked"]), offsets)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "version": STATE_VERSION,
            "plan": self.plan,
            "acked": self.acked,
            "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
        }
        atomic_write(self.path, json.dumps(payload))


def default_state_path(settings: Settings, plan: str) -> Path:
    return settings.stack.run_dir / "replay" / f"{plan}.json"


def default_ledger_dir(settings: Settings, topic: str) -> Path:
    return settings.stack.run_dir / "replay" / "ledger" / topic


def replay_producer_factory(settings: Settings) -> Any:
    """The replay producer: acks=all, idempotent, large batches (librdkafka:
    :class:`stream.kafka_client.ReplayProducer`)."""
    from stream.kafka_client import ReplayProducer

    return ReplayProducer(settings.kafka)


def start_offsets(settings: Settings, topic: str) -> dict[int, int]:
    """End offset of every partition of ``topic`` before a replay (created first if missing)."""
    from stream.kafka_client import ensure_topics, topic_end_offsets

    ensure_topics(settings.kafka, [topic])
    return topic_end_offsets(settings.kafka, topic)


def event_ids_after(
    settings: Settings, topic: str, offsets: dict[int, int], timeout_s: float = 60.0
) -> set[str]:
    """``event_id`` of every record from ``offsets`` (per partition) to the current end."""
    from kafka import TopicPartition

    from stream.kafka_client import end_offsets, offsets_consumer

    consumer = offsets_consumer(settings.kafka.bootstrap)
    found: set[str] = set()
    try:
        ends = {
            TopicPartition(topic, p): end for p, end in end_offsets(consumer, topic).items()
        }
        todo = [tp for tp, end in ends.items() if end > offsets.get(tp.partition, 0)]
        if not todo:
            return found
        consumer.assign(todo)
        for tp in todo:
            consumer.seek(tp, offsets.get(tp.partition, 0))
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in todo):
            if time.monotonic() > deadline:
                raise ReplayError(f"could not read the tail of {topic} within {timeout_s} s")
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    try:
                        found.add(orjson.loads(record.value)["event_id"])
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        log.warning(
                            "unreadable record at %s:%d offset %d",
                            record.topic, record.partition, record.offset,
                        )
        return found
    finally:
        consumer.close()


@dataclass
class ReplayRuntime:
    """What a replay run talks to; tests swap parts of it."""

    producer_factory: Callable[[Settings], Any] = replay_producer_factory
    end_offsets: Callable[[Settings, str], dict[int, int]] = start_offsets
    ids_after: Callable[[Settings, str, dict[int, int]], set[str]] = event_ids_after
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000


def run_replay(
    settings: Settings,
    sources: Sequence[ReplaySource],
    options: ReplayOptions,
    *,
    resume: bool = False,
    state_path: Path | None = None,
    runtime: ReplayRuntime | None = None,
    progress: bool = False,
    ledger: bool = True,
    ledger_dir: Path | None = None,
) -> ReplayReport:
    """Replay ``sources`` into ``settings.kafka.events_topic``; returns the report. With
    ``ledger``, rows an earlier replay delivered are skipped (``resume`` is then implied)."""
    rt = runtime or ReplayRuntime()
    topic = settings.kafka.events_topic
    report = ReplayReport(topic=topic)
    started = rt.monotonic()
    rows = build_plan(sources, options, list(settings.features.event_weights), rt.wall_ms(), report)
    plan = plan_id(sources, options, topic)
    path = state_path or default_state_path(settings, plan)
    book: Ledger | None = None
    hashes = None
    if ledger:
        book = Ledger.open(ledger_dir or default_ledger_dir(settings, topic))
        ends = rt.end_offsets(settings, topic)
        book.reconcile(ends, lambda offsets: rt.ids_after(settings, topic, offsets))
        hashes = event_id_hashes([row[4] for row in rows])
        delivered = book.contains(hashes)
        if delivered.any():
            report.already_replayed = int(delivered.sum())
            rows = [row for row, d in zip(rows, delivered.tolist(), strict=True) if not d]
            hashes = hashes[~delivered]
            log.info("%d rows were delivered by an earlier replay; %d to send",
                     report.already_replayed, len(rows))
        book.begin(ends)
        resume = False  # the ledger knows what was sent; a plan's prefix does not apply
    state = ReplayState.load(path, plan) if resume else None
    skip_ids: set[str] = set()
    if state is not None:
        report.resumed = min(state.acked, len(rows))
        if report.resumed < len(rows):
            skip_ids = rt.ids_after(settings, topic, dict(state.offsets))
        log.info(
            "resuming after %d acknowledged events (%d found after them)",
            state.acked,
            len(skip_ids),
        )
    else:
        if resume:
            log.info("no resume state for this plan at %s; starting from the first row", path)
        state = ReplayState(path, plan, 0, rt.end_offsets(settings, topic))
        state.save()
    def recorded(lo: int, hi: int) -> None:
        if book is not None and hashes is not None:
            book.record(hashes[lo:hi])

    producer = rt.producer_factory(settings)
    try:
        _send_rows(producer, rows, report.resumed, skip_ids, state, options, rt, report, progress,
                   recorded)
    finally:
        producer.close(timeout=10)
    if book is not None:
        parts = set(book.offsets) | set(state.offsets)
        book.finish({p: max(book.offsets.get(p, 0), state.offsets.get(p, 0)) for p in parts})
    report.seconds = rt.monotonic() - started
    return report


#: Seconds between progress lines in the log when no progress bar is shown.
PROGRESS_LOG_S = 5.0


def _log_progress(done: int, total: int, seconds: float) -> None:
    rate = done / seconds if seconds > 0 else 0.0
    eta = f"ETA {(total - done) / rate:,.0f} s" if rate > 0 else "ETA unknown"
    log.info("replay: %s/%s sent (%.0f%%), %s events/s, %s", f"{done:,}", f"{total:,}",
             100.0 * done / max(total, 1), f"{rate:,.0f}", eta)


def _send_rows(
    producer: Any,
    rows: list[PlanRow],
    start: int,
    skip_ids: set[str],
    state: ReplayState,
    options: ReplayOptions,
    rt: ReplayRuntime,
    report: ReplayReport,
    progress: bool,
    recorded: Callable[[int, int], None] = lambda lo, hi: None,
) -> None:
    from tqdm import tqdm

    topic = report.topic
    offsets = state.offsets
    failures: list[BaseException] = []

    def on_ack(metadata: Any) -> None:
        if metadata.offset + 1 > offsets.get(metadata.partition, 0):
            offsets[metadata.partition] = metadata.offset + 1

    recorded_upto = [start]

    def checkpoint(upto: int) -> None:
        producer.flush()
        if failures:
            raise ReplayError(f"Kafka did not acknowledge {len(failures)} record(s): {failures[0]}")
        recorded(recorded_upto[0], upto)
        recorded_upto[0] = upto
        state.acked = upto
        state.save()

    bar = tqdm(
        total=len(rows) - start, unit="ev", unit_scale=True, disable=not progress, mininterval=0.5
    )
    send = producer.send
    speed = options.speed
    ts0 = rows[start][0] if start < len(rows) else 0
    wall0 = rt.monotonic()
    last_cp_index, last_cp_time, shown, last_log = start, wall0, start, wall0
    try:
        for i in range(start, len(rows)):
            ts, _, _, key, value = rows[i]
            if skip_ids and orjson.loads(value)["event_id"] in skip_ids:
                report.already_in_kafka += 1
                continue
            if speed is not None:
                delay = wall0 + (ts - ts0) / 1000.0 / speed - rt.monotonic()
                if delay > 0.001:
                    rt.sleep(delay)
            future = send(topic, value=value, key=key)
            future.add_callback(on_ack)
            future.add_errback(failures.append)
            report.sent += 1
            due = i + 1 - last_cp_index >= options.checkpoint_every
            if due or report.sent & 1023 == 0 or speed is not None:
                now = rt.monotonic()
                if due or now - last_cp_time >= options.checkpoint_interval_s:
                    checkpoint(i + 1)
                    last_cp_index, last_cp_time = i + 1, now
                    bar.update(i + 1 - shown)
                    shown = i + 1
                    if not progress and now - last_log >= PROGRESS_LOG_S:
                        last_log = now
                        _log_progress(i + 1 - start, len(rows) - start, now - wall0)
        checkpoint(len(rows))
        bar.update(len(rows) - shown)
    finally:
        bar.close()
