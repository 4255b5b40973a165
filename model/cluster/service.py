"""The trainer service on a cluster: where the layout comes from, the servers, the chief.

* ``trainer.cluster_spec`` (JSON) or ``trainer.cluster_port`` (consecutive ports): the PS
  and worker servers run as processes of their own (``streamrec train --role ps|worker``:
  components of ``streamrec up``, services of docker-compose); the chief waits until they
  listen.
* neither: the chief picks free ports and starts the servers as its children.

Either way a watchdog process (``model.cluster.liveness``) kills the chief when a server is
lost; its restart (by the supervisor) resumes from the last checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from model.cluster import liveness
from model.cluster.server import launch, listening
from model.cluster.spec import ClusterLayout
from streamrec.settings import TrainerSettings

log = logging.getLogger(__name__)


def configured_layout(tcfg: TrainerSettings) -> ClusterLayout | None:
    """The fixed layout of the settings, or None when the chief picks free ports."""
    if tcfg.cluster_spec:
        return ClusterLayout.from_json(tcfg.cluster_spec)
    if tcfg.cluster_port:
        return ClusterLayout.from_base(tcfg.metrics_host, tcfg.cluster_port, tcfg.ps, tcfg.workers)
    return None


def wait_listening(layout: ClusterLayout, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = [layout.address(job, i) for job, i in layout.roles()]
    while pending:
        pending = [a for a in pending if not listening(a)]
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"cluster servers not listening after {timeout_s}s: {pending}")
        if pending:
            time.sleep(0.2)


@contextmanager
def cluster_servers(
    tcfg: TrainerSettings, log_dir: Path | None = None, timeout_s: float = 120.0
) -> Iterator[ClusterLayout]:
    """The cluster's layout with its servers listening (started here if not configured)."""
    layout = configured_layout(tcfg)
    cluster = None
    if layout is not None:
        wait_listening(layout, timeout_s)
    else:
        layout = ClusterLayout.local(tcfg.ps, tcfg.workers, tcfg.metrics_host)
        cluster = launch(layout, log_dir=log_dir, timeout_s=timeout_s)
    watchdog = liveness.start(layout)
    try:
        yield layout
    finally:
        watchdog.kill()  # first: the servers stop next
        watchdog.wait()
        if cluster is not None:
            cluster.stop()
