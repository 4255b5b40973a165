"""Follow a backfill through the running pipeline: ``streamrec replay ... --follow``.

After the replay has sent its rows, waits stage by stage, printing progress, the lag and an
ETA every few seconds, and ends with a summary (events, samples, trained, versions, the wall
time of each stage):

* ``features`` — the feature job's consumer group (``--group-id``, committed at each Flink
  checkpoint) reaches the ``events`` end offsets taken when the replay ended;
* ``trainer`` — the trainer's consumed offsets (``GET /health``) reach the ``samples`` end
  offsets taken when the feature job was done;
* ``served`` — serving's version (``GET /model``) is trained through the newest sample the
  trainer had trained when it was done.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamrec.settings import Settings

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 5.0


@dataclass
class StageClock:
    """Wall time of each stage, in the order they ended."""

    started: float = field(default_factory=time.monotonic)
    stages: dict[str, float] = field(default_factory=dict)

    def end(self, name: str) -> None:
        self.stages[name] = round(time.monotonic() - self.started - sum(self.stages.values()), 2)


def _group_offsets(settings: Settings, group: str, topic: str,
                   retry_s: float = 60.0) -> dict[int, int]:
    """The group's committed offsets on ``topic``. A retriable Kafka error (e.g.
    ``NotCoordinator`` while the group's coordinator moves, seen on a loaded broker during a
    1M-event backfill) is asked again for up to ``retry_s``, not the end of the follow."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    give_up = time.monotonic() + retry_s
    while True:
        admin = KafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap)
        try:
            found = admin.list_group_offsets({group: None}).get(group, {})
            break
        except KafkaError as exc:
            if not getattr(exc, "retriable", False) or time.monotonic() > give_up:
                raise
        finally:
            admin.close()
        time.sleep(0.5)  # back-off before asking again
    return {tp.partition: int(getattr(meta, "offset", meta)) for tp, meta in found.items()
            if tp.topic == topic}


def _ends(settings: Settings, topic: str) -> dict[int, int]:
    from stream.kafka_client import topic_end_offsets

    return topic_end_offsets(settings.kafka, topic)


def _lag(ends: dict[int, int], done: dict[int, int]) -> int:
    return sum(max(0, end - done.get(p, 0)) for p, end in ends.items())


def _wait(what: str, lag: Callable[[], int], total: int, timeout_s: float,
          say: Callable[[str], None]) -> None:
    """Poll ``lag()`` until 0, printing progress and an ETA every few seconds."""
    started = last_say = time.monotonic()
    first = lag()
    while True:
        left = lag()
        if left <= 0:
            return
        now = time.monotonic()
        if now - started > timeout_s:
            raise TimeoutError(f"{what}: still {left:,} behind after {timeout_s:.0f} s")
        if now - last_say >= PROGRESS_EVERY_S:
            done = first - left
            rate = done / (now - started) if now > started else 0.0
            eta = f"ETA {left / rate:,.0f} s" if rate > 0 else "ETA unknown"
            say(f"{what}: {total - left:,}/{total:,} ({rate:,.0f}/s), {left:,} to go, {eta}")
            last_say = now
        time.sleep(0.5)  # polling interval


def _get_json(url: str) -> dict[str, Any]:
    import httpx  # here, not at the top: every ``streamrec`` command imports this module

    return dict(httpx.get(url, timeout=5.0).json())


def _trainer(settings: Settings) -> dict[str, Any]:
    return _get_json(f"http://127.0.0.1:{settings.trainer.metrics_port}/health")


def _served(settings: Settings) -> dict[str, Any]:
    return _get_json(f"http://127.0.0.1:{settings.serving.port}/model")


def _trainer_offsets(status: dict[str, Any], topic: str) -> dict[int, int]:
    out = {}
    for key, offset in status.get("offsets", {}).items():
        name, _, part = str(key).rpartition(":")
        if name == topic:
            out[int(part)] = int(offset)
    return out


def snapshot(settings: Settings) -> dict[str, Any]:
    """What the summary compares against: samples end offsets and the trainer's counters."""
    status = _trainer(settings)
    return {"samples_end": _ends(settings, settings.kafka.samples_topic),
            "trained": int(status.get("samples_trained", 0)),
            "duplicates": int(status.get("duplicates_dropped", 0)),
            "versions": _versions(settings)}


def _versions(settings: Settings) -> set[str]:
    from model.artifact.registry import Registry

    t = settings.trainer
    return set(Registry(t.registry_dir, t.model_name).versions())


