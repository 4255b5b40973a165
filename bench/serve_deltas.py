"""Serving latency while deltas apply: p50/p99 of GET /recommend at c=16 with and without a
delta stream, alternating, over a ~120k-item catalog and 2 workers (target: p99 <= 20 ms, zero
errors, while a delta applies every second).

    python -m bench.serve_deltas [--concurrency 16] [--workers 2] [--duration 10]
                                 [--rounds 2] [--every 1] [--fill 100000]
                                 [--attr-tokens N | --whole-catalogue]
                                 [--baseline REV] [--json FILE]

Deltas are built ahead by a warmed trainer and sent over a throwaway Kafka while the load
generator runs phases without and with them; ``--baseline REV`` measures another revision's
serving code side by side in the same run. The cost of attribute slots: ``--attr-tokens 16``
(every stream item catalogued) against ``--whole-catalogue`` (ids only, every stream item
given a row), so both serve the same items. Reported per phase: latency, rps, the workers' CPU
per request, the apply cost, the load and the host record. Details: docs/internals.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.host import host
from bench.workers import composer_pids, connections, cpu_seconds, memory_mb, worker_pids

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
SERVE = HERE.parent / "serve.py"


def _pct(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, np.float64)
    return {"p50": round(float(np.percentile(arr, 50)), 2),
            "p95": round(float(np.percentile(arr, 95)), 2), "n": int(arr.size)}


def _lineage(args: argparse.Namespace, registry: Any) -> tuple[bytes, list[bytes], list[int]]:
    """Publish a version with its snapshot; return the snapshot record, the records of the
    deltas after it and their rows."""
    from bench.deltas import fill_tables, hold_items, synthetic_trainer
    from model.delta import SNAPSHOT_FILE, encode
    from model.trainer.deltas import DeltaBuilder
    from model.trainer.export import publish_version

    trainer, item_ids, train, stream = synthetic_trainer(args.users, args.items, 512,
                                                         args.attr_tokens)
    builder = DeltaBuilder(trainer, lambda: item_ids, attr_every=args.attr_every)
    train(args.warm_samples)
    if args.whole_catalogue and not args.attr_tokens:
        hold_items(trainer, item_ids, [stream.item_id(j) for j in range(args.items)])
    fill_tables(trainer, item_ids, args.fill)
    now = datetime.now(UTC)
    version = now.strftime("%Y%m%dT%H%M%SZ") + "-000001"
    meta = {"created_at": now.isoformat(), "trained_through_ms": int(now.timestamp() * 1000)}
    snap = builder.snapshot(version, meta)
    snapshot = encode(snap, "float32", compress=True)
    publish_version(registry, trainer, item_ids, version,
                    {"trained_through_ms": meta["trained_through_ms"]}, created_at=now,
                    extra_files={SNAPSHOT_FILE: snapshot})
    records, rows = [], []
    for _ in range(args.deltas):
        train(args.rate)
        delta = builder.delta({**meta, "created_at": datetime.now(UTC).isoformat()})
        records.append(encode(delta, args.codec, compress=args.compress))
        rows.append(delta.rows_changed)
    print(f"version {version}: catalog {snap.new_item_keys.size} items, "
          f"{len(records)} deltas built ({args.codec}, "
          f"{int(np.median([len(r) for r in records]))} bytes each)", flush=True)
    return snapshot, records, rows


#: Run in a tree (this one or ``--baseline``'s) on the lineage's records: what one serving
#: worker's follower spends per delta (decode + apply + compose), as that tree does it.
_APPLY_COST = """
import json, pickle, sys, time
from model.delta import apply, compose, decode, from_snapshot
try:
    from model.delta import Composer
except ImportError:
    Composer = None
snapshot, records = pickle.load(open(sys.argv[1], "rb"))
state = from_snapshot(decode(snapshot))
composer = Composer() if Composer else None
served = composer.compose(state) if composer else compose(state)
wall, cpu = [], []
for record in records:
    t0, c0 = time.perf_counter(), time.thread_time()
    delta = decode(record)
    state = apply(state, delta)
    served = composer.compose(state, delta) if composer else compose(state, served)
    wall.append((time.perf_counter() - t0) * 1000.0)
    cpu.append((time.thread_time() - c0) * 1000.0)
