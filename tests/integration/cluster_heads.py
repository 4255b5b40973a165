"""Child of ``test_cluster.py`` (a pytest process must not join a cluster): the chief's user
tower against the worker step's own head vectors, on 2 PS + 2 workers of its own.

``python -m tests.integration.cluster_heads --json F``: trains a few batches of the
synthetic stream, joins the steps (``sync``), then, for a batch whose users and history
items were all trained before, computes ``ClusterTrainer.tower_users`` on the chief and
trains the batch: its step computes the same rows' user vectors on a worker, from the
rows the parameter servers hold, before its update. Writes the largest difference.

Then the passes over one batch (``train_step(count=False)``: evaluate's ``--epochs``, the
live trainer's spare epochs): for each step it schedules, whether every step scheduled
before it had finished (``ClusterCoordinator.done``) — a further pass must read the state
its previous pass left, as in one process; a new batch's step need not wait.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)

    from model.cluster.coordinator import connect
    from model.cluster.options import ClusterOptions
    from model.cluster.server import launch
    from model.cluster.spec import ClusterLayout
    from model.cluster.trainer import ClusterTrainer
    from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
    from model.towers.two_tower import ModelConfig
    from model.trainer.options import TrainOptions
    from model.trainer.samples import KeyCache, to_batch

    config = ModelConfig()
    stream = SyntheticStream(SyntheticConfig(users=300, items=500, clusters=10, seed=5))
    keys = KeyCache()
    batches = [to_batch(stream.take(256), config.window, keys) for _ in range(6)]
    layout = ClusterLayout.local(2, 2)
    cluster = launch(layout, timeout_s=240.0)
    try:
        trainer = ClusterTrainer(
            config, TrainOptions(batch_size=256, eval_rows=32, eval_every=1, evict_every_steps=0),
            connect(layout), ClusterOptions("float32"),
        )
        for batch in batches:
            trainer.fit_batch(batch)
        trainer.wait_evaluation()
        trainer.sync()
        again = batches[0]  # its users and history items are on the shards by now
        head = again.rows(slice(0, 32))
        chief = trainer.tower_users(head.user_keys, head.history)
        trainer.fit_batch(again)
        fetch = trainer._head_vectors  # the step's own head (its fetch)
        assert callable(fetch)
        worker = fetch()
        trainer.wait_evaluation()

        coordinator = trainer.conn.coordinator
        schedule = coordinator.schedule
        idle_at_schedule: list[bool] = []

        def watched(fn: object, args: object = None, kwargs: object = None) -> object:
            idle_at_schedule.append(bool(coordinator.done()))
            return schedule(fn, args=args, kwargs=kwargs)

        trainer.sync()
        coordinator.schedule = watched  # this instance only
        try:
            for count in (True, False, False):
                trainer.train_step(batches[1], count=count, covisit=False)
        finally:
            del coordinator.schedule
        trainer.sync()
        Path(args.json).write_text(json.dumps({
            "rows": int(chief.shape[0]),
            "max_abs_diff": float(np.abs(chief - worker).max()),
            "max_abs": float(np.abs(worker).max()),
            "passes_idle_at_schedule": idle_at_schedule,
        }))
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
