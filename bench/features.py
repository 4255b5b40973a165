"""Feature job throughput (parallelism 1 and 2) and feature freshness at a steady 2,000 events/s.

Needs Kafka and Redis up (``streamrec up``, or the test stack). Throughput: a preloaded topic
read by the job as fast as it can, timed from the first feature in Redis to the last sentinel
(JVM start-up not counted). Freshness: ingest API -> feature visible through serving's
features API. This bench is the evidence behind ``stream/flink/job.py``'s shape; how it
measures: docs/internals.md.

    streamrec bench features --json bench/results/features.json
    python bench/features.py --events 100000 --parallelism 1 2 --json out.json
    STREAMREC_FLINK__TASKMANAGERS=2 STREAMREC_FLINK__TASKMANAGER_SLOTS=1 streamrec up --infra
    python bench/features.py --cluster --parallelism 2 --skip-freshness
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import free_port, http_ok, wait_until  # noqa: E402
from deploy.process import cpu_seconds  # noqa: E402
from streamrec.settings import Settings, load_settings  # noqa: E402

T0 = 1_750_000_000_000
#: Extra job arguments for experiments (``--job-arg=--bundle-size=10000``).
EXTRA_JOB_ARGS: list[str] = []
#: ``--cluster``: submit the job to the running standalone cluster, not a MiniCluster.
CLUSTER = False


def _fresh(settings: Settings, tag: str) -> Settings:
    from stream.kafka_client import ensure_topics

    uid = f"bench-features-{tag}-{int(time.time() * 1000)}"
    s = settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(
                update={
                    "events_topic": f"{uid}.events",
                    "dlq_topic": f"{uid}.events.dlq",
                    "samples_topic": f"{uid}.samples",
                }
            ),
            "redis": settings.redis.model_copy(update={"key_prefix": f"{uid}:"}),
        }
    )
    ensure_topics(s.kafka, [s.kafka.events_topic, s.kafka.dlq_topic, s.kafka.samples_topic,
                           s.kafka.items_topic])
    return s


def _event(i: int, ts: int, user: str | None = None) -> dict[str, Any]:
    return {
        "event_id": f"b{i}",
        "user_id": user or f"u{i % 5000}",
        "item_id": f"i{i * 7919 % 20000}",
        "event_type": "impression" if i % 5 == 0 else "click",
        "ts": ts,
        "value": None,
        "context": None,
    }


def _job_args(settings: Settings, parallelism: int, mode: str) -> list[str]:
    from stream.cli.features import settings_json

    return [
        "--settings-json", settings_json(settings),
        "--parallelism", str(parallelism),
        "--group-id", f"{settings.redis.key_prefix}job",
        "--job-name", f"{settings.redis.key_prefix}job",
        "--python-mode", mode,
        # Filesystem checkpoints, as on the cluster: the default (JobManager memory) storage
        # refuses state over 5 MB, and a failed checkpoint restarts the job.
        "--checkpoint-dir", tempfile.mkdtemp(prefix=f"{settings.redis.key_prefix.rstrip(':')}-"),
        *EXTRA_JOB_ARGS,
    ]  # fmt: skip


def _start_job(settings: Settings, parallelism: int, log: Path, mode: str) -> Any:
    if CLUSTER:
        return ClusterJob(settings, _job_args(settings, parallelism, mode))
    cmd = [sys.executable, "-m", "stream.flink.job", "--local",
           *_job_args(settings, parallelism, mode)]
    return subprocess.Popen(
        cmd, cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
    )


class ClusterJob:
    """The job submitted to the running standalone cluster (``--cluster``), with the
    ``Popen`` calls the bench uses: ``poll``, ``pid``/CPU of the cluster's processes, stop."""

    def __init__(self, settings: Settings, args: list[str]) -> None:
        from stream.flink.submit import submit_python_job

        self.settings, self.args = settings, args
        self.job_id = submit_python_job(settings, REPO / "stream" / "flink_features.py", args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        from stream.flink.submit import job_state

        state = job_state(self.settings, self.job_id)
        if state in ("FAILED", "CANCELED", "FINISHED"):
            self.returncode = 1
        return self.returncode

    def cpu_seconds(self) -> float:
        """CPU of the JobManager's and the TaskManagers' process groups (pid files of the
        stack's run folder)."""
        from deploy.process import read_pid

        pids = self.settings.stack.run_dir.resolve() / "pids"
        records = [read_pid(pids / f"{n}.pid") for n in ("flink-jobmanager", "flink-taskmanager")]
        return sum(cpu_seconds(r.pid, group=True) for r in records if r is not None)

    def stop(self) -> None:
        from stream.flink.submit import cancel_job

        try:
            cancel_job(self.settings, self.job_id)
        finally:
            shutil.rmtree(self.args[self.args.index("--checkpoint-dir") + 1], ignore_errors=True)


def _job_cpu(proc: Any) -> float:
    return proc.cpu_seconds() if isinstance(proc, ClusterJob) else cpu_seconds(proc.pid, group=True)


def _stop_job(proc: Any) -> None:
    if isinstance(proc, ClusterJob):
        proc.stop()
        return
    try:
        _kill_job(proc)
    finally:
        args = proc.args if isinstance(proc.args, list) else []
        if "--checkpoint-dir" in args:
            shutil.rmtree(str(args[args.index("--checkpoint-dir") + 1]), ignore_errors=True)


def _kill_job(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 20)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.05,
          job: Any = None) -> float:
    """:func:`tests.support.wait_until`; returns the time (``time.monotonic()``) it held."""
    wait_until(predicate, timeout_s, what, interval_s, process=job)
    return time.monotonic()


