"""Subcommands: serve and dashboard-collector (registered into ``streamrec`` by deploy.cli).

Keep imports here light: heavy modules are imported inside the handlers. The supervision of
``serve --workers N`` is ``serving.workers``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add these subcommands to the ``streamrec`` parser."""
    p = sub.add_parser(
        "serve",
        help="run the recommendation API (hot-swaps model versions)",
        description="Serve GET /recommend, /model, /health, /metrics and the feature routes. "
        "New model versions are picked up from the registry (Redis pub/sub, plus a periodic "
        "check of CURRENT), verified and swapped in without dropping a request.",
    )
    p.add_argument("--host", help="bind address (default: serving.host)")
    p.add_argument("--port", type=int, help="port (default: serving.port)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: serving.workers = one per core); each "
                   "loads and swaps full versions on its own, one composer process applies "
                   "the deltas for all of them (serving.shared_deltas), /metrics answers for "
                   "all of them")
    p.add_argument("--log-level", default="warning", help="uvicorn access/error log level")
    p.set_defaults(func=_serve)
    c = sub.add_parser(
        "dashboard-collector",
        help="scrape the stack for the dashboard (one per stack; serving's /stats reads it)",
        description="Every 2 s, read the ingest API's, the trainer's and serving's /metrics, "
        "serving's /model and the samples topic's end offsets, and write the dashboard's "
        "snapshot to <run_dir>/dashboard/stats.json, which serving's GET /stats answers with.",
    )
    c.add_argument("--serving-url", help="serving's base URL (default: from serving.host/port)")
    c.set_defaults(func=_dashboard_collector)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from serving.app import create_app
    from serving.deps import ServingDeps
    from serving.workers import (
        ANN_ENV,
        MULTIPROC_ENV,
        WORKERS_ENV,
        fresh_ann_dir,
        fresh_metrics_dir,
        run_workers,
        shared_state_dir,
    )
    from streamrec.settings import load_settings

    settings = load_settings()
    tune_interpreter(settings)
    workers = args.workers or settings.serving.workers
    port = args.port or settings.serving.port
    target: Any = "serving.cli:app_factory"
    metrics_dir: Path | None = None
    shared: Path | None = None
    if workers == 1:
        target = create_app(ServingDeps(settings))
    else:
        # Set before the workers start (and so before they import prometheus_client).
        metrics_dir = fresh_metrics_dir(settings.stack.run_dir / "metrics" / f"serving-{port}")
        os.environ[MULTIPROC_ENV] = str(metrics_dir)
        os.environ[WORKERS_ENV] = f"{port} {workers} {args.host or settings.serving.host}"
        os.environ[ANN_ENV] = str(fresh_ann_dir(settings.stack.run_dir, port))
        if settings.serving.shared_deltas and settings.trainer.delta_every_s > 0:
            from serving.shared_state import SHARED_ENV

            shared = shared_state_dir(settings.stack.run_dir, port)
            os.environ[SHARED_ENV] = str(shared)
    options: dict[str, Any] = {
        "host": args.host or settings.serving.host, "port": port, "loop": "uvloop",
        "http": "httptools", "log_level": args.log_level, "access_log": False}
    try:
        if workers == 1:
            uvicorn.run(target, **options)
        else:
            run_workers(uvicorn.Config(target, factory=True, workers=workers, **options),
                        shared, args.log_level)
    finally:
        if metrics_dir is not None:  # the workers have exited: their files are history
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def app_factory() -> Any:
    """App of one worker process when ``serve --workers N`` (N > 1) forks several."""
    from serving.app import create_app
    from serving.deps import ServingDeps
    from serving.shared_state import SHARED_ENV
    from serving.workers import ANN_ENV, MULTIPROC_ENV, WORKERS_ENV, workers_balancer
    from streamrec.settings import load_settings

    settings = load_settings()
    tune_interpreter(settings)
    balancer = None
    if (settings.serving.balance_connections and os.environ.get(WORKERS_ENV)
            and Path("/proc/net/tcp").exists()):  # Linux: counted from /proc
        balancer = workers_balancer(os.environ[WORKERS_ENV])
    shared, ann = os.environ.get(SHARED_ENV), os.environ.get(ANN_ENV)
    return create_app(ServingDeps(settings, metrics_dir=os.environ.get(MULTIPROC_ENV),
                                  balancer=balancer, shared_dir=Path(shared) if shared else None,
                                  ann_dir=Path(ann) if ann else None))


def tune_interpreter(settings: Any) -> None:
    """The interpreter settings of a serving process: its GIL switch interval
    (``serving.gil_switch_interval_s``)."""
    interval = settings.serving.gil_switch_interval_s
    if interval is not None:
        sys.setswitchinterval(interval)


def _dashboard_collector(args: argparse.Namespace) -> int:
    from serving.dashboard import collector_from_settings
    from serving.dashboard_collector import run_until_signalled
    from serving.deps import utc_now
    from serving.stats_file import stats_path
    from streamrec.settings import load_settings

    settings = load_settings()
    collector = collector_from_settings(settings, utc_now, serving_url=args.serving_url)
    run_until_signalled(collector, stats_path(settings))
    return 0
