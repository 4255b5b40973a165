"""The one place a cluster trainer is built: :func:`cluster_trainer`.

It starts (or, with a fixed layout, connects to) the parameter servers and workers that
``settings.trainer`` describes, connects this process as the chief and yields a
:class:`model.cluster.trainer.ClusterTrainer`; servers it started stop when the context ends.
``streamrec train --ps N --workers M`` uses it with its metrics; :func:`local_trainer` (for
``streamrec evaluate --ps``, tests and benchmarks) with fresh servers on free local ports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from model.cluster.service import cluster_servers

log = logging.getLogger(__name__)


@contextmanager
def cluster_trainer(
    settings: Any, config: Any, options: Any, *, tag: str = "", log_dir: Path | None = None,
    metrics: Any = None,
) -> Iterator[Any]:
    """A ClusterTrainer of ``config`` / ``options`` on the cluster of ``settings.trainer`` (its
    ``ps``, ``workers``, layout and ``wire_dtype``); with ``metrics`` (the trainer's
    :class:`model.trainer.metrics.TrainerMetrics`) its per-role figures are sampled into that
    registry every ``cluster_metrics_every_s`` while the context is open."""
    from model.cluster.coordinator import connect
    from model.cluster.metrics import ClusterMetrics, ClusterSampler
    from model.cluster.options import ClusterOptions, check_supported
    from model.cluster.trainer import ClusterTrainer

    check_supported(config, options)  # before any process starts
    t = settings.trainer
    with cluster_servers(t, log_dir, settings.stack.ready_timeout_s) as layout:
        log.info("trainer cluster: %d PS, %d workers, chief at %s", t.ps, t.workers, layout.chief)
        per_role = None if metrics is None else ClusterMetrics(metrics.registry, layout)
        trainer = ClusterTrainer(config, options, connect(layout),
                                 ClusterOptions(wire_dtype=t.wire_dtype), tag, metrics=per_role)
        sampler = None
        if per_role is not None:
            sampler = ClusterSampler(lambda: trainer.snapshot(time.time), per_role,
                                     t.cluster_metrics_every_s)
            sampler.start()
        try:
            yield trainer
        finally:
            if sampler is not None:
                sampler.stop()  # before the servers stop
        # no step in flight when the servers stop (TF's coordinator retries a failed one)
        trainer.conn.coordinator.join()


@contextmanager
def local_trainer(
    settings: Any, ps: int, workers: int, config: Any, options: Any, *, wire_dtype: str,
    tag: str = "", log_dir: Path | None = None,
) -> Iterator[Any]:
    """:func:`cluster_trainer` on ``ps`` + ``workers`` fresh servers on free local ports (a
    fixed layout of the settings is ignored)."""
    local = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={
        "ps": ps, "workers": workers, "cluster_spec": None, "cluster_port": 0,
        "wire_dtype": wire_dtype})})
    with cluster_trainer(local, config, options, tag=tag, log_dir=log_dir) as trainer:
        yield trainer
