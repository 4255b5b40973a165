"""Free TCP ports for the stacks and clusters started on this host (tests, benchmarks,
``ClusterLayout.local``).

A port the kernel hands out for ``bind(0)`` comes from its ephemeral range, the same range
every outgoing connection takes its local port from: between choosing it and the server
binding it (Kafka, Redis and Flink start first, tens of seconds) any client on the host may
take it. So the ports are drawn at random below that range (``ip_local_port_range``), checked
free by binding, and never handed out twice by one process.
"""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack
from pathlib import Path

#: Lowest port drawn (well-known and registered defaults of our servers lie below it).
LOW = 10_000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed: set[int] = set()
_rng = random.SystemRandom()


def ephemeral_low() -> int:
    """First port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports nothing listens on now, below the ephemeral range (module doc);
    all bound at once to check them, then released. Where the range leaves no room below
    it, the kernel chooses (``bind(0)``)."""
    high = ephemeral_low()
    below = high - LOW >= 100 * n
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(max(50 * n, 1000)):
            if len(ports) == n:
                break
            port = _rng.randrange(LOW, high) if below else 0
            if port in _handed or port in ports:
                continue
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind((host, port))
            except OSError:  # taken: draw another
                continue
            ports.append(int(sock.getsockname()[1]))
        if len(ports) < n:
            raise OSError(f"found only {len(ports)} of {n} free ports on {host}")
        _handed.update(ports)
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    """One port as :func:`free_ports` draws them."""
    return free_ports(1, host)[0]