def _preload(s: Settings, n: int) -> list[str]:
    """Write ``n`` events and one sentinel per partition; returns the sentinel user ids."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=s.kafka.bootstrap, acks=1, linger_ms=20, batch_size=512 * 1024
    )
    topic = s.kafka.events_topic
    for i in range(n):
        e = _event(i, T0 + i)
        producer.send(topic, key=e["user_id"].encode(), value=json.dumps(e).encode())
    partitions = sorted(producer.partitions_for(topic))
    sentinels = [f"sentinel-{p}" for p in partitions]
    for p, user in zip(partitions, sentinels, strict=True):
        e = _event(n + p, T0 + n + p, user=user)
        producer.send(topic, key=user.encode(), value=json.dumps(e).encode(), partition=p)
    producer.flush()
    producer.close()
    return sentinels


def throughput(base: Settings, n: int, parallelism: int, mode: str, log: Path) -> dict[str, Any]:
    import redis

    from feature_store.store import open_store

    s = _fresh(base, f"p{parallelism}")
    sentinels = _preload(s, n)
    store = open_store(s)
    keys = redis.Redis(host=s.redis.host, port=s.redis.port, db=s.redis.db,
                       password=s.redis.password.get_secret_value() if s.redis.password else None)
    proc = _start_job(s, parallelism, log, mode)
    try:
        # any user key (FORMAT.md layout): the job's first write, whoever it is for
        first = _wait(lambda: any(keys.scan_iter(match=f"{s.redis.key_prefix}u:*", count=100)),
                      180, "the first feature", job=proc)
        cpu_first = _job_cpu(proc)
        done = _wait(lambda: all(store.read_users(sentinels)), 1800, "every sentinel", 0.2,
                     job=proc)
        cpu = _job_cpu(proc) - cpu_first
    finally:
        _stop_job(proc)
        store.close()
        keys.close()
    seconds = done - first
    return {"parallelism": parallelism, "python_mode": mode, "events": n,
            "cluster": CLUSTER, "taskmanagers": base.flink.taskmanagers if CLUSTER else None,
            "seconds": round(seconds, 2), "events_per_s": round(n / seconds, 1),
            "cpu_s": round(cpu, 2), "events_per_cpu_s": round(n / cpu, 1) if cpu else None,
            "load_avg_1m": round(os.getloadavg()[0], 2)}


SQL_COUNTS = """
INSERT INTO counts
SELECT user_id, event_type, COUNT(*) AS n, MAX(ts) AS last_ts
FROM events GROUP BY user_id, event_type
"""


def sql_worker(spec: dict[str, Any]) -> None:
    """The JVM-only comparison: parse JSON and keep per-(user, type) counts in Flink SQL."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    sys.path.insert(0, str(REPO))
    from stream.flink.job import connector_jar

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = t_env.get_config()
    conf.set("pipeline.jars", connector_jar().as_uri())
    conf.set("parallelism.default", str(spec["parallelism"]))
    conf.set("table.exec.mini-batch.enabled", "true")
    conf.set("table.exec.mini-batch.allow-latency", "100 ms")
    conf.set("table.exec.mini-batch.size", "5000")
    t_env.execute_sql(f"""
        CREATE TABLE events (
            event_id STRING, user_id STRING, item_id STRING, event_type STRING, ts BIGINT
        ) WITH (
            'connector' = 'kafka', 'topic' = '{spec["topic"]}',
            'properties.bootstrap.servers' = '{spec["bootstrap"]}',
            'properties.group.id' = '{spec["topic"]}-sql',
            'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset',
            'format' = 'json', 'json.ignore-parse-errors' = 'true'
        )""")
    t_env.execute_sql("""
        CREATE TABLE counts (user_id STRING, event_type STRING, n BIGINT, last_ts BIGINT)
        WITH ('connector' = 'blackhole')""")
    t_env.execute_sql(SQL_COUNTS).wait()


