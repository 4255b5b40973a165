"""Subcommands: serve (registered into ``streamrec`` by deploy.cli).

Keep imports here light: heavy modules are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

#: The environment variable ``prometheus_client`` reads for its multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


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
                   "loads and swaps versions on its own, /metrics answers for all of them")
    p.add_argument("--log-level", default="warning", help="uvicorn access/error log level")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from feature_store.settings import load_settings
    from serving.app import create_app

    settings = load_settings()
    workers = args.workers or settings.serving.workers
    port = args.port or settings.serving.port
    target: Any = "serving.cli:app_factory"
    metrics_dir: Path | None = None
    if workers == 1:
        target = create_app(settings)
    else:
        # Set before the workers start (and so before they import prometheus_client).
        metrics_dir = fresh_metrics_dir(settings.stack.run_dir / "metrics" / f"serving-{port}")
        os.environ[MULTIPROC_ENV] = str(metrics_dir)
    try:
        uvicorn.run(
            target,
            factory=workers > 1,
            workers=workers,
            host=args.host or settings.serving.host,
            port=port,
            loop="uvloop",
            http="httptools",
            log_level=args.log_level,
            access_log=False,
        )
    finally:
        if metrics_dir is not None:  # the workers have exited: their files are history
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def app_factory() -> Any:
    """App of one worker process when ``serve --workers N`` (N > 1) forks several."""
    from feature_store.settings import load_settings
    from serving.app import create_app

    return create_app(load_settings(), metrics_dir=os.environ.get(MULTIPROC_ENV))


def fresh_metrics_dir(path: Path) -> Path:
    """The multiprocess metrics folder of one server run, emptied of an earlier run's files
    (one folder per port: two servers on one host never share it)."""
    path = path.resolve()
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.db"):
        old.unlink()
    return path
