"""Subcommand: exporter (registered into ``streamrec`` by deploy.cli).

Keep imports here light: heavy modules are imported inside the handlers.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add this subcommand to the ``streamrec`` parser."""
    p = sub.add_parser(
        "exporter",
        help="serve the pipeline's Kafka and Redis figures to Prometheus",
        description="GET /metrics: records written to the events, dead-letter and samples "
        "topics, the feature job's consumer lag, whether Kafka and Redis answer, and the "
        "feature store's freshness, each read when Prometheus scrapes (stream/monitor.py).",
    )
    p.add_argument("--host", help="bind address (default: stack.bind_host)")
    p.add_argument("--port", type=int, help="port (default: prometheus.exporter_port)")
    p.add_argument("--features-group", default="streamrec-features",
                   help="consumer group of the feature job (streamrec features --group-id)")
    p.set_defaults(func=_exporter)


def _exporter(args: argparse.Namespace) -> int:
    import logging
    from datetime import UTC, datetime

    from stream.monitor import ExporterServer, PipelineCollector
    from streamrec.settings import load_settings

    settings = load_settings()
    collector = PipelineCollector(settings, lambda: datetime.now(UTC),
                                  features_group=args.features_group)
    server = ExporterServer(args.host or settings.stack.bind_host,
                            args.port or settings.prometheus.exporter_port, collector)
    logging.getLogger(__name__).info("exporter on port %d", server.httpd.server_address[1])
    server.serve_forever()
    return 0