def sql_counts(base: Settings, n: int, parallelism: int, log: Path) -> dict[str, Any]:
    """Throughput of the Flink SQL comparison job (wall time includes the job's start-up)."""
    s = _fresh(base, f"sql{parallelism}")
    _preload(s, n)
    spec = {"topic": s.kafka.events_topic, "bootstrap": s.kafka.bootstrap,
            "parallelism": parallelism}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--sql-worker",
                             json.dumps(spec)], cwd=REPO, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    cpu = 0.0
    while proc.poll() is None:
        cpu = max(cpu, cpu_seconds(proc.pid, group=True))
        time.sleep(0.2)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"SQL comparison job failed ({proc.returncode}); see {log}")
    return {"parallelism": parallelism, "events": n, "seconds_incl_startup": round(seconds, 2),
            "events_per_s_incl_startup": round(n / seconds, 1),
            "cpu_s_incl_startup": round(cpu, 2),
            "events_per_cpu_s_incl_startup": round(n / cpu, 1) if cpu else None,
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def freshness(base: Settings, rate: float, duration_s: float, probe_every: float,
              log: Path) -> dict[str, Any]:
    import uvicorn
    from fastapi import FastAPI

    from feature_store.store import open_store
    from serving import errors
    from serving.features_api import features_router
    from streamrec.client import Client, NotFound, StreamrecError

    s = _fresh(base, "fresh")
    store = open_store(s)
    app = FastAPI()
    app.include_router(features_router(store))
    errors.install(app)
    read_port, ingest_port = free_port(), free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=read_port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    env = dict(os.environ, STREAMREC_KAFKA__EVENTS_TOPIC=s.kafka.events_topic,
               STREAMREC_KAFKA__PORT=str(s.kafka.port))
    ingest = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "ingest-api", "--port", str(ingest_port)],
        cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    job = _start_job(s, 1, log, "thread")
    ingest_url = f"http://127.0.0.1:{ingest_port}"
    read_url = f"http://127.0.0.1:{read_port}"
    latencies: list[float] = []
    stop = threading.Event()
    accepted_events = [0, 0.0, 0.0]  # events answered 2xx, first and last post (monotonic)

    def load() -> None:
        batch, i = max(1, int(rate / 10)), 0
        with Client(ingest_url, None, batch_size=batch, retries=0) as client:
            next_at = accepted_events[1] = time.monotonic()
            while not stop.is_set():
                now_ms = int(time.time() * 1000)
                body = [_event(10_000_000 + i + k, now_ms) for k in range(batch)]
                i += batch
                try:
                    accepted_events[0] += client.send(body).accepted
                except StreamrecError:
                    pass  # counted as not accepted: the achieved rate says so
                accepted_events[2] = time.monotonic()
                next_at += batch / rate
                time.sleep(max(0.0, next_at - time.monotonic()))

    try:
        def visible(user: str) -> bool:
            try:
                client.features(user)
            except NotFound:
                return False
            return True

        with Client(ingest_url, read_url) as client:
            _wait(lambda: http_ok(ingest_url + "/health"), 60, "ingest-api")
            client.send([_event(-1, int(time.time() * 1000), user="warmup")])
            _wait(lambda: visible("warmup"), 180, "the job to start")
            loader = threading.Thread(target=load, daemon=True)
            loader.start()
            end = time.monotonic() + duration_s
            k = 0
            while time.monotonic() < end:
                user = f"probe-{k}"
                k += 1
                client.send([_event(-100 - k, int(time.time() * 1000), user=user)])
                accepted = time.monotonic()
                seen = _wait(lambda u=user: visible(u), 30, f"probe {user}", 0.01)
                latencies.append(seen - accepted)
                time.sleep(max(0.0, probe_every - (time.monotonic() - accepted)))
            stop.set()
            loader.join(timeout=10)
    finally:
        stop.set()
        _stop_job(job)
        _stop_job(ingest)
        server.should_exit = True
        store.close()
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    span = accepted_events[2] - accepted_events[1]
    achieved = round(accepted_events[0] / span, 1) if span > 0 else None
    return {"rate": rate, "achieved_rate": achieved, "probes": len(latencies),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "p50": round(q[49], 3), "p95": round(q[94], 3), "p99": round(q[98], 3)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench features", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--parallelism", type=int, nargs="+", default=[1, 2])
    p.add_argument("--python-mode", nargs="+", default=["thread"], choices=["thread", "process"])
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--duration", type=float, default=30.0, help="freshness run, seconds")
    p.add_argument("--probe-every", type=float, default=0.25)
    p.add_argument("--skip-freshness", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--log", type=Path, default=Path("/tmp/bench-features-job.log"))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--job-arg", action="append", default=[], help="extra job argument")
    p.add_argument("--cluster", action="store_true",
                   help="run the throughput job on the running standalone cluster (`streamrec up "
                   "--only flink-jobmanager,flink-taskmanager`; STREAMREC_FLINK__TASKMANAGERS=2 "
                   "and STREAMREC_FLINK__TASKMANAGER_SLOTS=1 for one TaskManager JVM per "
                   "subtask); CPU is that of the cluster's processes. A thread-mode TaskManager "
                   "keeps the modules of its first job: restart it after changing the code")
    p.add_argument("--sql-events", type=int, default=0,
                   help="also run the Flink SQL comparison (counts only) on this many events")
    p.add_argument("--sql-worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sql_worker:
        sql_worker(json.loads(args.sql_worker))
        return 0
    EXTRA_JOB_ARGS[:] = args.job_arg
    global CLUSTER
    CLUSTER = args.cluster

    base = load_settings()
    runs = []
    for mode in [] if args.skip_throughput else args.python_mode:
        for par in args.parallelism:
            r = throughput(base, args.events, par, mode, args.log)
            print(f"throughput p={par} {mode}: {r['events_per_s']:.0f} events/s "
                  f"({r['events']} in {r['seconds']} s; {r['events_per_cpu_s']} events per "
                  f"CPU-second of the job; load average {r['load_avg_1m']})")
            runs.append(r)
    result: dict[str, Any] = {
        "events_per_s": max((r["events_per_s"] for r in runs), default=None),
        "throughput_runs": runs,
    }
    if args.sql_events:
        sql = [sql_counts(base, args.sql_events, par, args.log) for par in args.parallelism]
        for r in sql:
            print(f"Flink SQL counts only, p={r['parallelism']}: "
                  f"{r['events_per_s_incl_startup']:.0f} events/s including start-up "
                  f"({r['events']} in {r['seconds_incl_startup']} s; "
                  f"{r['events_per_cpu_s_incl_startup']} events per CPU-second)")
        result["sql_comparison_runs"] = sql
    if not args.skip_freshness:
        f = freshness(base, args.rate, args.duration, args.probe_every, args.log)
        print(f"freshness at {f['rate']:.0f} events/s (achieved {f['achieved_rate']}) over "
              f"{f['probes']} probes (load average {f['load_avg_1m']}): "
              f"p50 {f['p50']} s, p95 {f['p95']} s, p99 {f['p99']} s")
        result["freshness_s"] = {k: f[k] for k in ("p50", "p95", "p99")}
        result["freshness_run"] = f
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
