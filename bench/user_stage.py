"""The feature job's user and item stages in-process, over a simulated log: CPU per event.

Drives ``UserBatchStage.process_element`` (and ``ItemBatchStage`` with ``--items``) with
in-memory fakes of Flink's state, timers and metrics, on batches shaped as the JVM hands them
(records of a user bucket, in arrival order, ``--batch`` per call), and a real Redis store
when ``--redis-port`` names a running server (else the payloads are encoded and dropped).
Prints CPU microseconds per event and a digest of everything the stages produced (samples,
DLQ records, item rows, packed states, store arguments): two revisions that produce the same
digest wrote the same bytes.

    python bench/user_stage.py --events 200000 [--redis-port 6379] [--profile out.html]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


class _MapState:
    """A keyed ``MapState`` holding the packed states (keyed by id only: ids do not repeat
    across buckets)."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}

    def get(self, key: str) -> Any:
        return self.entries.get(key)

    def put_all(self, entries: dict[str, bytes]) -> None:
        self.entries.update(entries)


class _Counter:
    def inc(self, n: int = 1) -> None:
        pass


class _Timers:
    def current_watermark(self) -> int:
        return -(2**63)

    def current_processing_time(self) -> int:
        return int(time.time() * 1000)

    def register_processing_time_timer(self, at: int) -> None:
        pass


class _Ctx:
    timers = _Timers()

    def timer_service(self) -> _Timers:
        return self.timers


class _Recorder:
    """The store: hashes what it is given, then passes it on (or drops it)."""

    def __init__(self, store: Any, digest: Any) -> None:
        self.store, self.digest = store, digest

    def write_user_rows(self, rows: Any, mark: Any = None) -> Any:
        from feature_store.redis_store import encode_user_values

        rows = list(rows)
        for uid, as_of, seq, h, c, ls in rows:
            self.digest.update(b"%s %d %d %s\n" % (uid.encode(), as_of, seq,
                                                  encode_user_values(h, c, ls)))
        return self.store.write_user_rows(rows, mark=mark) if self.store else True

    def write_batch(self, **kw: Any) -> Any:
        self.digest.update(repr(sorted(kw.items())).encode())
        return self.store.write_batch(**kw) if self.store else True

    def close(self) -> None:
        if self.store:
            self.store.close()


def wire_log(events: int, partitions: int) -> list[tuple[str, int, int, str]]:
    """``(user_id, partition, offset, raw)`` of the replayed simulated log, in send order."""
    import orjson

    from stream.simulate import LOG_START_MS, simulated_log

    offsets = [0] * partitions
    out = []
    for n, e in enumerate(simulated_log("rating", events, seed=1, users=20_000, items=10_000,
                                        start_ms=LOG_START_MS)):
        uid = e["user_id"]
        part = zlib.crc32(uid.encode()) % partitions
        wire = {"event_id": hashlib.blake2b(b"%d" % n, digest_size=12).hexdigest(),
                "user_id": uid, "item_id": e["item_id"], "event_type": e["event_type"],
                "ts": e["ts"], "value": None, "context": None}
        out.append((uid, part, offsets[part], orjson.dumps(wire).decode()))
        offsets[part] += 1
    return out


def batches(log: list[tuple[str, int, int, str]], batch: int) -> list[tuple[str, list[str]]]:
    """The user stage's input: per ``batch`` records of the log, one array per bucket."""
    from stream.flink.functions import user_input

    out = []
    for start in range(0, len(log), batch * 16):
        by_bucket: dict[str, list[str]] = {}
        for uid, part, off, raw in log[start:start + batch * 16]:
            bucket = hashlib.md5(uid.encode()).hexdigest()[0]
            by_bucket.setdefault(bucket, []).append(user_input(uid, part, off, raw))
        out.extend(by_bucket.items())
    return out


def user_stage(store: Any) -> Any:
    from feature_store.features import unpack_user
    from stream.cli.features import settings_json
    from stream.flink.functions import UserBatchStage
    from streamrec.settings import load_settings

    stage = UserBatchStage(settings_json(load_settings()), 60_000, "events", 100_000)
    return _open(stage, store, "users", unpack_user, "UserState",
                 ("events_bad", "events_duplicate", "events_late", "events_applied",
                  "samples_emitted"))


