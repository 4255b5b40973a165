"""Ingest throughput: single-event POSTs, 1,000-event batches, and replay of a ratings file.

The ingest API runs as its own process (``streamrec ingest-api``: uvicorn, one worker); the load
generator is a minimal asyncio HTTP/1.1 keep-alive client in this process (httpx costs
~3 ms of CPU per request here, more than the server). Replay runs as ``streamrec replay`` at
``--speed max``. Kafka must be up (``streamrec up``, or the test stack with
``STREAMREC_KAFKA__PORT=19092``); each run writes to a fresh topic ``bench-ingest-<time>``.

    streamrec bench ingest --json out.json
    python bench/ingest.py --batched-events 200000 --single-requests 4000 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import free_port, http_ok, stop_process, wait_until
from deploy.process import cpu_seconds

REPO = Path(__file__).resolve().parent.parent
DEFAULT_RATINGS = REPO.parent / "shared" / "data" / "ml-latest-small" / "ratings.csv"


def _events(n: int, start: int, base_ts: int) -> list[dict[str, Any]]:
    return [
        {
            "user_id": f"u{(start + i) % 5000}",
            "item_id": f"i{(start + i) * 7919 % 20000}",
            "event_type": "click",
            "ts": base_ts + start + i,
            "event_id": f"bench-{start + i}",
        }
        for i in range(n)
    ]


async def _post_all(
    url: str, bodies: list[bytes], concurrency: int
) -> tuple[float, int, dict[int, int]]:
    """POST every body over ``concurrency`` keep-alive connections (a minimal asyncio
    HTTP/1.1 client, so the generator costs far less CPU than the server it measures).

    Returns (seconds, events acknowledged, count per HTTP status).
    """
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.split(":")
    path = "/" + url.split("//", 1)[1].split("/", 1)[1]
    statuses: dict[int, int] = {}
    accepted = 0
    todo = list(reversed(bodies))

    async def worker() -> None:
        nonlocal accepted
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while todo:
                body = todo.pop()
                writer.write(
                    f"POST {path} HTTP/1.1\r\nHost: {host_port}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                status = int((await reader.readline()).split()[1])
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                payload = await reader.readexactly(length)
                statuses[status] = statuses.get(status, 0) + 1
                if status == 202:
                    accepted += json.loads(payload)["accepted"]
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, accepted, statuses


def _start_server(port: int, env: dict[str, str], workers: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deploy.cli",
            "ingest-api",
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],  # fmt: skip
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 60, "ingest-api /health",
                   0.2, process=proc)
    except AssertionError as exc:
        proc.kill()
        stderr = proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        raise RuntimeError(f"{exc}: {stderr}") from exc
    return proc


def _measure(
    url: str, bodies: list[bytes], concurrency: int, server_pid: int
) -> tuple[float, int, dict[int, int], float]:
    """Run one load phase; returns (seconds, events, statuses, server CPU µs per event)."""
    cpu0 = cpu_seconds(server_pid)
    secs, ok, statuses = asyncio.run(_post_all(url, bodies, concurrency))
    cpu = cpu_seconds(server_pid) - cpu0
    return secs, ok, statuses, (cpu / ok * 1e6 if ok else 0.0)


def _delete_topics(names: list[str]) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaError

    from streamrec.settings import load_settings

    admin = KafkaAdminClient(bootstrap_servers=load_settings().kafka.bootstrap)
    try:
        existing = set(admin.list_topics())
        admin.delete_topics([n for n in names if n in existing])
    except KafkaError as exc:
        print(f"could not delete the bench topics {names}: {exc}", file=sys.stderr)
    finally:
        admin.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrec bench ingest", description=__doc__)
    parser.add_argument("--batched-events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--batch-concurrency", type=int, default=4)
    parser.add_argument("--single-requests", type=int, default=4000)
    parser.add_argument("--single-concurrency", type=int, default=16)
    parser.add_argument("--ratings", type=Path, default=DEFAULT_RATINGS)
    parser.add_argument("--skip-replay", action="store_true")
    parser.add_argument("--workers", type=int, default=1, help="ingest-api worker processes")
    parser.add_argument("--json", type=Path, dest="json_path")
    parser.add_argument("--keep-topics", action="store_true", help="keep the bench topics")
    args = parser.parse_args(argv)

    topic = f"bench-ingest-{int(time.time())}"
    port = free_port()
    env = dict(os.environ, STREAMREC_KAFKA__EVENTS_TOPIC=topic)
    base_ts = 1_700_000_000_000
    result: dict[str, Any] = {
        "topic": topic,
        "server": f"streamrec ingest-api (uvicorn, {args.workers} worker(s))",
        "load_generator": "raw asyncio HTTP/1.1 keep-alive client (bench/ingest.py _post_all)",
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg()[0],
    }
    proc = _start_server(port, env, args.workers)
    url = f"http://127.0.0.1:{port}/events"
    try:
        # warm-up: metadata, connections, code paths
        asyncio.run(_post_all(url, [json.dumps(_events(100, 10**9, base_ts)).encode()], 1))

        n_batches = max(1, args.batched_events // args.batch)
        bodies = [
            json.dumps(_events(args.batch, b * args.batch, base_ts)).encode()
            for b in range(n_batches)
        ]
        secs, ok, statuses, cpu_us = _measure(url, bodies, args.batch_concurrency, proc.pid)
        result["batched_events_per_s"] = round(ok / secs, 1)
        result["batched"] = {
            "events": ok,
            "batch": args.batch,
            "concurrency": args.batch_concurrency,
            "seconds": round(secs, 3),
            "statuses": statuses,
            "server_cpu_us_per_event": round(cpu_us, 1),
        }
        print(
            f"batched: {ok} events in {secs:.2f} s = {ok / secs:,.0f} events/s {statuses}, "
            f"server CPU {cpu_us:.1f} us/event"
        )

        offset = n_batches * args.batch
        singles = [json.dumps(e).encode() for e in _events(args.single_requests, offset, base_ts)]
        secs, ok, statuses, cpu_us = _measure(url, singles, args.single_concurrency, proc.pid)
        result["single_events_per_s"] = round(ok / secs, 1)
        result["single"] = {
            "events": ok,
            "concurrency": args.single_concurrency,
            "seconds": round(secs, 3),
            "statuses": statuses,
            "server_cpu_us_per_event": round(cpu_us, 1),
        }
        print(
            f"single: {ok} events in {secs:.2f} s = {ok / secs:,.0f} events/s {statuses}, "
            f"server CPU {cpu_us:.1f} us/event"
        )
    finally:
        stop_process(proc, 15)

    if not args.skip_replay:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "replay.json"
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "deploy.cli", "replay", str(args.ratings),
                 "--speed", "max", "--no-progress", "--json", str(out),
                 "--topic", f"{topic}-replay", "--state", str(Path(tmp) / "state.json")],
                cwd=REPO, env=env, check=True,
            )  # fmt: skip
            wall = time.perf_counter() - started
            report = json.loads(out.read_text())
        result["replay_events_per_s"] = report["events_per_s"]
        result["replay"] = {
            "file": str(args.ratings),
            "events": report["sent"],
            "seconds": report["seconds"],
            "wall_seconds_with_process_start": round(wall, 3),
        }
        print(
            f"replay: {report['sent']} events in {report['seconds']:.2f} s "
            f"({wall:.2f} s with process start) = {report['events_per_s']:,.0f} events/s"
        )
    result["loadavg_after"] = os.getloadavg()[0]
    if not args.keep_topics:
        _delete_topics([topic, f"{topic}-replay"])
    if args.json_path:
        args.json_path.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
