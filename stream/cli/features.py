"""Subcommands: features (the Flink feature job) (registered into ``streamrec`` by deploy.cli).

``streamrec features`` submits ``stream/flink/job.py`` to the running Flink cluster
(``<FLINK_HOME>/bin/flink run -d -m 127.0.0.1:<rest_port> -pyexec <python> -py <job> ...``)
and returns once the cluster accepted it; ``--local`` runs the same job in-process on a
MiniCluster instead (foreground, for debugging). The job's Python workers get the settings
through the ``--settings-json`` job argument (secrets are left out: set
``STREAMREC_REDIS__PASSWORD`` in the TaskManager's environment).

Keep imports here light: heavy modules are imported inside the handlers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JOB_NAME = "streamrec-features"


def register(sub: Any) -> None:
    """Add these subcommands to the ``streamrec`` parser."""
    p = sub.add_parser(
        "features",
        help="run the Flink feature job (events -> Redis features + samples)",
        description="Submit the Flink feature job to the cluster (or run it locally).",
    )
    p.add_argument("--local", action="store_true", help="run in-process (MiniCluster), foreground")
    p.add_argument("--parallelism", type=int, default=None, help="default: flink.parallelism")
    p.add_argument("--group-id", default="streamrec-features", help="Kafka consumer group")
    p.add_argument("--job-name", default=None,
                   help=f"default: {JOB_NAME}:<events topic> (one job per topic)")
    p.add_argument("--restore", default=None, help="resume from this checkpoint/savepoint path")
    p.add_argument("--checkpoint-dir", default=None, help="default: the cluster's setting")
    p.add_argument(
        "--window-ms",
        type=int,
        default=100,
        help="the JVM hands each Python stage a key bucket's records of this long a "
        "processing-time window in one call (the most a record waits for its stage)",
    )
    p.add_argument("--flush-ms", type=int, default=100, help="max delay of the trending write")
    p.add_argument("--bucket-ms", type=int, default=60_000, help="window bucket size (ms)")
    p.add_argument(
        "--python-mode",
        choices=("thread", "process"),
        default="thread",
        help="Python operators in the TaskManager's JVM (thread; default: ~7x less CPU per "
        "event; the cluster `streamrec up` starts has flink-python on its classpath for it) or "
        "in separate worker processes (process)",
    )
    p.set_defaults(func=_features)


def settings_json(settings: Any) -> str:
    """Settings as the job argument: JSON, secrets left out (workers read them from env)."""
    data = settings.model_dump(mode="json")
    data["redis"].pop("password", None)
    for section in ("ingest", "serving"):
        for key in ("api_key", "admin_token"):
            data.get(section, {}).pop(key, None)
    return json.dumps(data, separators=(",", ":"))


def job_args(args: Any, settings: Any) -> list[str]:
    """Arguments of ``stream/flink/job.py`` (after the script path)."""
    argv = [
        "--settings-json",
        settings_json(settings),
        "--group-id",
        args.group_id,
        "--job-name",
        args.job_name,
        "--window-ms",
        str(getattr(args, "window_ms", 100)),
        "--flush-ms",
        str(args.flush_ms),
        "--bucket-ms",
        str(args.bucket_ms),
        "--python-mode",
        getattr(args, "python_mode", "thread"),
    ]
    if args.parallelism:
        argv += ["--parallelism", str(args.parallelism)]
    if args.checkpoint_dir:
        argv += ["--checkpoint-dir", str(args.checkpoint_dir)]
    if args.local:
        argv.append("--local")
        if args.restore:
            argv += ["--restore", str(args.restore)]
    return argv


def job_file() -> Path:
    return Path(__file__).resolve().parents[1] / "flink" / "job.py"


def job_name(settings: Any) -> str:
    """The feature job's name on the cluster: one job per events topic."""
    return f"{JOB_NAME}:{settings.kafka.events_topic}"


def _features(args: Any) -> int:
    from stream.flink.submit import FlinkSubmitError, live_job_id, submit_python_job
    from streamrec.settings import load_settings

    settings = load_settings()
    args.job_name = args.job_name or job_name(settings)
    if args.local:
        from stream.flink.job import main as job_main

        return job_main(job_args(args, settings))
    try:
        running = live_job_id(settings, args.job_name)
        if running:
            log.info("%s already runs on the cluster (job %s); not submitting again",
                     args.job_name, running)
            return 0
        job_id = submit_python_job(settings, job_file(), job_args(args, settings),
                                   restore=args.restore)
    except (FlinkSubmitError, OSError) as exc:
        log.error("could not submit the feature job: %s", exc)
        return 1
    log.info("submitted %s as Flink job %s", args.job_name, job_id)
    return 0
