"""Subcommand: simulate (registered into ``streamrec`` by deploy.cli)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    sim = sub.add_parser(
        "simulate",
        help="post simulated impressions and clicks to the ingest API (demo traffic)",
        description="Simulated users with latent, slowly drifting tastes see slates of items "
        "and click what they like. Events go to POST /events of the ingest API at --rate "
        "events/s; a 503 is retried with the same events.",
    )
    sim.add_argument("--rate", type=float, default=500.0, help="events per second (default 500)")
    sim.add_argument("--duration", type=float, help="seconds to run (default: until Ctrl-C)")
    sim.add_argument("--users", type=int, default=500, help="simulated users (default 500)")
    sim.add_argument("--items", type=int, default=2000, help="simulated items (default 2000)")
    sim.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    sim.add_argument("--batch", type=int, default=200, help="events per POST (default 200)")
    sim.add_argument("--url", help="ingest API base URL (default from STREAMREC_INGEST__*)")
    sim.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from feature_store.settings import load_settings
    from stream.simulate import ClickSimulator, SimConfig, run

    settings = load_settings()
    url = args.url or f"http://{settings.ingest.host}:{settings.ingest.port}"
    key = settings.ingest.api_key.get_secret_value() if settings.ingest.api_key else None
    sim = ClickSimulator(SimConfig(users=args.users, items=args.items, seed=args.seed))
    print(f"simulating {args.users} users x {args.items} items at {args.rate:.0f} events/s "
          f"-> {url}/events (Ctrl-C stops)")
    try:
        stats = run(sim, url, args.rate, duration_s=args.duration, batch=args.batch, api_key=key)
    except KeyboardInterrupt:
        print("stopped")
        return 0
    print(f"sent {stats.events} events ({stats.clicks} clicks), {stats.retries} retries, "
          f"{stats.failed} failed")
    return 1 if stats.failed else 0
