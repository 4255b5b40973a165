"""Subcommands: ingest-api, replay (registered into ``streamrec`` by deploy.cli).

Keep imports here light: heavy modules are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REPLAY_EPILOG = """\
formats (detected from the file name and first line, or set with --format):
  movielens  ratings.csv of MovieLens latest(-small): userId,movieId,rating,timestamp
  ml-1m      ratings.dat of ML-1M: UserID::MovieID::Rating::Timestamp
  ml-100k    u.data of ML-100k: user<TAB>item<TAB>rating<TAB>timestamp
  ndjson     one event per line in the ingest schema (ts required)
  csv        any CSV with a header and --map user_id=COL,item_id=COL,ts=COL
             [,value=COL][,event_type=COL][,event_id=COL]

rules:
  * events are sent in (event time, file order) order: files in the order given, then lines
  * ratings become "like" when >= --like-threshold (default 4), else "rating"; value = rating
  * event ids are a hash of (file name, line number, line bytes) unless the row has one, so
    replaying a file again gives the same ids; the replay ledger (<run_dir>/replay/ledger/
    <topic>/) holds every id delivered to the topic, and a row it holds is not sent again
    (counted as "already replayed"): a second or overlapping replay changes nothing
    downstream, and a replay that crashed continues where it stopped
  * timestamps: RFC 3339 with a zone, or epoch seconds (< 1e11) / milliseconds
  * malformed rows are counted and the first 10 shown with line numbers; --strict stops at one
  * --items FILE sends a catalogue instead (NDJSON items, or MovieLens movies.csv with ids
    "m" + movieId, genres and title; --tags tags.csv adds tags) to the items topic; --topic
    then names the items topic
  * --no-ledger sends every row; then --resume continues after the last acknowledged row of
    the same files/options/topic (state in --state, default <run_dir>/replay/<plan>.json)

examples:
  streamrec replay ../shared/data/ml-latest-small/ratings.csv --speed max
  streamrec replay u.data --speed 3600 --since 1997-10-01T00:00:00Z --limit 10000
  streamrec replay clicks.csv --map user_id=uid,item_id=sku,ts=time --event-type click
  streamrec replay --items ../shared/data/ml-latest-small/movies.csv --tags tags.csv
