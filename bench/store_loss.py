"""The online store's durability: AOF cost on the feature job, and recovery after a kill -9.

Needs Kafka up; starts its own Redis servers on free ports, so the stack's Redis is never
touched. AOF cost: the feature job's throughput against Redis without and with
``appendfsync everysec``, alternating. Recovery: Redis killed with SIGKILL under load and
restarted empty; timed until every user's features are back and serving says ``whole``, and
the acknowledged events missing at the end counted. Details: docs/internals.md.

    python bench/store_loss.py --json bench/results/store_loss.json
    python bench/store_loss.py --skip-aof --users 100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import features as fb  # noqa: E402
from bench.harness import free_port, wait_until  # noqa: E402
from feature_store.errors import OnlineStoreError  # noqa: E402
from streamrec.settings import Settings, load_settings  # noqa: E402

T0 = 1_760_000_000_000


class RedisServer:
    """A private redis-server (AOF on or off) that can be killed and started again."""

    def __init__(self, directory: Path, aof: bool) -> None:
        self.directory, self.aof, self.port = directory, aof, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        import redis

        self.directory.mkdir(parents=True, exist_ok=True)
        args = [shutil.which("redis-server") or "redis-server", "--port", str(self.port),
                "--bind", "127.0.0.1", "--save", "", "--dir", str(self.directory),
                "--appendonly", "yes" if self.aof else "no"]
        if self.aof:
            args += ["--appendfsync", "everysec"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_timeout=1)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(up, 60, f"redis-server on {self.port}", interval_s=0.02)
        client.close()
        return time.monotonic()

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def settings(self, base: Settings) -> Settings:
        return base.model_copy(update={"redis": base.redis.model_copy(
            update={"port": self.port, "appendonly": self.aof})})


def aof_cost(base: Settings, n: int, rounds: int, work: Path, log: Path) -> dict[str, Any]:
    servers = {aof: RedisServer(work / f"redis-aof-{aof}", aof) for aof in (False, True)}
    for server in servers.values():
        server.start()
    runs: dict[bool, list[float]] = {False: [], True: []}
    try:
        for r in range(rounds):
            for aof in (False, True):
                result = fb.throughput(servers[aof].settings(base), n, 1, "thread", log)
                runs[aof].append(result["events_per_s"])
                print(f"round {r + 1}: AOF {'on ' if aof else 'off'} "
                      f"{result['events_per_s']:,.0f} events/s (load {result['load_avg_1m']})",
                      flush=True)
    finally:
        for server in servers.values():
            server.kill9()
    off, on = statistics.median(runs[False]), statistics.median(runs[True])
    return {"events": n, "rounds": rounds, "aof_off_events_per_s": runs[False],
            "aof_on_events_per_s": runs[True], "median_off": off, "median_on": on,
            "cost_pct": round(100.0 * (off - on) / off, 1)}


def _user_event(i: int) -> dict[str, Any]:
    return {"event_id": f"r{i}", "user_id": f"u{i // 2}", "item_id": f"i{i * 7919 % 20000}",
            "event_type": "click", "ts": T0 + i, "value": None, "context": None}


class Load(threading.Thread):
    """Events of ``load-*`` users at ``rate``/s through an acks=all producer."""

    def __init__(self, s: Settings, rate: float, users: int = 200) -> None:
        super().__init__(daemon=True)
        self.s, self.rate, self.users = s, rate, users
        self.stop_event = threading.Event()
        self.acked: Counter[str] = Counter()
        self.failed = 0
        self._lock = threading.Lock()

    def run(self) -> None:
        from stream.kafka_client import make_producer

        producer = make_producer(self.s.kafka)
        n, started = 0, time.monotonic()
        try:
            while not self.stop_event.is_set():
                user = f"load-{n % self.users}"
                e = {"event_id": f"l{n}", "user_id": user, "item_id": f"i{n % 997}",
                     "event_type": "click", "ts": T0 + 10_000_000 + n, "value": None,
                     "context": None}
                future = producer.send(self.s.kafka.events_topic, key=user.encode(),
                                       value=json.dumps(e).encode())
                future.add_callback(lambda _m, u=user: self._ack(u))
                future.add_errback(lambda _e: self._fail())
                n += 1
                delay = started + n / self.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # pacing of the load generator
            producer.flush(30)
        finally:
            producer.close()

    def _ack(self, user: str) -> None:
        with self._lock:
            self.acked[user] += 1

    def _fail(self) -> None:
        with self._lock:
            self.failed += 1


def recovery(base: Settings, users: int, rate: float, down_s: float, aof: bool, work: Path,
             log: Path) -> dict[str, Any]:
    from kafka import KafkaProducer

    from feature_store.store import open_store
    from serving.store_health import StoreHealth

    server = RedisServer(work / "redis-recovery", aof)
    server.start()
    s = fb._fresh(server.settings(base), "recovery")  # noqa: SLF001 - the bench's own helper
    producer = KafkaProducer(bootstrap_servers=s.kafka.bootstrap, acks=1, linger_ms=20,
                             batch_size=512 * 1024)
    for i in range(2 * users):
        e = _user_event(i)
        producer.send(s.kafka.events_topic, key=e["user_id"].encode(), value=json.dumps(e).encode())
    producer.flush()
    producer.close()
    ids = [f"u{i}" for i in range(users)]
    store = open_store(s, timeout_s=2.0)
    proc = fb._start_job(s, 1, log, "thread")  # noqa: SLF001
    load = Load(s, rate)
    try:
        def all_back(reference: list[Any] | None) -> bool:
            for start in range(0, users, 10_000):
                got = store.read_users(ids[start:start + 10_000])
                want = reference[start:start + 10_000] if reference else None
                if want is None and not all(got) or want is not None and got != want:
                    return False
            return True

        t = time.monotonic()
        wait_until(lambda: all_back(None), 900, "every user's features", 0.5, process=proc)
        built_s = time.monotonic() - t
        reference = [f for start in range(0, users, 10_000)
                     for f in store.read_users(ids[start:start + 10_000])]
        health = StoreHealth(store, ttl_s=0)
        wait_until(lambda: health.status().state == "whole", 30, "the store to be whole")
        load.start()
        wait_until(lambda: sum(load.acked.values()) > rate * 3, 60, "the load to run")
        server.kill9()
        killed = time.monotonic()
        time.sleep(down_s)  # the outage itself
        ready = server.start()
        #: (seconds after ready, serving's reading of the store, every user back)
        states: list[tuple[float, str, bool]] = []

        def back() -> bool:
            try:
                status = health.status().state
                done = all_back(reference)
            except OnlineStoreError:  # Redis still coming back: not yet
                return False
            states.append((time.monotonic() - ready, status, done))
            return done

        wait_until(back, 600, "every user's features back", 0.25, process=proc)
        users_back_s = time.monotonic() - ready
        wait_until(lambda: health.status().state == "whole", 120, "the store to be whole")
        whole_s = time.monotonic() - ready
        load.stop_event.set()
        load.join(60)
        acked = dict(load.acked)

        def missing() -> int:
            got = store.read_users(sorted(acked))
            return sum(max(0, acked[u] - (sum(f.counts["7d"].values()) if f else 0))
                       for u, f in zip(sorted(acked), got, strict=True))

        deadline = time.monotonic() + 120
        while missing() and time.monotonic() < deadline:
            time.sleep(0.5)  # the job catching up with the load's tail
        lost = missing()
        degraded = [st for _, st, _ in states if st != "whole"]
        falsely_whole = [round(at, 2) for at, st, done in states if st == "whole" and not done]
    finally:
        load.stop_event.set()
        fb._stop_job(proc)  # noqa: SLF001
        store.close()
        server.kill9()
    return {"users": users, "aof": aof, "down_s": down_s, "load_rate": rate,
            "build_s": round(built_s, 1),
            "killed_to_ready_s": round(ready - killed, 2),
            "users_back_s": round(users_back_s, 2),
            "users_back_per_s": round(users / users_back_s, 0),
            "store_whole_s": round(whole_s, 2),
            "health_states_seen": sorted({st for _, st, _ in states}),
            "polls_not_whole": len(degraded),
            "polls_whole_before_every_user_was_back": falsely_whole,
            "acked_load_events": sum(acked.values()), "load_send_failures": load.failed,
            "acked_events_lost": lost,
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench store_loss", description=__doc__.splitlines()[0])
    p.add_argument("--aof-events", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=500.0, help="load during the kill, events/s")
    p.add_argument("--down-s", type=float, default=2.0)
    p.add_argument("--recovery-aof", action="store_true",
                   help="restart Redis from its AOF (default: empty, the worst case)")
    p.add_argument("--skip-aof", action="store_true")
    p.add_argument("--skip-recovery", action="store_true")
    p.add_argument("--log", type=Path, default=Path("/tmp/bench-store-loss-job.log"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    base = load_settings()
    work = Path(tempfile.mkdtemp(prefix="bench-store-loss-"))
    out: dict[str, Any] = {"load_avg_1m_start": round(os.getloadavg()[0], 2)}
    try:
        if not args.skip_aof:
            out["aof"] = aof_cost(base, args.aof_events, args.rounds, work, args.log)
            print(f"AOF cost on the feature job: {out['aof']['cost_pct']}% "
                  f"(median {out['aof']['median_off']:,.0f} -> {out['aof']['median_on']:,.0f} "
                  "events/s)", flush=True)
        if not args.skip_recovery:
            out["recovery"] = r = recovery(base, args.users, args.rate, args.down_s,
                                           args.recovery_aof, work, args.log)
            print(f"recovery: {r['users']:,} users back {r['users_back_s']} s after Redis was "
                  f"ready ({r['users_back_per_s']:,.0f} users/s), store whole after "
                  f"{r['store_whole_s']} s, states {r['health_states_seen']}, "
                  f"{r['acked_load_events']} acknowledged load events, {r['acked_events_lost']} lost",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