print(json.dumps({"wall": wall, "cpu": cpu}))
"""


def _apply_cost(tree: Path, lineage_file: Path) -> dict[str, dict[str, float]]:
    """Wall and CPU ms per delta (CPU time moves far less with the machine's load)."""
    out = subprocess.run([sys.executable, "-c", _APPLY_COST, str(lineage_file)], cwd=tree,
                         env=dict(os.environ, PYTHONPATH=str(tree), OPENBLAS_NUM_THREADS="1"),
                         check=True, capture_output=True, text=True)
    return {name: _pct(values) for name, values in json.loads(out.stdout).items()}


def _baseline_tree(rev: str, work: Path) -> Path:
    """The serving code of git revision ``rev`` (exported, not checked out)."""
    tree = work / "baseline"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def _model_status(httpx: Any, url: str, tries: int = 12) -> dict[int, dict[str, Any]]:
    """``/model``'s delta status per worker pid (whichever workers answer ``tries`` asks)."""
    out: dict[int, dict[str, Any]] = {}
    for _ in range(tries):
        info = httpx.get(url + "/model", timeout=5.0).json()
        out[int(info["worker_pid"])] = info.get("delta") or {}
    return out


def _percentiles(values: list[float]) -> dict[str, float]:
    return _pct(values) if values else {}


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
    p.add_argument("--attr-tokens", type=int, default=0,
                   help="attribute slots: every item catalogued with this many attribute keys "
                        "(bench.catalogue fills 11; default 0, ids only)")
    p.add_argument("--attr-every", type=int, default=None,
                   help="with --attr-tokens: the attribute rows travel with every N-th delta "
                        "(default: trainer.delta_attr_every)")
    p.add_argument("--whole-catalogue", action="store_true",
                   help="ids only: give every one of the stream's --items a row, so the catalog "
                        "is the one an --attr-tokens run serves (all --items + --fill), not "
                        "only the items trained on: the ids-only side of a comparison")
    p.add_argument("--rate", type=int, default=2000, help="samples per delta")
    p.add_argument("--codec", choices=("float32", "float16", "bfloat16", "int8"),
                   help="row codec of the deltas sent (default: trainer.delta_codec, what "
                   "the trainer publishes; trainer.delta_compress is followed too)")
    p.add_argument("--baseline", metavar="REV",
                   help="also serve with git revision REV's code, alternating with this tree's "
                   "each round (before/after in one run)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.attr_every is None:
        from streamrec.settings import load_settings

        args.attr_every = load_settings().trainer.delta_attr_every
    trees = 2 if args.baseline else 1
    args.deltas = int(trees * args.rounds * (args.duration + 3) / args.every) + 2

    import httpx

    from bench.harness import free_port, http_ok, stop_process, wait_until
    from bench.serve import _seed_store
    from deploy.stack import Stack
    from model.artifact.registry import Registry
    from stream.kafka_client import ensure_updates_topic, updates_producer
    from streamrec.settings import load_settings

    results: dict[str, Any] = {"phases": [], "baseline": args.baseline, "host": host()}
    print(f"host: {results['host']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-serve-deltas-") as tmp:
        work = Path(tmp)
        servers = [("this", REPO)]
        if args.baseline:
            servers.insert(0, (f"baseline {args.baseline}", _baseline_tree(args.baseline, work)))
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
        args.codec = args.codec or settings.trainer.delta_codec
        args.compress = settings.trainer.delta_compress
        stack = Stack(settings)
        stack.up(["kafka", "redis"])
        proc: subprocess.Popen[bytes] | None = None
        try:
            ensure_updates_topic(settings.kafka)
            _seed_store(settings, args.items)
            registry = Registry(work / "models", "bench", keep=3)
            snapshot, records, rows = _lineage(args, registry)
            lineage_file = work / "lineage.pkl"
            lineage_file.write_bytes(pickle.dumps((snapshot, records)))
            results["apply_ms_in_process"] = {
                name: _apply_cost(tree, lineage_file) for name, tree in servers}
            k, r, t = settings.kafka, settings.redis, settings.trainer
            sport = free_port()
            url = f"http://127.0.0.1:{sport}"
            producer = updates_producer(k)
            pending = list(records)
            sent_total = [0]
            for _ in range(args.rounds):
                for name, tree in servers:
                    env = dict(os.environ, PYTHONPATH=str(tree),
                               STREAMREC_REDIS__PORT=str(r.port),
                               STREAMREC_REDIS__KEY_PREFIX=r.key_prefix,
                               STREAMREC_KAFKA__PORT=str(k.port),
                               STREAMREC_KAFKA__UPDATES_TOPIC=k.updates_topic,
                               STREAMREC_TRAINER__REGISTRY_DIR=str(t.registry_dir),
                               STREAMREC_TRAINER__MODEL_NAME="bench",
                               STREAMREC_TRAINER__DELTA_EVERY_S=str(args.every),
                               OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
                    log = (work / "serve.log").open("ab")
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "deploy.cli", "serve", "--port", str(sport),
                         "--workers", str(args.workers)], cwd=tree, env=env, stdout=log,
                        stderr=subprocess.STDOUT)
                    wait_until(lambda: http_ok(url + "/health"), 120, "serve /health")

                    def caught_up() -> bool:
                        status = _model_status(httpx, url)
                        return len(status) == args.workers and all(
                            s.get("seq") == sent_total[0] for s in status.values())

                    # every worker on the snapshot and the deltas sent so far (replayed)
                    wait_until(caught_up, 180, "every worker caught up with the stream")
                    for phase in (False, True):
                        results["phases"].append(_phase(
                            args, name, phase, url, proc.pid, producer, k.updates_topic, pending,
                            sent_total, httpx))
                    stop_process(proc, 10)
                    proc = None
            producer.close()
        finally:
            if proc is not None:
                stop_process(proc, 10)
            stack.down(["kafka", "redis"])
    results.update(codec=args.codec, compress=args.compress,
                   rows_per_delta=_pct([float(x) for x in rows]), load_avg=list(os.getloadavg()))
    summary: dict[str, Any] = {}
    for name, _ in servers:
        for phase in (False, True):
            mine = [x for x in results["phases"] if x["code"] == name and x["deltas"] is phase]
            summary[f"{name} deltas={phase}"] = {
                "p99_ms_median": float(np.median([x["p99_ms"] for x in mine])),
                "p50_ms_median": float(np.median([x["p50_ms"] for x in mine])),
                "rps_median": float(np.median([x["rps"] for x in mine])),
                "cpu_ms_per_request_median": float(np.median(
                    [x["cpu_ms_per_request"] for x in mine])),
                "errors": sum(x["errors"] for x in mine),
                "worker_apply_ms": _percentiles([v for x in mine if phase for v in
                                                 x["worker_last_apply_ms"].values() if v]),
                "worker_apply_cpu_ms": _percentiles([v for x in mine if phase for v in
                                                     x["worker_last_apply_cpu_ms"].values() if v]),
                "worker_map_ms": _percentiles([v for x in mine if phase for v in
                                               x.get("worker_last_map_ms", {}).values() if v]),
                "composer_cpu_s_median": float(np.median([x.get("composer_cpu_s", 0.0)
                                                          for x in mine])),
                "memory_pss_mb_max": max(x["memory_mb"]["pss_total"] for x in mine),
                "loadavg_1m": [x["loadavg_1m"] for x in mine],
            }
    results["summary"] = summary
    results["attr_tokens"], results["attr_every"] = args.attr_tokens, args.attr_every
    print(f"rows per delta {results['rows_per_delta']}")
    for name, cost in results["apply_ms_in_process"].items():
        print(f"apply (decode + apply + compose) in process, {name}: {cost} ms")
    for name, row in summary.items():
        print(f"{name:<28} p50 {row['p50_ms_median']:7.1f}  p99 {row['p99_ms_median']:7.1f} ms "
              f"rps {row['rps_median']:7.1f}  cpu/request {row['cpu_ms_per_request_median']:.3f} ms "
              f"(medians of rounds)  errors {row['errors']}  worker apply {row['worker_apply_ms']}"
              f" cpu {row['worker_apply_cpu_ms']}  worker map {row['worker_map_ms']}"
              f"  composer cpu {row['composer_cpu_s_median']:.2f} s"
              f"  memory {row['memory_pss_mb_max']:.0f} MB PSS  load {row['loadavg_1m']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _phase(args: argparse.Namespace, name: str, deltas: bool, url: str, server_pid: int,
           producer: Any, topic: str, pending: list[bytes], sent_total: list[int],
           httpx: Any) -> dict[str, Any]:
    """One measured phase: the load generator for ``--duration`` s, a delta sent every
    ``--every`` s meanwhile when ``deltas``."""
    stop = threading.Event()
    sent = [0]

    def send() -> None:
        while pending and not stop.is_set():
            producer.send(topic, key=b"bench", value=pending.pop(0))
            producer.flush()
            sent[0] += 1
            sent_total[0] += 1
            stop.wait(args.every)

    sender = threading.Thread(target=send, daemon=True)
    if deltas:
        sender.start()
    pids, helpers = worker_pids(server_pid), composer_pids(server_pid)
    cpu0, helper0 = cpu_seconds(pids), cpu_seconds(helpers)
    loadgen = subprocess.Popen(
        [sys.executable, str(SERVE), "loadgen", "--url", url, "--concurrency",
         str(args.concurrency), "--duration", str(args.duration)],
        stdout=subprocess.PIPE, text=True)
    # the keep-alive connections per worker, half way through the measured seconds
    stop.wait(1.0 + args.duration / 2)
    split = connections(int(url.rsplit(":", 1)[1]), server_pid)
    stdout, _ = loadgen.communicate()
    cpu = cpu_seconds(pids) - cpu0
    composer_cpu = cpu_seconds(helpers) - helper0
    stop.set()
    if deltas:
        sender.join()
    if loadgen.returncode:
        raise RuntimeError(f"loadgen failed ({loadgen.returncode})")
    row = json.loads(stdout)
    # every answer of the run (its warm-up second included) against the workers' CPU
    row.update(worker_cpu_s=round(cpu, 3),
               cpu_ms_per_request=round(1000.0 * cpu / max(row["answered"], 1), 4),
               composer_cpu_s=round(composer_cpu, 3),
               connections_per_worker=sorted(split.values(), reverse=True),
               memory_mb=memory_mb(server_pid))
    status = _model_status(httpx, url)
    row.update(code=name, deltas=deltas, deltas_sent=sent[0], workers=args.workers,
               worker_applied={pid: s.get("applied") for pid, s in status.items()},
               worker_last_apply_ms={pid: s.get("last_apply_ms") for pid, s in status.items()},
               worker_last_apply_cpu_ms={pid: s.get("last_apply_cpu_ms")
                                         for pid, s in status.items()},
               worker_resyncs={pid: s.get("resyncs") for pid, s in status.items()},
               worker_last_map_ms={pid: (s.get("composer") or {}).get("last_map_ms")
                                   for pid, s in status.items()},
               loadavg_1m=round(os.getloadavg()[0], 2))
    print(f"{name:<20} deltas={deltas!s:5} c={args.concurrency} p50={row['p50_ms']}ms "
          f"p99={row['p99_ms']}ms rps={row['rps']} errors={row['errors']} "
          f"cpu/request={row['cpu_ms_per_request']}ms composer cpu={composer_cpu:.2f}s "
          f"conns={row['connections_per_worker']} "
          f"sent={sent[0]} closed={row.get('closed_by_server')} "
          f"applied={row['worker_applied']} load={row['loadavg_1m']}", flush=True)
    return row


if __name__ == "__main__":
    raise SystemExit(main())
