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
        "replay` read, deterministic given --seed. Rating mode with --categories N: items "
        "belong to N categories (items of a category lie close in taste space) and carry "
        "tags that follow the category; with --new-item-share S a share S of the items "
        "arrives along the stream (never shown or clicked before). Live, the catalogue goes "
        "to POST /items (each new item before its first click); into a file with "
        "--items-file. Without these options the events are exactly those of earlier "
        "versions.",
    )
    sim.add_argument("--mode", choices=MODES, default="rating", help="default: rating")
    sim.add_argument("--rate", type=float, default=500.0, help="events per second (default 500)")
    sim.add_argument("--duration", type=float, help="seconds to run (default: until Ctrl-C)")
    sim.add_argument("--users", type=int, default=500, help="rating mode: users (default 500)")
    sim.add_argument("--items", type=int, default=2000, help="simulated items (default 2000)")
    sim.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    sim.add_argument("--batch", type=int, default=200, help="events per POST (default 200)")
    sim.add_argument("--url", help="ingest API base URL (default from STREAMREC_INGEST__*)")
    c = sim.add_argument_group("item catalogue (rating mode)")
    c.add_argument(
        "--categories", type=int, default=0, metavar="N",
        help="item categories, e.g. 20; items get a category and tags (default 0: none)",
    )
    c.add_argument(
        "--tags", type=int, default=50, metavar="N",
        help="with --categories: tag vocabulary; each item has 1 to 4 tags (default 50)",
    )
    c.add_argument(
        "--new-item-share", type=float, default=0.0, metavar="S",
        help="share of the items introduced along the stream, e.g. 0.3 (default 0: all "
        "available from the start). Live: over --arrival-visits visits; into a file: over "
        "about the whole log",
    )
    c.add_argument(
        "--arrival-visits", type=int, default=None, metavar="V",
        help="the new items arrive at evenly spaced visits over the first V visits (a visit "
        "is one user's impressions and clicks; default: 20000 live, the log's length in a file)",
    )
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
    f.add_argument(
        "--items-file", type=Path, metavar="ITEMS",
        help="rating mode, with --to-file: write the catalogue as NDJSON item records "
        "(category, tags; ts = the item's introduction, left out for items of the start) for "
        "`streamrec evaluate F --format ndjson --items ITEMS` and `streamrec replay --items`",
    )
    sim.set_defaults(func=_simulate)


def _config(args: argparse.Namespace, arrival_visits: int | None = None) -> Any:
    from stream.simulate import SimConfig

    extra = {} if arrival_visits is None else {"arrival_visits": arrival_visits}
    return SimConfig(users=args.users, items=args.items, seed=args.seed,
                     categories=args.categories, tags=args.tags,
                     new_item_share=args.new_item_share, **extra)


def _catalogue_problem(args: argparse.Namespace) -> str | None:
    """Why the catalogue options cannot be used as given, or None."""
    asked = args.categories or args.new_item_share or args.arrival_visits is not None
    if args.mode == "session" and (asked or args.items_file is not None):
        return "--categories, --new-item-share, --arrival-visits and --items-file are rating mode only"
    if args.items_file is not None and args.to_file is None:
        return "--items-file needs --to-file"
    try:
        _config(args, args.arrival_visits)
    except ValueError as exc:
        return str(exc)
    return None


def _simulate(args: argparse.Namespace) -> int:
    problem = _catalogue_problem(args)
    if problem:
        print(f"simulate: {problem}")
        return 2
    if args.to_file is not None:
        return _to_file(args)
    if args.events is not None:
        print("simulate: --events needs --to-file")
        return 2
    from stream.simulate import ClickSimulator, SessionConfig, SessionSimulator, run
    from streamrec.settings import load_settings

    settings = load_settings()
    url = args.url or f"http://{settings.ingest.host}:{settings.ingest.port}"
    key = settings.ingest.api_key.get_secret_value() if settings.ingest.api_key else None
    if args.mode == "session":
        sim: Any = SessionSimulator(SessionConfig(items=args.items, seed=args.seed))
        what = f"sessions over {args.items} items"
    else:
        sim = ClickSimulator(_config(args, args.arrival_visits))
        what = f"{args.users} users x {args.items} items"
        if sim.config.has_catalogue:
            what += f" (catalogue -> {url}/items)"
    print(f"simulating {what} at {args.rate:.0f} events/s -> {url}/events (Ctrl-C stops)")
    try:
        stats = run(sim, url, args.rate, duration_s=args.duration, batch=args.batch, api_key=key)
    except KeyboardInterrupt:
        print("stopped")
        return 0
    print(f"sent {stats.events} events ({stats.clicks} clicks), {stats.items} items, "
          f"{stats.retries} retries, {stats.failed} failed")
    return 1 if stats.failed else 0


def _to_file(args: argparse.Namespace) -> int:
    from stream.simulate import (
        LOG_START_MS,
        ClickSimulator,
        catalogue_input,
        log_visits,
        rating_log,
        simulated_log,
        write_ndjson,
    )

    if args.events is None or args.events < 1:
        print("simulate: --to-file needs --events N (N >= 1)")
        return 2
    start_ms = LOG_START_MS if args.start_ms is None else args.start_ms
    if args.mode == "session":
        log = simulated_log("session", args.events, seed=args.seed, items=args.items,
                            start_ms=start_ms)
        n = write_ndjson(args.to_file, log)
        print(f"wrote {n} session-mode events to {args.to_file}")
        return 0
    visits = args.arrival_visits or log_visits(_config(args), args.events, args.impressions)
    sim = ClickSimulator(_config(args, visits))
    n = write_ndjson(args.to_file, rating_log(sim, args.events, start_ms=start_ms,
                                              impressions=args.impressions))
    print(f"wrote {n} rating-mode events to {args.to_file}")
    if args.items_file is not None:
        catalogue = sim.catalogue()
        write_ndjson(args.items_file, (catalogue_input(item) for item in catalogue))
        new = sum(1 for item in catalogue if item["ts"])
        print(f"wrote {len(catalogue)} items ({new} introduced along the log) to {args.items_file}")
    return 0
