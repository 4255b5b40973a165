"""Submit PyFlink jobs to the standalone cluster and manage them over its REST API.

The cluster is the Flink distribution shipped inside the PyFlink wheel (``FLINK_HOME`` is the
installed ``pyflink`` folder); its configuration is written by ``streamrec up`` into
``<run_dir>/flink/conf`` (it names the Kafka connector jar in ``pipeline.jars`` and this
Python in ``python.executable``, so workers import our packages).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from stream.errors import StreamError
from streamrec.settings import Settings

log = logging.getLogger(__name__)


class FlinkSubmitError(StreamError):
    """A job could not be submitted, found or cancelled."""


def flink_home() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pyflink")
    if spec is None or not spec.submodule_search_locations:
        raise FlinkSubmitError("PyFlink (apache-flink) is not installed in this Python")
    return Path(next(iter(spec.submodule_search_locations)))


def rest_url(settings: Settings) -> str:
    return f"http://{settings.flink.host}:{settings.flink.rest_port}"


def conf_dir(settings: Settings) -> Path:
    return settings.stack.run_dir.resolve() / "flink" / "conf"


def submit_python_job(
    settings: Settings,
    job_file: Path,
    job_args: Sequence[str] = (),
    *,
    parallelism: int | None = None,
    restore: str | None = None,
    timeout_s: float = 180.0,
) -> str:
    """Submit ``job_file`` detached (resuming from ``restore``, a checkpoint or savepoint
    path, if given); returns the Flink job id."""
    conf = conf_dir(settings)
    if not (conf / "config.yaml").exists():
        raise FlinkSubmitError(
            f"no Flink configuration in {conf}: start the cluster first with `streamrec up`"
        )
    home = flink_home()
    env = dict(
        os.environ,
        FLINK_HOME=str(home),
        FLINK_CONF_DIR=str(conf),
        FLINK_LOG_DIR=str(conf.parent / "log"),
    )
    argv = [
        "bash",
        str(home / "bin" / "flink"),
        "run",
        "-d",
        "-m",
        f"{settings.flink.host}:{settings.flink.rest_port}",
        "-pyexec",
        sys.executable,
        "-pyclientexec",
        sys.executable,
    ]
    if parallelism:
        argv += ["-p", str(parallelism)]
    if restore:
        argv += ["-s", restore]
    argv += ["-py", str(job_file), *job_args]
    log.info("submitting %s to %s", job_file.name, rest_url(settings))
    result = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    output = result.stdout + result.stderr
    job_id = next(
        (
            line.rsplit(" ", 1)[-1].strip()
            for line in output.splitlines()
            if "has been submitted with JobID" in line
        ),
        None,
    )
    if result.returncode != 0 or not job_id:
        raise FlinkSubmitError(f"flink run failed (exit {result.returncode}):\n{output[-3000:]}")
    return job_id


def list_jobs(settings: Settings) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{rest_url(settings)}/jobs/overview", timeout=5) as resp:
        return list(json.loads(resp.read()).get("jobs", []))


LIVE_STATES = frozenset({"CREATED", "INITIALIZING", "RUNNING", "RESTARTING"})


def live_job_id(settings: Settings, job_name: str) -> str | None:
    """The id of a job called ``job_name`` that runs (or is about to), if any."""
    return next((str(j["jid"]) for j in list_jobs(settings)
                 if j.get("name") == job_name and j.get("state") in LIVE_STATES), None)


def job_state(settings: Settings, job_id: str) -> str | None:
    return next((str(j["state"]) for j in list_jobs(settings) if j.get("jid") == job_id), None)


def cancel_job(settings: Settings, job_id: str) -> None:
    req = urllib.request.Request(f"{rest_url(settings)}/jobs/{job_id}?mode=cancel", method="PATCH")
    with urllib.request.urlopen(req, timeout=10):
        pass