def item_stage(store: Any) -> Any:
    from feature_store.features import unpack_item
    from stream.cli.features import settings_json
    from stream.flink.functions import ItemBatchStage
    from streamrec.settings import load_settings

    stage = ItemBatchStage(settings_json(load_settings()), 60_000, 100_000)
    return _open(stage, store, "items", unpack_item, "ItemState", ())


def _open(stage: Any, store: Any, name: str, unpack: Any, new: str, counters: Sequence[str]
          ) -> Any:
    """What ``open`` does, with fakes (no generation: the marks are the store's business)."""
    from feature_store import features
    from feature_store.features import FeatureParams
    from stream.flink.functions import StateCache
    from streamrec.settings import load_settings

    settings = load_settings()
    stage.params = FeatureParams.from_settings(settings.features, bucket_ms=60_000)
    stage.store = store
    fields = {"_counters": {c: _Counter() for c in counters},
              "_counts": dict.fromkeys(counters, 0), "_unpack": unpack,
              "_new": getattr(features, new), "_types": frozenset(stage.params.event_weights)}
    for name, value in fields.items():
        setattr(stage, name, value)
    stage.states = _MapState()
    stage.cache = StateCache(100_000, 0)
    return stage


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench user_stage", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=32, help="records per bucket and call")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--items", action="store_true", help="run the item stage on the user "
                   "stage's item rows too (1 s windows: 10 user calls' rows per item call)")
    p.add_argument("--redis-port", type=int, default=None)
    p.add_argument("--profile", type=Path, default=None, help="pyinstrument HTML report")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    from stream.gc_tuning import tune_gc

    log = wire_log(args.events, args.partitions)
    calls = batches(log, args.batch)
    digest = hashlib.blake2b(digest_size=16)
    store = None
    if args.redis_port is not None:
        from feature_store.store import open_store
        from streamrec.settings import load_settings

        s = load_settings()
        s = s.model_copy(update={"redis": s.redis.model_copy(
            update={"port": args.redis_port, "key_prefix": f"bench{time.time_ns()}:"})})
        store = open_store(s)
    users = user_stage(_Recorder(store, digest))
    items = item_stage(_Recorder(store, digest)) if args.items else None
    ctx = _Ctx()
    tune_gc()
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
    item_rows: list[str] = []
    user_cpu = item_cpu = 0.0
    for n, (_, values) in enumerate(calls):
        t0 = time.process_time()
        out = list(users.process_element(values, ctx))
        user_cpu += time.process_time() - t0
        for row in out:
            samples, dlq, rows = row[0], row[1], row[2]
            digest.update("\n".join(samples).encode())
            digest.update("\n".join(dlq).encode())
            digest.update("\n".join(rows).encode())
            item_rows.extend(rows)
        if items is not None and (n % 160 == 159 or n == len(calls) - 1):
            by_bucket: dict[str, list[str]] = {}
            for r in item_rows:
                by_bucket.setdefault(r[0], []).append(r)
            item_rows.clear()
            t0 = time.process_time()
            for vals in by_bucket.values():
                for row in items.process_element(vals, ctx):
                    digest.update(repr(row[1]).encode())
            item_cpu += time.process_time() - t0
    if profiler is not None:
        profiler.stop()
        args.profile.write_text(profiler.output_html())
    # the states unpacked: marshal's bytes of equal values may differ (it flags a string as
    # interned, or as shared only when something else holds it too)
    from feature_store.features import unpack_item, unpack_user

    for stage, unpack in ((users, unpack_user), (items, unpack_item)):
        if stage is None:
            continue
        for key in sorted(stage.states.entries):
            state = unpack(stage.states.entries[key])
            digest.update(repr((key, state)).encode())
    out = {"events": args.events, "calls": len(calls),
           "user_us_per_event": round(user_cpu / args.events * 1e6, 2),
           "item_us_per_event": round(item_cpu / args.events * 1e6, 2),
           "digest": digest.hexdigest()}
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    users.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
