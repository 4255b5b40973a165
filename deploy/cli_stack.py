"""Subcommands: up, down, status, bench (registered into ``streamrec`` by deploy.cli)."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHES = ("ingest", "features", "train", "serve", "freshness", "guard", "cluster", "panel")


def register(sub: Any) -> None:
    up = sub.add_parser(
        "up",
        help="start Kafka, Redis, Flink and the project services as local processes",
        description="Start the local stack as supervised processes (pid files and logs under "
        "the run folder, default ./.streamrec). Safe to run twice: what already runs is left "
        "alone. Each component is waited on with a real readiness check under a deadline "
        "(STREAMREC_STACK__READY_TIMEOUT_S).",
    )
    up.add_argument("--only", help="comma-separated components, e.g. kafka,redis")
    up.add_argument("--infra", action="store_true",
                    help="only Kafka, Redis and the Flink cluster, not the project services")
    up.add_argument("--run-dir", help="run folder (STREAMREC_STACK__RUN_DIR)")
    up.set_defaults(func=_up)

    down = sub.add_parser("down", help="stop everything `up` started",
                          description="Stop, newest first, every process `up` started (by its "
                          "pid file): SIGTERM, then SIGKILL after STREAMREC_STACK__STOP_TIMEOUT_S.")
    down.add_argument("--only", help="comma-separated components")
    down.add_argument("--run-dir", help="run folder (STREAMREC_STACK__RUN_DIR)")
    down.set_defaults(func=_down)

    status = sub.add_parser("status", help="show each component with pid, port and health",
                            description="Show every component of the local stack: state, pid, "
                            "port, health (its real readiness check) and log file. Exits 1 if "
                            "a running component is unhealthy.")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--run-dir", help="run folder (STREAMREC_STACK__RUN_DIR)")
    status.set_defaults(func=_status)

    demo = sub.add_parser(
        "demo", help="live demo: simulated clicks into the running stack, status every 2 s",
        description="Post simulated impressions and clicks to the ingest API and print, every "
        "2 s: events/s, samples/s, trained examples/s, served model version and age, rolling "
        "Recall@10 and serving p99. Needs `streamrec up`. Ctrl-C stops the demo, not the stack.")
    demo.add_argument("--rate", type=float, default=300.0, help="events/s (default 300)")
    demo.add_argument("--duration", type=float, help="seconds (default: until Ctrl-C)")
    demo.add_argument("--users", type=int, default=500, help="simulated users (default 500)")
    demo.add_argument("--items", type=int, default=2000, help="simulated items (default 2000)")
    demo.set_defaults(func=_demo)

    topics = sub.add_parser("topics",
                            help="create the Kafka topics (events, events.dlq, samples, model.updates)",
                            description="Create the configured topics if they do not exist "
                            "(STREAMREC_KAFKA__PARTITIONS partitions each, model.updates one). "
                            "`up` does this too.")
    topics.set_defaults(func=_topics)

    bench = sub.add_parser("bench",
                           help="run a benchmark from a source checkout's bench/ (--json FILE)",
                           description="Run bench/NAME.py; remaining arguments go to it "
                           "(try `streamrec bench NAME --help`). The benchmarks are not part "
                           "of the installed package: they run from a source checkout of "
                           "streamrec, whose bench/ folder sits next to deploy/.")
    bench.add_argument("name", choices=BENCHES)
    bench.add_argument("args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)


def _stack(args: argparse.Namespace) -> Any:
    if getattr(args, "run_dir", None):
        os.environ["STREAMREC_STACK__RUN_DIR"] = str(Path(args.run_dir).resolve())
    from deploy.cli import build_parser
    from deploy.stack import Stack
    from streamrec.settings import load_settings

    commands = set(_subcommands(build_parser()))
    return Stack(load_settings(), available_commands=commands)


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:  # noqa: SLF001 - argparse has no public accessor
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return list(action.choices)
    return []


def _fail(exc: Exception) -> int:
    print(f"streamrec: {exc}", file=sys.stderr)
    return 1


def _up(args: argparse.Namespace) -> int:
    from deploy.process import StackError
    from deploy.stack import INFRA

    stack = _stack(args)
    only = args.only.split(",") if args.only else (list(INFRA) if args.infra else None)
    t0 = time.monotonic()
    try:
        started = stack.up(only)
    except StackError as exc:
        return _fail(exc)
    print(f"started {', '.join(started) or 'nothing (all running)'} in "
          f"{time.monotonic() - t0:.1f} s")
    rows = stack.status()
    _print_table(rows)
    _print_targets(stack.settings, rows, wait=True)
    s = stack.settings.serving
    if any(r.name == "serving" and r.healthy for r in rows):
        print(f"\ndashboard: http://{s.host}:{s.port}/dashboard")
    return 0


def _down(args: argparse.Namespace) -> int:
    from deploy.process import StackError

    stack = _stack(args)
    try:
        stopped = stack.down(args.only.split(",") if args.only else None)
    except StackError as exc:
        return _fail(exc)
    print(f"stopped {', '.join(stopped) or 'nothing (none running)'}")
    return 0


def _status(args: argparse.Namespace) -> int:
    stack = _stack(args)
    rows = stack.status()
    if args.json:
        print(json.dumps(stack.status_dicts(rows), indent=2))
    else:
        _print_table(rows)
        _print_targets(stack.settings, rows, wait=False)
    return 0 if all(r.healthy or r.state == "stopped" for r in rows) else 1


def _print_targets(settings: Any, rows: Any, wait: bool) -> None:
    """One line on Prometheus' scrape targets (after `up`: once each was scraped once)."""
    from deploy.components import prometheus_targets

    if not any(r.name == "prometheus" and r.healthy for r in rows):
        return
    deadline = time.monotonic() + (settings.prometheus.scrape_interval_s + 5 if wait else 0)
    while True:
        try:
            targets = prometheus_targets(settings)
        except (OSError, ValueError, KeyError) as exc:
            print(f"prometheus: targets unreadable ({exc})")
            return
        if time.monotonic() >= deadline or (
                targets and all(t["health"] != "unknown" for t in targets)):
            break
        time.sleep(0.5)
    down = [t for t in targets if t["health"] != "up"]
    p = settings.prometheus
    print(f"\nprometheus: http://{settings.stack.bind_host}:{p.port} — "
          f"{len(targets) - len(down)}/{len(targets)} targets up")
    for t in down:
        print(f"  {t['job']:<10} {t['instance']:<22} {t['health']}: {t['error'] or '-'}")

