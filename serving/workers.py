"""Worker supervision of ``streamrec serve --workers N``: uvicorn's supervisor over N worker
processes, each listening on its own ``SO_REUSEPORT`` socket, beside the host's delta composer
(restarted if it dies); the multiprocess metrics folder and the composer's folder of one server.

The workers themselves are ``serving.cli.app_factory``; the environment variables below tell
them what the supervisor chose.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serving.balance import ConnectionBalancer

log = logging.getLogger(__name__)

#: The environment variable ``prometheus_client`` reads for its multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: How the workers of ``serve --workers N`` learn the port and N they serve with (the
#: command line may override the settings'), and the host they bind (which ``/proc/net``
#: table lists their connections): ``"<port> <workers> <host>"``.
WORKERS_ENV = "SERVE_PORT_AND_WORKERS"


def workers_balancer(spec: str) -> ConnectionBalancer:
    """A worker's ``serving.balance.ConnectionBalancer`` from ``spec``, the value of
    ``SERVE_PORT_AND_WORKERS``: ``"port workers host"`` (the host absent when empty). It
    reads only the ``/proc/net`` table of the listener's address family."""
    from serving.balance import ConnectionBalancer, read_tables, tables_of

    port, workers, *host = spec.split()
    names = tables_of(address_family(host[0] if host else ""))
    return ConnectionBalancer(int(port), int(workers), tables=lambda: read_tables(names=names))


def fresh_metrics_dir(path: Path) -> Path:
    """The multiprocess metrics folder of one server run, emptied of an earlier run's files
    (one folder per port: two servers on one host never share it)."""
    path = path.resolve()
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.db"):
        old.unlink()
    return path


class ReusePortListener:
    """A worker's own listening socket, bound in the worker: pickled to each worker process
    (uvicorn passes its sockets that way) as the recipe :func:`bind_reuse_port`.

    With one socket shared by every worker, a burst of new connections goes to the worker
    that wakes first, which accepts all of it; with ``SO_REUSEPORT`` each worker has its own
    socket and the kernel spreads new connections over them (figures:
    ``docs/decisions.md#serving-workers``)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def __reduce__(self) -> tuple[Any, tuple[str, int]]:
        return bind_reuse_port, (self.host, self.port)


def bind_reuse_port(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` with ``SO_REUSEPORT`` (not yet listening)."""
    sock = _tcp_socket(host)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def address_family(host: str) -> socket.AddressFamily:
    """The family of a listener bound to ``host``: IPv6 if it has a colon (as uvicorn)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _tcp_socket(host: str) -> socket.socket:
    """A TCP socket for ``host`` (IPv6 if it has a colon) with ``SO_REUSEADDR``, as uvicorn
    binds its own."""
    sock = socket.socket(address_family(host))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


#: Environment variable naming the folder where a server's workers share their ANN indexes.
ANN_ENV = "STREAMREC_SERVING_ANN_DIR"


def fresh_ann_dir(run_dir: Path, port: int) -> Path:
    """The folder of one server run's ANN indexes (``model.scoring.ann``: built once, mapped
    by every worker), emptied of an earlier run's."""
    path = (run_dir / "ann" / f"serving-{port}").resolve()
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


def shared_state_dir(run_dir: Path, port: int) -> Path:
    """Where the composer of the server on ``port`` writes its states for the workers
    (``serving.shared_state``): in memory (``/dev/shm``) where there is one."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"streamrec-{os.getuid()}-serving-{port}"
    return run_dir / "shared" / f"serving-{port}"


#: Exit codes of a composer that was stopped, not one that failed.
_STOPPED = (0, -signal.SIGTERM, -signal.SIGINT)


class ComposerProcess:
    """The host's delta composer (``python -m serving.shared_state``), restarted while the
    server runs if it fails or is killed; not after a stop it was asked for (it exits 0 on
    SIGTERM or SIGINT, or dies of one before its handlers are set: a signal to the
    server's process group). Its directory is emptied before and removed after."""

    def __init__(self, directory: Path, log_level: str, restart_after_s: float = 1.0) -> None:
        self.directory, self.log_level = directory, log_level
        self.restart_after_s = restart_after_s
        self.proc: Any = None
        self.starts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        self._thread = threading.Thread(target=self._run, name="composer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.starts += 1
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "serving.shared_state", "--dir", str(self.directory),
                 "--log-level", self.log_level])
            code = self.proc.wait()
            if code in _STOPPED or self._stop.is_set():
                return
            log.warning("delta composer exited (%s); restarting it", code)
            self._stop.wait(self.restart_after_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self._thread is not None:
            self._thread.join(timeout_s)
        shutil.rmtree(self.directory, ignore_errors=True)


def run_workers(config: Any, shared: Path | None = None, log_level: str = "warning") -> None:
    """uvicorn's worker supervisor (restarts a worker that dies), each worker listening on
    its own ``SO_REUSEPORT`` socket, beside the host's delta composer when ``shared`` is its
    directory. The port is first bound without ``SO_REUSEPORT`` and released, so a port
    another server holds fails here, as with one shared socket, instead of being shared
    with it."""
    from uvicorn.supervisors import Multiprocess

    probe = _tcp_socket(config.host)
    try:
        probe.bind((config.host, config.port))
    except OSError as exc:
        log.error("cannot serve on %s:%s: %s", config.host, config.port, exc)
        raise SystemExit(3) from exc
    finally:
        probe.close()
    log.info("serving on %s:%s with %d workers", config.host, config.port, config.workers)
    listener: Any = ReusePortListener(config.host, config.port)
    composer = ComposerProcess(shared, log_level) if shared is not None else None
    if composer is not None:
        composer.start()
    try:
        Multiprocess(config, sockets=[listener]).run()
    except KeyboardInterrupt:
        pass
    finally:
        if composer is not None:
            composer.stop()
