"""Supervised local processes: start with a pid file and a log, check, stop by pid.

A pid file holds the pid and a marker string that must appear in the process's command line,
so a stale pid file (the process died, the pid was reused) never blocks a start and ``down``
never signals a process that is not ours.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


class StackError(Exception):
    """A component could not be set up, started, checked or stopped; the message says why."""


@dataclass(frozen=True)
class PidRecord:
    pid: int
    #: Alternatives separated by "|"; one must appear in the command line.
    marker: str
    started_at: float


def read_pid(path: Path) -> PidRecord | None:
    try:
        data = json.loads(path.read_text())
        return PidRecord(int(data["pid"]), str(data["marker"]), float(data["started_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_pid(path: Path, record: PidRecord) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"pid": record.pid, "marker": record.marker, "started_at": record.started_at})
    )
    tmp.replace(path)


def cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text or None


def is_ours(record: PidRecord | None) -> bool:
    """True if the recorded process is alive and is the one we started."""
    if record is None:
        return False
    line = cmdline(record.pid)
    if line is None or not any(m in line for m in record.marker.split("|")):
        return False
    try:
        state = Path(f"/proc/{record.pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def cpu_seconds(pid: int, *, group: bool = False) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its direct children (e.g. a
    server's worker processes), or with ``group`` by every process of process group ``pid``.
    Linux ``/proc`` only; processes that exit meanwhile are skipped."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields after "(comm)": state ppid pgrp ... utime (11) stime (12)
        ppid, pgrp = int(fields[1]), int(fields[2])
        if (pgrp == pid) if group else (int(entry.name) == pid or ppid == pid):
            total += int(fields[11]) + int(fields[12])
    return total / tick


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def tail(path: Path, lines: int = 15) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            data = fh.read().decode(errors="replace")
    except OSError:
        return "(no log yet)"
    return "\n".join(data.splitlines()[-lines:])


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    pid_path: Path,
    marker: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[PidRecord, subprocess.Popen[bytes]]:
    """Start ``argv`` in its own session, output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} start: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise StackError(f"could not run {argv[0]}: {exc}") from exc
    record = PidRecord(proc.pid, marker, time.time())
    write_pid(pid_path, record)
    return record, proc


def stop(record: PidRecord, timeout_s: float) -> bool:
    """SIGTERM the process group, then SIGKILL after ``timeout_s``. True if it was running."""
    if not is_ours(record):
        return False
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(record.pid, sig)
        except ProcessLookupError:
            return True
        except PermissionError:
            os.kill(record.pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap(record.pid)
            if not is_ours(record):
                return True
            time.sleep(0.1)
        log.warning("pid %d did not stop after %s", record.pid, sig.name)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_ready(
    check: Callable[[], bool],
    *,
    name: str,
    timeout_s: float,
    alive: Callable[[], bool],
    log_path: Path,
    interval_s: float = 0.25,
) -> None:
    """Poll ``check`` until it is true; fail early if the process died, or at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - a readiness probe may fail in any way
            log.debug("%s not ready yet: %s", name, exc)
        if not alive():
            raise StackError(
                f"{name} exited during start-up. Its log is {log_path}; last lines:\n"
                f"{tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise StackError(
                f"{name} did not become ready within {timeout_s:.0f} s. Its log is {log_path}; "
                f"last lines:\n{tail(log_path)}\nCheck the log, free the port or raise "
                "STREAMREC_STACK__READY_TIMEOUT_S, then run `streamrec up` again."
            )
        time.sleep(interval_s)
