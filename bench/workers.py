"""What the serving workers of a benchmark spend (Linux ``/proc``): CPU seconds of a
server's worker processes, the memory of the server's processes, and how its keep-alive
connections are split over them (``serving.balance``).

CPU seconds per request move far less with the load of a shared machine than p99 does, so
the serving benchmarks report them beside the latencies.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")


def _children(parent: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        text = (task / "children").read_text().split()
        children.extend(int(pid) for pid in text)
    return children


def worker_pids(parent: int) -> list[int]:
    """Pids of ``parent``'s worker processes (uvicorn's spawned workers; ``[parent]`` when it
    serves alone)."""
    workers = [pid for pid in _children(parent) if b"spawn_main" in _cmdline(pid)]
    return workers or [parent]


def composer_pids(parent: int) -> list[int]:
    """Pid of the delta composer of ``parent``'s workers (``serving.shared_state``), if any."""
    return [pid for pid in _children(parent) if b"serving.shared_state" in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (all their threads)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS


def memory_mb(parent: int) -> dict[str, Any]:
    """The memory of ``parent`` and of every process under it: per process its role
    (``server``, ``worker``, ``composer`` or ``other``), resident set (RSS) and proportional set
    (PSS: each shared page divided among the processes that map it), in MB, and the total PSS:
    what the server holds, a version mapped by every worker counted once (RSS would count it
    per worker)."""
    rows = []
    tree = [parent, *_descendants(parent)]
    role = {pid: "other" for pid in tree} | {parent: "server"}
    if len(tree) > 1:
        role |= {pid: "worker" for pid in worker_pids(parent) if pid != parent}
        role |= {pid: "composer" for pid in composer_pids(parent)}
    for pid in tree:
        sizes = _rollup(pid)
        if sizes:
            rows.append({"pid": pid, "role": role[pid], **sizes})
    return {"pss_total": round(sum(r["pss"] for r in rows), 1),
            "rss_max": max((r["rss"] for r in rows), default=0.0), "processes": rows}


def _descendants(parent: int) -> list[int]:
    try:
        children = _children(parent)
    except OSError:  # gone meanwhile
        return []
    out = []
    for child in children:
        out.extend([child, *_descendants(child)])
    return out


def _rollup(pid: int) -> dict[str, float]:
    """``{"rss", "pss"}`` in MB from ``/proc/PID/smaps_rollup`` ({} if unreadable)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    kb = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            kb[key.lower()] = round(int(rest.split()[0]) / 1024, 1)
    return kb


def connections(port: int, server_pid: int) -> dict[int, int]:
    """Established connections to local ``port`` per worker of ``server_pid`` (the count
    the workers themselves balance by: ``serving.balance``)."""
    from serving.balance import connections_by_pid

    return connections_by_pid(port, worker_pids(server_pid))
