"""The local stack: start, check and stop every component as a supervised local process.

Layout of the run folder (``settings.stack.run_dir``, default ``./.streamrec``)::

    pids/<component>.pid   pid + command-line marker (JSON)
    logs/<component>.log   the component's stdout and stderr
    kafka/ redis/ flink/   each component's data and generated configuration
    stack.lock             held while `up` or `down` runs, so two of them never interleave

``up`` is idempotent: a component that is already running and healthy is left alone; a stale
pid file is replaced. ``down`` stops only processes whose pid file names them, newest first.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from deploy import components as comp
from deploy.process import (
    StackError,
    is_ours,
    port_in_use,
    read_pid,
    spawn,
    stop,
    tail,
    wait_ready,
)
from streamrec.settings import Settings

log = logging.getLogger(__name__)

INFRA = ("kafka", "redis", "flink-jobmanager", "flink-taskmanager")


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    state: str  # running | unhealthy | stopped | done
    pid: int | None
    port: int | None
    healthy: bool
    log: str


class Stack:
    def __init__(self, settings: Settings, available_commands: set[str] | None = None) -> None:
        self.settings = settings
        self.run_dir = settings.stack.run_dir.resolve()
        self.available_commands = available_commands or set()

    # ----------------------------------------------------------------- layout

    def pid_path(self, name: str) -> Path:
        return self.run_dir / "pids" / f"{name}.pid"

    def log_path(self, name: str) -> Path:
        return self.run_dir / "logs" / f"{name}.log"

    def components(self) -> list[comp.Component]:
        s = self.settings
        return [
            comp.kafka_component(s, self.run_dir),
            comp.redis_component(s, self.run_dir),
            *comp.flink_components(s, self.run_dir),
            *comp.service_components(s, self.available_commands),
            *comp.monitoring_components(s, self.run_dir),
        ]

    def component(self, name: str) -> comp.Component:
        for c in self.components():
            if c.name == name:
                return c
        raise StackError(f"unknown component {name!r}")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "pids").mkdir(exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        with (self.run_dir / "stack.lock").open("w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # ----------------------------------------------------------------- up / down

    def up(self, only: Sequence[str] | None = None) -> list[str]:
        """Start what is not running yet; returns the names it started."""
        started: list[str] = []
        with self._locked():
            for c in self.components():
                if only is not None and c.name not in only:
                    continue
                if self._start(c):
                    started.append(c.name)
                if c.name == "kafka":
                    # Before any service runs, so none of them auto-creates a topic.
                    self._create_topics()
        return started

    def start_component(self, name: str) -> bool:
        with self._locked():
            return self._start(self.component(name))

    def stop_component(self, name: str) -> bool:
        with self._locked():
            return self._stop(name)

    def down(self, only: Sequence[str] | None = None) -> list[str]:
        """Stop what we started, in reverse order; returns the names it stopped."""
        stopped: list[str] = []
        with self._locked():
            names = [c.name for c in self._all_known()]
            for name in reversed(names):
                if only is not None and name not in only:
                    continue
                if self._stop(name):
                    stopped.append(name)
        return stopped

    def _all_known(self) -> list[comp.Component]:
        """Every component, including services whose command is not registered here."""
        s = self.settings
        all_services = comp.service_components(s, {"ingest-api", "features", "train", "serve"})
        return [*self.components()[: len(INFRA)], *all_services,
                *comp.monitoring_components(s, self.run_dir)]

    def _start(self, c: comp.Component) -> bool:
        pid_path, log_path = self.pid_path(c.name), self.log_path(c.name)
        record = read_pid(pid_path)
        if is_ours(record):
            wait_ready(c.ready, name=c.name, timeout_s=self.settings.stack.ready_timeout_s,
                       alive=lambda: is_ours(record), log_path=log_path)
            log.info("%s already running (pid %d)", c.name, record.pid if record else -1)
            return False
        if c.oneshot and self._safe_ready(c):
            log.info("%s already running", c.name)
            return False
        pid_path.unlink(missing_ok=True)
        if c.port and port_in_use(self.settings.stack.bind_host, c.port):
            raise StackError(
                f"Port {c.port} that {c.name} needs is already in use by a process streamrec did "
                f"not start. Stop that process, or give {c.name} another port (see docs/operations.md, "
                "'Configuration'), then run `streamrec up` again."
            )
        c.prepare()
        log.info("starting %s%s", c.name, f" on port {c.port}" if c.port else "")
        t0 = time.monotonic()
        rec, proc = spawn(c.argv(), log_path=log_path, pid_path=pid_path,
                          marker=c.marker or c.name, env=comp.child_env(c.env), cwd=Path.cwd())
        if c.oneshot:
            self._wait_oneshot(c, proc, log_path)
        else:
            # We are the parent: poll() is exact (a /proc marker check races with exec).
            wait_ready(c.ready, name=c.name, timeout_s=self.settings.stack.ready_timeout_s,
                       alive=lambda: proc.poll() is None, log_path=log_path)
        log.info("%s ready in %.1f s (pid %d, log %s)", c.name, time.monotonic() - t0, rec.pid,
                 log_path)
        return True

    def _wait_oneshot(self, c: comp.Component, proc: subprocess.Popen[bytes],
                      log_path: Path) -> None:
        deadline = time.monotonic() + self.settings.stack.ready_timeout_s
        try:
            code = proc.wait(timeout=self.settings.stack.ready_timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        if code not in (0, None):
            raise StackError(f"{c.name} failed (exit {code}). Its log is {log_path}; "
                             f"last lines:\n{tail(log_path)}")
        wait_ready(c.ready, name=c.name, timeout_s=max(1.0, deadline - time.monotonic()),
                   alive=lambda: True, log_path=log_path)

    def _stop(self, name: str) -> bool:
        pid_path = self.pid_path(name)
        record = read_pid(pid_path)
        was_running = record is not None and stop(record, self.settings.stack.stop_timeout_s)
        pid_path.unlink(missing_ok=True)
        if was_running:
            log.info("stopped %s (pid %d)", name, record.pid if record else -1)
        return was_running

    def _create_topics(self) -> None:
        from stream.kafka_client import ensure_topics, ensure_updates_topic

        k = self.settings.kafka
        ensure_topics(
            k, [k.events_topic, k.dlq_topic, k.samples_topic, k.items_topic], k.partitions
        )
        ensure_updates_topic(k)

    # ----------------------------------------------------------------- status

    @staticmethod
    def _safe_ready(c: comp.Component) -> bool:
        try:
            return bool(c.ready())
        except Exception as exc:  # noqa: BLE001 - any probe failure means "not healthy"
            log.debug("%s probe failed: %s", c.name, exc)
            return False

    def status(self) -> list[ComponentStatus]:
        out: list[ComponentStatus] = []
        for c in self._all_known():
            record = read_pid(self.pid_path(c.name))
            alive = is_ours(record)
            healthy = self._safe_ready(c) if (alive or c.oneshot) else False
            if c.oneshot:
                state = "running" if healthy else "stopped"
            else:
                state = ("running" if healthy else "unhealthy") if alive else "stopped"
            out.append(ComponentStatus(
                name=c.name, state=state, pid=record.pid if alive and record else None,
                port=c.port or None, healthy=healthy, log=str(self.log_path(c.name)),
            ))
        return out

    @staticmethod
    def status_dicts(rows: Sequence[ComponentStatus]) -> list[dict[str, object]]:
        return [asdict(r) for r in rows]
