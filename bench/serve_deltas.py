"""Serving latency while deltas apply: p50/p99 of GET /recommend at c=16 with and without a
delta stream, alternating, over a ~120k-item catalog and 2 workers (issue 20's target:
p99 <= 20 ms, zero errors, while a delta applies every second).

    python -m bench.serve_deltas [--concurrency 16] [--workers 2] [--duration 10]
                                 [--rounds 2] [--every 1] [--fill 100000] [--json FILE]

A trainer (the live defaults, as ``bench.deltas``) is warmed on the synthetic stream, its
tables filled with ``--fill`` random named rows (so the catalog is ~``fill`` + the stream's
items), and a full version with its delta snapshot is published into a throwaway registry;
then the deltas of ``--rate`` samples each are built ahead (the trainer's cost is not the
point here: it runs in another process in production). A throwaway Kafka and Redis
(``deploy.stack``, own run dir and ports) carry the deltas and the users' histories;
``streamrec serve --workers N`` follows the updates topic. The load generator
(``bench/serve.py loadgen``, its own process, closed loop) runs ``--rounds`` pairs of
phases: without deltas, then with one delta sent every ``--every`` seconds.

Reported per phase: p50/p99/rps/errors, deltas sent, and the workers' applied count and
their last apply (decode + apply + compose) from ``/model``; overall, ``apply_ms`` and
``apply_rows`` of the same deltas applied in this process (as ``bench.deltas``), and the
load average (the machine is shared: figures compare at equal load only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
SERVE = HERE.parent / "serve.py"


def _pct(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, np.float64)
    return {"p50": round(float(np.percentile(arr, 50)), 2),
            "p95": round(float(np.percentile(arr, 95)), 2), "n": int(arr.size)}


def _lineage(args: argparse.Namespace, registry: Any) -> tuple[list[bytes], list[int], list[float]]:
    """Publish a version with its snapshot; return the records of the deltas after it, their
    rows and their in-process apply + compose cost."""
    from bench.deltas import fill_tables, synthetic_trainer
    from model.delta import SNAPSHOT_FILE, apply, compose, decode, encode, from_snapshot
    from model.trainer.deltas import DeltaBuilder
    from model.trainer.export import publish_version

    trainer, item_ids, train, _ = synthetic_trainer(args.users, args.items, 512)
    builder = DeltaBuilder(trainer, lambda: item_ids)
    train(args.warm_samples)
    fill_tables(trainer, item_ids, args.fill)
    now = datetime.now(UTC)
    version = now.strftime("%Y%m%dT%H%M%SZ") + "-000001"
    meta = {"created_at": now.isoformat(), "trained_through_ms": int(now.timestamp() * 1000)}
    snap = builder.snapshot(version, meta)
    publish_version(registry, trainer, item_ids, version,
                    {"trained_through_ms": meta["trained_through_ms"]}, created_at=now,
                    extra_files={SNAPSHOT_FILE: encode(snap, "float32", compress=True)})
    state = from_snapshot(snap)
    served = compose(state)
    records, rows, apply_ms = [], [], []
    for _ in range(args.deltas):
        train(args.rate)
        delta = builder.delta({**meta, "created_at": datetime.now(UTC).isoformat()})
        record = encode(delta)
        records.append(record)
        rows.append(delta.rows_changed)
        a0 = time.perf_counter()
        state = apply(state, decode(record))
        served = compose(state, served)
        apply_ms.append((time.perf_counter() - a0) * 1000.0)
    print(f"version {version}: catalog {served.item_ids.shape[0]} items, "
          f"{len(records)} deltas built", flush=True)
    return records, rows, apply_ms


def _model_status(httpx: Any, url: str, tries: int = 12) -> dict[int, dict[str, Any]]:
    """``/model``'s delta status per worker pid (whichever workers answer ``tries`` asks)."""
    out: dict[int, dict[str, Any]] = {}
    for _ in range(tries):
        info = httpx.get(url + "/model", timeout=5.0).json()
        out[int(info["worker_pid"])] = info.get("delta") or {}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.serve_deltas", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per phase")
    p.add_argument("--rounds", type=int, default=2, help="pairs of phases (off, on)")
    p.add_argument("--every", type=float, default=1.0, help="seconds between deltas")
    p.add_argument("--users", type=int, default=20_000)
    p.add_argument("--items", type=int, default=20_000)
    p.add_argument("--warm-samples", type=int, default=40_000)
    p.add_argument("--fill", type=int, default=100_000)
    p.add_argument("--rate", type=int, default=2000, help="samples per delta")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.deltas = int(args.rounds * (args.duration + 3) / args.every) + 2

    import httpx

    from bench.serve import _seed_store
    from deploy.stack import Stack
    from feature_store.settings import load_settings
    from model.artifact.registry import Registry
    from stream.kafka_client import ensure_updates_topic, updates_producer
    from tests.support import free_port, http_ok, stop_process, wait_until

    results: dict[str, Any] = {"phases": []}
    with tempfile.TemporaryDirectory(prefix="bench-serve-deltas-") as tmp:
        work = Path(tmp)
        base = load_settings()
        settings = base.model_copy(update={
            "stack": base.stack.model_copy(update={"run_dir": work / "run"}),
            "kafka": base.kafka.model_copy(update={
                "port": free_port(), "controller_port": free_port(),
                "updates_topic": "bench.updates"}),
            "redis": base.redis.model_copy(update={"port": free_port(), "key_prefix": "bench:"}),
            "trainer": base.trainer.model_copy(update={
                "registry_dir": work / "models", "model_name": "bench", "keep_versions": 3}),
        })
        stack = Stack(settings)
        stack.up(["kafka", "redis"])
        procs: list[subprocess.Popen[bytes]] = []
        try:
            ensure_updates_topic(settings.kafka)
            _seed_store(settings, args.items)
            registry = Registry(work / "models", "bench", keep=3)
            records, rows, apply_ms = _lineage(args, registry)
            k, r, t = settings.kafka, settings.redis, settings.trainer
            sport = free_port()
            env = dict(os.environ, STREAMREC_REDIS__PORT=str(r.port),
                       STREAMREC_REDIS__KEY_PREFIX=r.key_prefix,
                       STREAMREC_KAFKA__PORT=str(k.port),
                       STREAMREC_KAFKA__UPDATES_TOPIC=k.updates_topic,
                       STREAMREC_TRAINER__REGISTRY_DIR=str(t.registry_dir),
                       STREAMREC_TRAINER__MODEL_NAME="bench",
                       STREAMREC_TRAINER__DELTA_EVERY_S=str(args.every),
                       OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
            log = (work / "serve.log").open("wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "deploy.cli", "serve", "--port", str(sport),
                 "--workers", str(args.workers)], cwd=REPO, env=env, stdout=log,
                stderr=subprocess.STDOUT))
            url = f"http://127.0.0.1:{sport}"
            wait_until(lambda: http_ok(url + "/health"), 120, "serve /health")
            wait_until(lambda: all(s.get("base_version") for s in _model_status(httpx, url).values()),
                       120, "every worker on the snapshot")
            producer = updates_producer(k)
            pending = list(records)
            for phase in [x for _ in range(args.rounds) for x in (False, True)]:
                stop = threading.Event()
                sent = [0]

                def send(stop: threading.Event = stop, sent: list[int] = sent) -> None:
                    while pending and not stop.is_set():
                        producer.send(k.updates_topic, key=b"bench", value=pending.pop(0))
                        producer.flush()
                        sent[0] += 1
                        stop.wait(args.every)

                sender = threading.Thread(target=send, daemon=True)
                if phase:
                    sender.start()
                out = subprocess.run(
                    [sys.executable, str(SERVE), "loadgen", "--url", url, "--concurrency",
                     str(args.concurrency), "--duration", str(args.duration)],
                    check=True, capture_output=True, text=True)
                stop.set()
                if phase:
                    sender.join()
                row = json.loads(out.stdout)
                status = _model_status(httpx, url)
                row.update(deltas=phase, deltas_sent=sent[0], workers=args.workers,
                           worker_applied={pid: s.get("applied") for pid, s in status.items()},
                           worker_last_apply_ms={pid: s.get("last_apply_ms")
                                                 for pid, s in status.items()},
                           worker_resyncs={pid: s.get("resyncs") for pid, s in status.items()},
                           loadavg_1m=round(os.getloadavg()[0], 2))
                print(f"deltas={phase!s:5} c={args.concurrency} p50={row['p50_ms']}ms "
                      f"p99={row['p99_ms']}ms rps={row['rps']} errors={row['errors']} "
                      f"sent={sent[0]} applied={row['worker_applied']} "
                      f"load={row['loadavg_1m']}", flush=True)
                results["phases"].append(row)
            producer.close()
        finally:
            for proc in procs:
                stop_process(proc, 10)
            stack.down(["kafka", "redis"])
    results.update(apply_ms_in_process=_pct(apply_ms), rows_per_delta=_pct([float(x) for x in rows]),
                   load_avg=list(os.getloadavg()))
    print(f"apply + compose in process: {results['apply_ms_in_process']} ms; rows per delta "
          f"{results['rows_per_delta']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
