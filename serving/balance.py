"""Keep-alive connections evened out over the workers of one port (Linux ``/proc``).

Each worker of ``serve --workers N`` listens on its own ``SO_REUSEPORT`` socket and the kernel
hands it new connections by their hash. With a few long-lived keep-alive connections that
split is a coin toss that lasts as long as the connections, and the busier worker's queue
sets everyone's p99. A :class:`ConnectionBalancer` in each worker counts, once a second on a
thread (reading ``/proc/net`` is slow and would stall the event loop), the connections to the
port and its own; a worker over its share, ``ceil(total / workers)``, answers that many
responses with ``Connection: close`` (``serving.fastpath``), and the clients' new connections
are hashed anew until the split is even. No state is shared between the workers. Figures:
``docs/decisions.md#serving-request-path``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

#: ``st`` of an established connection in ``/proc/net/tcp``.
ESTABLISHED = "01"


def established_inodes(port: int, tables: Iterable[str]) -> set[int]:
    """Socket inodes of the established TCP connections whose local port is ``port``, from
    the texts of ``/proc/net/tcp``-format ``tables`` (their first line is a header)."""
    out: set[int] = set()
    for text in tables:
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != ESTABLISHED:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port:
                out.add(int(fields[9]))
    return out


#: The ``/proc/net`` tables of both address families.
BOTH = ("tcp", "tcp6")


def tables_of(family: int) -> tuple[str, ...]:
    """The ``/proc/net`` table that lists the connections of a listener of address
    ``family``: ``tcp6`` for ``AF_INET6`` (a dual-stack one lists its IPv4 clients there
    too), ``tcp`` for ``AF_INET``."""
    return ("tcp6",) if family == socket.AF_INET6 else ("tcp",)


def read_tables(proc: Path = Path("/proc"), names: Iterable[str] = BOTH) -> list[str]:
    """The texts of the ``/proc/net`` tables ``names`` (a missing one is skipped)."""
    out = []
    for name in names:
        try:
            out.append((proc / "net" / name).read_text())
        except OSError:
            continue
    return out


def own_socket_inodes(fd_dir: Path = Path("/proc/self/fd")) -> set[int]:
    """Inodes of the sockets among this process's file descriptors."""
    out: set[int] = set()
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / name)
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def connections_by_pid(port: int, pids: Iterable[int], proc: Path = Path("/proc")) -> dict[int, int]:
    """Established connections to local ``port`` held by each of ``pids`` (a process gone
    or not readable counts 0)."""
    everyone = established_inodes(port, read_tables(proc))
    out = {}
    for pid in pids:
        try:
            out[pid] = len(everyone & own_socket_inodes(proc / str(pid) / "fd"))
        except OSError:
            out[pid] = 0
    return out


class ConnectionBalancer:
    """One worker's side of the evening out (module doc). :meth:`should_close` is asked per
    response on the request path (one integer test); :meth:`refresh` counts, off it."""

    def __init__(
        self,
        port: int,
        workers: int,
        interval_s: float = 1.0,
        tables: Callable[[], Iterable[str]] = read_tables,
        own: Callable[[], set[int]] = own_socket_inodes,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.port, self.workers, self.interval_s = port, workers, interval_s
        self._tables, self._own = tables, own
        self._to_close = 0
        #: Connections this worker closed to even out the split (since it started).
        self.closed = 0
        #: The last count: (this worker's connections, all workers').
        self.last: tuple[int, int] = (0, 0)

    def refresh(self) -> int:
        """Count the connections; returns how many of this worker's to close (the excess
        over its share), which replaces what was still to close."""
        everyone = established_inodes(self.port, self._tables())
        mine = len(everyone & self._own())
        self.last = (mine, len(everyone))
        share = math.ceil(len(everyone) / self.workers)
        self._to_close = max(mine - share, 0)
        return self._to_close

    def should_close(self) -> bool:
        """Whether this response closes its connection (one of the excess)."""
        if self._to_close <= 0:
            return False
        self._to_close -= 1
        self.closed += 1
        return True

    async def run(self) -> None:
        """Refresh every ``interval_s`` until cancelled, each count on a thread (module
        doc: a few milliseconds in the kernel); a failed count is logged and skipped, the
        split then left as it is. The thread only replaces ``_to_close`` and ``last``,
        which the loop reads (one assignment each)."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await asyncio.to_thread(self.refresh)
            except (OSError, ValueError) as exc:
                log.warning("counting the connections of port %d failed: %s", self.port, exc)
