"""The ``streamrec`` command: one CLI in front of every part of the pipeline.

Each package contributes its subcommands through a small ``cli`` module with
``register(subparsers)``; those modules import nothing heavy at import time, so
``streamrec --help`` and the stack commands never load TensorFlow or PyFlink.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from deploy import cli_backfill, cli_stack
from model.cli import evaluate as cli_eval
from model.cli import models as cli_registry
from model.cli import train as cli_train
from serving import cli as serving_cli
from stream.cli import features as cli_features
from stream.cli import ingest as cli_ingest
from stream.cli import monitor as cli_monitor
from stream.cli import simulate as cli_sim

EPILOG = """\
Configuration comes from STREAMREC_* environment variables (see docs/operations.md, "Configuration").
Typical session:
  streamrec up          start Kafka, Redis, Flink and the project services
  streamrec status      show what runs, with pids, ports and health
  streamrec down        stop everything `up` started
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrec",
        description="An online recommender that learns while it serves "
        "(Kafka -> Flink -> TFRA trainer -> FastAPI, Redis feature store).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (cli_stack, cli_ingest, cli_features, cli_sim, cli_train, cli_registry,
                   cli_eval, serving_cli, cli_monitor):
        module.register(sub)
    cli_backfill.register_follow(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kafka-python and httpx log every connection/request at INFO; keep them to warnings.
    # Never DEBUG, even with -v: kafka-python then logs every record, i.e. raw payloads.
    for noisy in ("kafka", "httpx"):
        logging.getLogger(noisy).setLevel(logging.INFO if args.verbose else logging.WARNING)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
