"""A cluster trainer on servers started for this process (``streamrec evaluate --ps``).

:func:`local_trainer` starts the parameter servers and workers on free local ports (as
``streamrec train --ps N --workers M`` does without a fixed layout), connects this process
as the chief and returns a :class:`model.cluster.trainer.ClusterTrainer`; the servers stop
when the context ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from model.cluster.service import cluster_servers


@contextmanager
def local_trainer(
    settings: Any, ps: int, workers: int, config: Any, options: Any, *, wire_dtype: str,
    tag: str = "", log_dir: Path | None = None,
) -> Iterator[Any]:
    """A ClusterTrainer of ``config`` / ``options`` on ``ps`` + ``workers`` fresh servers."""
    from model.cluster.coordinator import connect
    from model.cluster.options import ClusterOptions, check_supported
    from model.cluster.trainer import ClusterTrainer

    check_supported(config, options)  # before any process starts
    tcfg = settings.trainer.model_copy(
        update={"ps": ps, "workers": workers, "cluster_spec": None, "cluster_port": 0}
    )
    with cluster_servers(tcfg, log_dir, settings.stack.ready_timeout_s) as layout:
        trainer = ClusterTrainer(config, options, connect(layout), ClusterOptions(wire_dtype), tag)
        yield trainer
        # no step in flight when the servers stop (TF's coordinator retries a failed one)
        trainer.conn.coordinator.join()