def follow(
    settings: Settings,
    before: dict[str, Any],
    replay: dict[str, Any],
    *,
    group_id: str = "streamrec-features",
    timeout_s: float = 3600.0,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Wait for the feature job, the trainer and serving (module doc); the summary."""
    clock = StageClock()
    k = settings.kafka
    events_end = _ends(settings, k.events_topic)
    _wait("features", lambda: _lag(events_end, _group_offsets(settings, group_id, k.events_topic)),
          sum(events_end.values()), timeout_s, say)
    clock.end("features")
    samples_end = _ends(settings, k.samples_topic)
    new_samples = _lag(samples_end, before["samples_end"])
    _wait("trainer", lambda: _lag(samples_end, _trainer_offsets(_trainer(settings),
                                                                 k.samples_topic)),
          sum(samples_end.values()), timeout_s, say)
    clock.end("trainer")
    status = _trainer(settings)
    through = int(status.get("trained_through_ms") or 0)
    _wait("served", lambda: 0 if int(_served(settings).get("trained_through_ms") or 0) >= through
          else 1, 1, timeout_s, say)
    clock.end("served")
    served = _served(settings)
    trained = int(status.get("samples_trained", 0)) - before["trained"]
    stages = {"replay": round(float(replay.get("seconds", 0.0)), 2), **clock.stages}
    return {
        "events_sent": replay.get("sent", 0),
        "events_rejected": replay.get("rejected", 0),
        "events_already_replayed": replay.get("already_replayed", 0),
        "samples": new_samples,
        "trained": trained,
        "duplicates_dropped": int(status.get("duplicates_dropped", 0)) - before["duplicates"],
        "trainer_digest": status.get("digest"),
        "versions_published": len(_versions(settings) - before["versions"]),
        "served_version": served.get("version"),
        "served_trained_through_ms": served.get("trained_through_ms"),
        "seconds_by_stage": stages,
        "seconds_total": round(sum(stages.values()), 2),
    }


def summary_line(s: dict[str, Any]) -> str:
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in s["seconds_by_stage"].items())
    return (f"backfill: {s['events_sent']:,} events sent ({s['events_rejected']:,} rejected, "
            f"{s['events_already_replayed']:,} already replayed), {s['samples']:,} samples, "
            f"{s['trained']:,} trained ({s['duplicates_dropped']:,} duplicates dropped), "
            f"{s['versions_published']} versions, served {s['served_version']}; {stages}; "
            f"total {s['seconds_total']:.1f} s")


def replay_and_follow(args: Any, replay_cmd: Callable[[Any], int]) -> int:
    """``streamrec replay``, then with ``--follow`` the downstream stages and the summary."""
    if not getattr(args, "follow", False):
        return replay_cmd(args)
    if getattr(args, "items", None) is not None:
        print("replay: --follow follows an events replay, not --items", file=sys.stderr)
        return 2
    import json
    import tempfile
    from pathlib import Path

    from streamrec.settings import load_settings

    settings = load_settings()
    if args.topic:
        settings = settings.model_copy(update={"kafka": settings.kafka.model_copy(
            update={"events_topic": args.topic})})
    before = snapshot(settings)
    own_json = args.json_path is None
    if own_json:
        handle, name = tempfile.mkstemp(suffix=".json")
        import os

        os.close(handle)
        args.json_path = Path(name)
    try:
        code = replay_cmd(args)
        if code != 0:
            return code
        report = json.loads(args.json_path.read_text())
        summary = follow(settings, before, report, group_id=args.features_group,
                         say=lambda text: print(text, flush=True))
        if not own_json:
            args.json_path.write_text(json.dumps({**report, "backfill": summary}, indent=2))
    finally:
        if own_json:
            args.json_path.unlink(missing_ok=True)
    print(summary_line(summary))
    return 0


def register_follow(sub: Any) -> None:
    """Add ``--follow`` to the ``replay`` subcommand registered by ``stream.cli.ingest``."""
    rp = sub.choices["replay"]
    rp.add_argument("--follow", action="store_true",
                    help="then wait for the feature job, the trainer and a served version, "
                    "with progress and ETA, and print a summary (wall time per stage)")
    rp.add_argument("--features-group", default="streamrec-features",
                    help="the feature job's consumer group (default streamrec-features)")
    inner = rp.get_default("func")
    rp.set_defaults(func=lambda args: replay_and_follow(args, inner))
