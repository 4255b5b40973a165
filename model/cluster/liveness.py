"""The chief's watchdog, a process of its own: ``python -m model.cluster.liveness``.

It polls the port of every server of the cluster and, when one is gone for ``--grace-s``,
kills the chief with SIGKILL: a lost parameter server takes its shard with it, and a lost
worker may leave a step half-applied, so the state since the last cut is not trusted. The
chief's supervised restart resumes from the last checkpoint. A separate process, because
while TensorFlow's coordinator tries to reach a lost worker it can hold the chief's GIL
for good (a thread of the chief would never run). It dies with the chief.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time

from model.cluster.server import die_with_parent, listening
from model.cluster.spec import ClusterLayout

log = logging.getLogger(__name__)


def watch(pid: int, addresses: list[str], grace_s: float, every_s: float = 0.5) -> str:
    """Block until a server is gone for ``grace_s`` (returns it) or ``pid`` exits ("")."""
    down_since: dict[str, float] = {}
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return ""
        now = time.monotonic()
        for address in addresses:
            if listening(address):
                down_since.pop(address, None)
            elif now - down_since.setdefault(address, now) >= grace_s:
                return address
        time.sleep(every_s)


def start(layout: ClusterLayout, grace_s: float = 3.0) -> subprocess.Popen[bytes]:
    """Start the watchdog of this process (the chief) over ``layout``'s servers."""
    addresses = ",".join(layout.address(job, i) for job, i in layout.roles())
    return subprocess.Popen(
        [sys.executable, "-m", "model.cluster.liveness", "--pid", str(os.getpid()),
         "--addresses", addresses, "--grace-s", str(grace_s)],
        preexec_fn=die_with_parent,
    )


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Kill the chief when a cluster server is lost.")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--addresses", required=True)
    p.add_argument("--grace-s", type=float, default=3.0)
    ns = p.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    lost = watch(ns.pid, ns.addresses.split(","), ns.grace_s)
    if lost:
        log.critical("cluster server %s is gone: killing the chief (pid %d) to resume from "
                     "the last checkpoint", lost, ns.pid)
        os.kill(ns.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
