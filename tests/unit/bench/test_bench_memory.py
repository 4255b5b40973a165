"""The serving benchmarks' memory figure: a process tree's RSS and PSS from ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.workers import memory_mb

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(),
                                reason="needs Linux /proc/PID/smaps_rollup")


def test_the_tree_holds_each_process_and_counts_what_it_allocated() -> None:
    """A child that holds 200 MB of its own shows in the tree with at least that much, and
    the total PSS is the sum of the processes'."""
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, numpy as np; a = np.ones(200 * 2**20 // 8); print(1, flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "1"
        tree = memory_mb(os.getpid())
        rows = {r["pid"]: r for r in tree["processes"]}
        assert os.getpid() in rows and child.pid in rows
        assert rows[child.pid]["rss"] >= 200 and rows[child.pid]["pss"] >= 190
        assert tree["rss_max"] == max(r["rss"] for r in rows.values())
        assert tree["pss_total"] == pytest.approx(sum(r["pss"] for r in rows.values()), abs=0.1)
        assert rows[os.getpid()]["role"] == "server" and rows[child.pid]["role"] == "other"
    finally:
        child.communicate("", timeout=10)


def test_a_process_gone_is_an_empty_tree() -> None:
    """A server that exited before the figure was read: no rows, no error."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=30)
    assert memory_mb(done.pid) == {"pss_total": 0.0, "rss_max": 0.0, "processes": []}
