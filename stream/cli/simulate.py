"""Subcommand: simulate (registered into ``streamrec`` by deploy.cli)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

MODES = ("rating", "session")  # stream.simulate.MODES (not imported: the help stays light)


def register(sub: Any) -> None:
    sim = sub.add_parser(
        "simulate",
        help="post simulated events to the ingest API, or write a simulated log (NDJSON)",
        description="rating mode (default): simulated users with latent, slowly drifting "
        "tastes see slates of items and click what they like. session mode: anonymous "
        "short sessions (a new user id each, 2 to 20 clicks) with re-clicks and strong "
        "item-to-item transitions. Events go to POST /events of the ingest API at --rate "
        "events/s (a 503 is retried with the same events), or with --to-file F --events N "
        "into an NDJSON log that `streamrec evaluate F --format ndjson` and `streamrec "
        "replay` read, deterministic given --seed.",
    )
    sim.add_argument("--mode", choices=MODES, default="rating", help="default: rating")
    sim.add_argument("--rate", type=float, default=500.0, help="events per second (default 500)")
    sim.add_argument("--duration", type=float, help="seconds to run (default: until Ctrl-C)")
    sim.add_argument("--users", type=int, default=500, help="rating mode: users (default 500)")
    sim.add_argument("--items", type=int, default=2000, help="simulated items (default 2000)")
    sim.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    sim.add_argument("--batch", type=int, default=200, help="events per POST (default 200)")
    sim.add_argument("--url", help="ingest API base URL (default from STREAMREC_INGEST__*)")
    f = sim.add_argument_group("simulated log")
    f.add_argument("--to-file", type=Path, metavar="F", help="write NDJSON events to F")
    f.add_argument("--events", type=int, help="with --to-file: number of events")
    f.add_argument(
        "--start-ms", type=int, default=None, help="first event time, epoch ms (default 2024-01-01)"
    )
    f.add_argument(
        "--impressions",
        action="store_true",
        help="rating mode: write the impressions too (each click's item is then shown before)",
    )
    sim.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    if args.to_file is not None:
        return _to_file(args)
    if args.events is not None:
        print("simulate: --events needs --to-file")
        return 2
    from stream.simulate import ClickSimulator, SessionConfig, SessionSimulator, SimConfig, run
    from streamrec.settings import load_settings

    settings = load_settings()
    url = args.url or f"http://{settings.ingest.host}:{settings.ingest.port}"
    key = settings.ingest.api_key.get_secret_value() if settings.ingest.api_key else None
    if args.mode == "session":
        sim: Any = SessionSimulator(SessionConfig(items=args.items, seed=args.seed))
        what = f"sessions over {args.items} items"
    else:
        sim = ClickSimulator(SimConfig(users=args.users, items=args.items, seed=args.seed))
        what = f"{args.users} users x {args.items} items"
    print(f"simulating {what} at {args.rate:.0f} events/s -> {url}/events (Ctrl-C stops)")
    try:
        stats = run(sim, url, args.rate, duration_s=args.duration, batch=args.batch, api_key=key)
    except KeyboardInterrupt:
        print("stopped")
        return 0
    print(f"sent {stats.events} events ({stats.clicks} clicks), {stats.retries} retries, "
          f"{stats.failed} failed")
    return 1 if stats.failed else 0


def _to_file(args: argparse.Namespace) -> int:
    from stream.simulate import LOG_START_MS, simulated_log, write_ndjson

    if args.events is None or args.events < 1:
        print("simulate: --to-file needs --events N (N >= 1)")
        return 2
    log = simulated_log(
        args.mode,
        args.events,
        seed=args.seed,
        users=args.users,
        items=args.items,
        start_ms=LOG_START_MS if args.start_ms is None else args.start_ms,
        impressions=args.impressions,
    )
    n = write_ndjson(args.to_file, log)
    print(f"wrote {n} {args.mode}-mode events to {args.to_file}")
    return 0