def _print_table(rows: Any) -> None:
    print(f"{'COMPONENT':<18} {'STATE':<10} {'PID':>7} {'PORT':>6}  LOG")
    for r in rows:
        print(f"{r.name:<18} {r.state:<10} {r.pid or '-':>7} {r.port or '-':>6}  {r.log}")


def _demo(args: argparse.Namespace) -> int:
    from deploy.demo import run_demo
    from streamrec.settings import load_settings

    return run_demo(load_settings(), args.rate, args.duration, args.users, args.items)


def _topics(args: argparse.Namespace) -> int:
    from stream.kafka_client import KafkaUnavailable, ensure_topics, ensure_updates_topic
    from streamrec.settings import load_settings

    k = load_settings().kafka
    try:
        created = ensure_topics(
            k, [k.events_topic, k.dlq_topic, k.samples_topic, k.items_topic], k.partitions
        )
        created += ensure_updates_topic(k)
    except KafkaUnavailable as exc:
        return _fail(exc)
    print(f"created {', '.join(created) or 'nothing (all exist)'}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    bench_dir = REPO_ROOT / "bench"
    if not bench_dir.is_dir():
        # An installed package ships no bench/ (pyproject packages only our five packages).
        print(f"streamrec: benchmarks need a source checkout of streamrec: {bench_dir} does "
              "not exist in this installation. Clone the repository and run `streamrec bench "
              f"{args.name}` (or `python -m deploy.cli bench {args.name}`) from it.",
              file=sys.stderr)
        return 2
    path = bench_dir / f"{args.name}.py"
    if not path.exists():
        print(f"streamrec: benchmark {path} is missing from this checkout", file=sys.stderr)
        return 2
    if str(REPO_ROOT) not in sys.path:  # a benchmark imports its siblings as bench.*
        sys.path.insert(0, str(REPO_ROOT))
    namespace = runpy.run_path(str(path), run_name="streamrec_bench")
    return int(namespace["main"](args.args) or 0)