"""


def register(sub: Any) -> None:
    """Add these subcommands to the ``streamrec`` parser."""
    api = sub.add_parser(
        "ingest-api",
        help="run the event ingest HTTP API (POST /events -> Kafka)",
        description="Serve POST /events, GET /health, GET /metrics and /docs. Events are "
        "answered 202 only after Kafka acknowledged them (acks=all).",
    )
    api.add_argument("--host", help="bind address (default: STREAMREC_INGEST__HOST)")
    api.add_argument("--port", type=int, help="port (default: STREAMREC_INGEST__PORT)")
    api.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    api.add_argument(
        "--workers", type=int, default=1, help="worker processes, each with its own producer"
    )
    api.set_defaults(func=run_ingest_api)

    rp = sub.add_parser(
        "replay",
        help="replay historical logs into the events topic (backfill)",
        description="Read rating/event logs, validate every row, and send them to the events "
        "topic in event-time order, as fast as Kafka takes or at N x real time.",
        epilog=REPLAY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rp.add_argument("paths", nargs="*", type=Path, metavar="PATH", help="log files to replay")
    rp.add_argument("--items", type=Path, metavar="FILE",
                    help="instead of logs: a catalogue file (NDJSON items, or MovieLens "
                    "movies.csv) into the items topic")
    rp.add_argument("--tags", type=Path, metavar="FILE",
                    help="with --items movies.csv: MovieLens tags.csv, merged in as tags")
    rp.add_argument("--items-format", choices=("ndjson", "movielens"),
                    help="format of --items (default: detected from its name and header)")
    rp.add_argument(
        "--format",
        choices=("movielens", "ml-1m", "ml-100k", "ndjson", "csv"),
        help="format of every PATH (default: detect per file)",
    )
    rp.add_argument(
        "--speed",
        default="max",
        help="'max' (as fast as Kafka takes) or N: N x real time between event times",
    )
    rp.add_argument("--limit", type=int, help="send at most N events (the earliest N)")
    rp.add_argument("--since", help="first event time to send (inclusive; RFC 3339 or epoch)")
    rp.add_argument("--until", help="event time to stop before (exclusive; RFC 3339 or epoch)")
    rp.add_argument("--map", dest="mapping", help="column mapping of a generic CSV (see below)")
    rp.add_argument("--event-type", help="event type of mapped CSV rows without a type column")
    rp.add_argument("--like-threshold", type=float, default=4.0, help="rating >= this -> like")
    rp.add_argument("--strict", action="store_true", help="stop at the first malformed row")
    rp.add_argument("--resume", action="store_true",
                    help="with --no-ledger: continue after the last acked row")
    rp.add_argument("--no-ledger", action="store_true",
                    help="send rows an earlier replay delivered too (no replay ledger)")
    rp.add_argument("--state", type=Path, help="resume state file (default under the run dir)")
    rp.add_argument("--topic", help="target topic (default: STREAMREC_KAFKA__EVENTS_TOPIC)")
    rp.add_argument("--json", type=Path, dest="json_path", help="write the report as JSON here")
    rp.add_argument("--no-progress", action="store_true", help="no progress bar")
    rp.add_argument(
        "--checkpoint-every",
        type=int,
        default=10_000,
        help="save the resume state at least every N events (default 10000) and every second",
    )
    rp.set_defaults(func=run_replay_cmd)


def run_ingest_api(args: argparse.Namespace) -> int:
    import uvicorn

    from stream.ingest.api import create_app
    from streamrec.settings import load_settings

    settings = load_settings()
    where = {
        "host": args.host or settings.ingest.host,
        "port": args.port or settings.ingest.port,
        "log_level": args.log_level,
        "access_log": False,
    }
    if args.workers > 1:
        uvicorn.run("stream.ingest.api:app_from_env", factory=True, workers=args.workers, **where)
    else:
        uvicorn.run(create_app(settings), **where)
    return 0


def _speed(text: str) -> float | None:
    if text.strip().lower() == "max":
        return None
    speed = float(text)
    if not speed > 0:
        raise ValueError("--speed must be 'max' or a positive number")
    return speed


def run_item_replay_cmd(args: argparse.Namespace) -> int:
    """``streamrec replay --items FILE [--tags FILE]``: exit 1 on a bad row or a failed send."""
    from kafka.errors import KafkaError

    from stream.kafka_client import KafkaUnavailable
    from stream.replay.items import run_item_replay
    from stream.replay.runner import ReplayError
    from streamrec.settings import load_settings

    settings = load_settings()
    if args.topic:
        settings = settings.model_copy(
            update={"kafka": settings.kafka.model_copy(update={"items_topic": args.topic})}
        )
    try:
        report = run_item_replay(
            settings, args.items, args.items_format, tags=args.tags,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
    except (ReplayError, ValueError, OSError) as exc:  # CatalogueError is a ValueError
        print(f"replay: {exc}", file=sys.stderr)
        return 1
    except (KafkaError, KafkaUnavailable) as exc:
        print(f"replay: Kafka at {settings.kafka.bootstrap} failed: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    if args.json_path:
        args.json_path.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    return 0


def run_replay_cmd(args: argparse.Namespace) -> int:
    if args.items is not None:
        if args.paths:
            print("replay: give log PATHs or --items FILE, not both", file=sys.stderr)
            return 2
        return run_item_replay_cmd(args)
    if args.tags is not None or args.items_format is not None:
        print("replay: --tags and --items-format go with --items", file=sys.stderr)
        return 2
    if not args.paths:
        print("replay: give log files to replay (PATH ...) or --items FILE", file=sys.stderr)
        return 2
    from kafka.errors import KafkaError

    from stream.kafka_client import KafkaUnavailable
    from stream.replay.formats import ReplayFormatError, parse_mapping
    from stream.replay.runner import (
        ReplayError,
        ReplayOptions,
        ReplayRuntime,
        ReplaySource,
        parse_time_arg,
        run_replay,
    )
    from stream.schema import SchemaError
    from streamrec.settings import load_settings

    settings = load_settings()
    if args.topic:
        settings = settings.model_copy(
            update={"kafka": settings.kafka.model_copy(update={"events_topic": args.topic})}
        )
    runtime = ReplayRuntime()
    try:
        now_ms = runtime.wall_ms()
        options = ReplayOptions(
            speed=_speed(args.speed),
            limit=args.limit,
            since_ms=parse_time_arg(args.since, now_ms),
            until_ms=parse_time_arg(args.until, now_ms),
            strict=args.strict,
            like_threshold=args.like_threshold,
            mapping=parse_mapping(args.mapping),
            event_type=args.event_type,
            checkpoint_every=args.checkpoint_every,
        )
        sources = [ReplaySource.of(p, args.format) for p in args.paths]
        report = run_replay(
            settings,
            sources,
            options,
            resume=args.resume,
            state_path=args.state,
            runtime=runtime,
            ledger=not args.no_ledger,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
    except (ReplayError, ReplayFormatError, SchemaError, ValueError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 1
    except (KafkaError, KafkaUnavailable) as exc:
        print(f"replay: Kafka at {settings.kafka.bootstrap} failed: {exc}", file=sys.stderr)
        return 1
    for row in report.malformed:
        print(f"  malformed {row['file']}:{row['line']}: {row['reason']}", file=sys.stderr)
    if report.rejected_total > len(report.malformed):
        print(f"  ... and {report.rejected_total - len(report.malformed)} more", file=sys.stderr)
    print(report.summary())
    if args.json_path:
        args.json_path.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    return 0
