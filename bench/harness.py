"""The harness the benchmarks and the test suites share: bounded waits, free ports, HTTP
probes, child processes and their environment, the test stack's settings and private stacks
on free ports (``tests`` imports these; nothing of ours imports ``tests``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from streamrec.ports import free_port
from streamrec.settings import Settings, load_settings

T = TypeVar("T")
log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Run folder of the test suites' shared stack.
TEST_RUN_DIR = REPO_ROOT / ".streamrec-test"


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
    *,
    process: Any = None,
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail with ``what`` at the deadline.
    An exception of ``predicate`` counts as "not yet" (the last one is reported). With
    ``process`` (anything with ``poll()`` and ``returncode``, e.g. a ``Popen``), fail at once
    if it exits meanwhile."""
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"the process exited ({process.returncode}) while waiting for {what}")
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - remembered and reported at the deadline
            last_exc = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{detail}")
        time.sleep(interval_s)


def add_endpoint_args(parser: Any, settings: Settings) -> None:
    """``--ingest``, ``--serving`` and ``--trainer``: the URLs of a running stack's services
    (default: the ports of ``settings``)."""
    s = settings
    parser.add_argument("--ingest", default=f"http://{s.stack.bind_host}:{s.ingest.port}")
    parser.add_argument("--serving", default=f"http://{s.stack.bind_host}:{s.serving.port}")
    parser.add_argument("--trainer",
                        default=f"http://{s.stack.bind_host}:{s.trainer.metrics_port}")


def stop_process(proc: Any, grace_s: float = 10.0) -> None:
    """SIGTERM a ``subprocess.Popen``, then SIGKILL if it has not exited after ``grace_s``."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """Whether ``GET url`` answers 200 (a connection error or timeout is ``False``)."""
    import httpx

    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def service_env(settings: Any) -> Iterator[None]:
    """The ``STREAMREC_*`` environment of ``settings`` for the processes started meanwhile: no
    other setting leaks in from the caller's (the harness's own ``STREAMREC_TEST_*`` stay);
    the previous environment is restored after."""
    from streamrec.settings import to_env

    saved = dict(os.environ)
    for key in [k for k in os.environ
                if k.startswith("STREAMREC_") and not k.startswith("STREAMREC_TEST_")]:
        del os.environ[key]
    os.environ.update(to_env(settings))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_stack_settings() -> Settings:
    base = load_settings()
    off = int(os.environ.get("STREAMREC_TEST_PORT_OFFSET", "0"))
    return base.model_copy(update={
        "stack": base.stack.model_copy(update={"run_dir": TEST_RUN_DIR, "ready_timeout_s": 120.0}),
        "kafka": base.kafka.model_copy(update={"port": 19092 + off,
                                               "controller_port": 19093 + off}),
        "redis": base.redis.model_copy(update={"port": 16379 + off}),
        "flink": base.flink.model_copy(update={"rest_port": 18081 + off, "rpc_port": 16123 + off}),
        "ingest": base.ingest.model_copy(update={"port": 18001 + off}),
        "serving": base.serving.model_copy(update={"port": 18000 + off}),
        "trainer": base.trainer.model_copy(update={"metrics_port": 18002 + off}),
        "prometheus": base.prometheus.model_copy(update={
            "port": 19090 + off, "exporter_port": 18003 + off,
            "flink_reporter_port": 19249 + off}),
    })


def private_settings(root: Path, *, flink: bool = False, appendonly: bool = True) -> Settings:
    """Settings of a throwaway stack under ``root``: free ports, own topics, prefix, dirs."""
    base = test_stack_settings()
    uid = f"c{uuid.uuid4().hex[:8]}"
    flink_ports = {"rest_port": free_port(), "rpc_port": free_port()} if flink else {}
    return base.model_copy(update={
        "stack": base.stack.model_copy(update={"run_dir": root / "stack", "ready_timeout_s": 240.0,
                                               "stop_timeout_s": 10.0}),
        "kafka": base.kafka.model_copy(update={
            "port": free_port(), "controller_port": free_port(), "heap": "384m", "partitions": 2,
            "events_topic": f"{uid}.events", "dlq_topic": f"{uid}.events.dlq",
            "samples_topic": f"{uid}.samples"}),
        "redis": base.redis.model_copy(update={"port": free_port(), "key_prefix": f"{uid}:",
                                               "appendonly": appendonly}),
        "flink": base.flink.model_copy(update={
            **flink_ports, "taskmanager_slots": 2, "checkpoint_interval_ms": 2000,
            "jobmanager_memory": "768m", "taskmanager_memory": "1280m"}),
        "ingest": base.ingest.model_copy(update={"port": free_port(), "produce_timeout_s": 3.0}),
        "serving": base.serving.model_copy(update={"port": free_port(), "poll_interval_s": 1.0}),
        "trainer": base.trainer.model_copy(update={
            "metrics_port": free_port(), "group_id": f"{uid}-trainer",
            "registry_dir": root / "models", "checkpoint_dir": root / "trainer",
            "export_every_s": 3.0, "batch_size": 64}),
    })  # fmt: skip


@dataclass
class Chaos:
    """A private stack plus the bookkeeping of every fault injected into it."""

    settings: Settings
    stack: Any  # deploy.stack.Stack
    #: (component, killed at, ready again at) in time.monotonic() seconds.
    outages: list[tuple[str, float, float]] = field(default_factory=list)

    def kill9(self, name: str) -> int:
        """SIGKILL the component's whole process group; returns the pid it killed."""
        from deploy.process import is_ours, read_pid

        record = read_pid(self.stack.pid_path(name))
        assert is_ours(record), f"{name} is not running"
        assert record is not None
        os.killpg(record.pid, signal.SIGKILL)

        def gone() -> bool:
            try:
                os.waitpid(record.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            return not is_ours(record)

        wait_until(gone, 15, f"{name} (pid {record.pid}) to die")
        return record.pid

    def kill_and_restart(self, name: str, down_s: float = 2.0) -> tuple[float, float]:
        """kill -9 ``name``, leave it down ``down_s`` under load, start it, wait until ready."""
        killed_at = time.monotonic()
        pid = self.kill9(name)
        log.info("killed %s (pid %d)", name, pid)
        time.sleep(down_s)  # the outage itself, not a wait for a condition
        self.stack.start_component(name)
        ready_at = time.monotonic()
        self.outages.append((name, killed_at, ready_at))
        return killed_at, ready_at

    def url(self, name: str) -> str:
        port = {"ingest-api": self.settings.ingest.port, "serving": self.settings.serving.port,
                "trainer": self.settings.trainer.metrics_port}[name]
        return f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def private_stack(settings: Settings, components: list[str]) -> Iterator[Chaos]:
    """Start ``components`` (infra first) of a private stack; stop all of them at the end."""
    from deploy.stack import Stack

    with service_env(settings):
        stack = Stack(settings, available_commands={"ingest-api", "features", "train", "serve"})
        try:
            stack.up(components)
            yield Chaos(settings, stack)
        finally:
            stack.down()
