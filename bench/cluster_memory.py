"""The memory wall: millions of rows split over the parameter servers, RSS per role.

    python -m bench.cluster_memory [--rows 4000000] [--max-user-rows 0] [--batch 8192] [--json F]

Starts 2 PS + 2 workers, makes this process the chief and trains batches whose every sample
has a user never seen before, recording rows per shard and the RSS of every process; at the
end it times the consistent cut, a checkpoint and an export's read of the user rows. Details
and the JSON keys: docs/internals.md; today's figure: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ITEMS = 20_000


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process used so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.cluster_memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4_000_000, help="distinct users to train")
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--max-user-rows", type=int, default=0, help="eviction cap (0 = no eviction)")
    p.add_argument("--evict-every", type=int, default=50, help="steps between evictions")
    p.add_argument("--report-every", type=int, default=500_000)
    p.add_argument("--wire-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    from model.cluster.coordinator import connect
    from model.cluster.options import ClusterOptions
    from model.cluster.server import launch
    from model.cluster.spec import ClusterLayout
    from model.cluster.trainer import ClusterTrainer
    from model.towers.two_tower import ModelConfig
    from model.trainer.options import TrainOptions
    from model.trainer.samples import Batch

    result: dict[str, Any] = {"load_avg_start": os.getloadavg()[0], "rows": args.rows,
                              "batch": args.batch, "max_user_rows": args.max_user_rows,
                              "wire_dtype": args.wire_dtype}
    layout = ClusterLayout.local(2, 2)
    cluster = launch(layout, timeout_s=180.0)
    try:
        pids = {"chief": os.getpid()}
        pids.update({f"{job}{i}": proc.pid for (job, i), proc in cluster.procs.items()})
        config = ModelConfig()
        cap = args.max_user_rows
        trainer = ClusterTrainer(
            config,
            TrainOptions(batch_size=args.batch, eval_rows=0, sampled_negatives=0,
                         evict_every_steps=args.evict_every if cap else 0,
                         max_user_rows=cap or 2_000_000_000),
            connect(layout), ClusterOptions(args.wire_dtype), tag="mem",
        )
        rng = np.random.default_rng(1)
        hist = config.window
        points: list[dict[str, Any]] = []

        def point(users: int) -> dict[str, Any]:
            trainer.conn.coordinator.join()  # the users scheduled so far are trained
            seconds = time.perf_counter() - started
            out = {"users_trained": users, "seconds": round(seconds, 1),
                   "users_per_s": round(users / seconds, 1),
                   **trainer.table_sizes(),
                   "user_accumulators": int(trainer.users_ps.accumulator.size())
                   if trainer.users_ps.accumulator is not None else 0,
                   "rss_mb": {role: round(rss_mb(pid), 1) for role, pid in pids.items()},
                   "cpu_s": {role: round(cpu_s(pid), 1) for role, pid in pids.items()}}
            print(json.dumps(out), flush=True)
            return out

        started, users, next_report = time.perf_counter(), 0, args.report_every
        while users < args.rows:
            n = min(args.batch, args.rows - users)
            batch = Batch(
                user_keys=np.arange(users + 1, users + n + 1, dtype=np.int64),
                item_keys=rng.integers(1, ITEMS + 1, n).astype(np.int64),
                history=rng.integers(1, ITEMS + 1, (n, hist)).astype(np.int64),
                weights=np.ones(n, np.float32),
            )
            trainer.train_step(batch, covisit=False)
            users += n
            if users >= next_report or users >= args.rows:
                points.append(point(users))
                next_report += args.report_every
        result["points"] = points
        result["final"] = points[-1]
        result["evicted_rows"] = trainer.evicted_rows
        t0 = time.perf_counter()
        trainer.sync()  # the consistent cut: every step joined, the rows stay on the PS
        result["after_cut"] = {"seconds": round(time.perf_counter() - t0, 1),
                               "chief_rss_mb": round(rss_mb(os.getpid()), 1),
                               # rows in the chief's own user table (its default row only)
                               "chief_user_rows": int(trainer.model.users.params.size())}
        with tempfile.TemporaryDirectory(prefix="bench-cluster-memory-") as tmp:
            from model.towers.tf_env import tf

            t0 = time.perf_counter()
            tf.train.Checkpoint(**trainer.trackables()).save(str(Path(tmp) / "ckpt"))
            files = {f.name: f.stat().st_size for f in Path(tmp).iterdir() if ".data-" in f.name}
            result["checkpoint"] = {
                "seconds": round(time.perf_counter() - t0, 1),
                "chief_rss_mb": round(rss_mb(os.getpid()), 1),
                "rss_mb": {role: round(rss_mb(pid), 1) for role, pid in pids.items()},
                "data_files_mb": {k: round(v / 2**20, 1) for k, v in sorted(files.items())},
            }
        t0 = time.perf_counter()
        keys, rows = trainer.known_rows(trainer.model.users)  # what an export reads
        result["export_read"] = {"seconds": round(time.perf_counter() - t0, 1),
                                 "chief_rss_mb": round(rss_mb(os.getpid()), 1),
                                 "rows_mb": round(rows.nbytes / 2**20, 1),
                                 "user_keys": int(keys.size), "user_key_min": int(keys.min()),
                                 "user_key_max": int(keys.max())}
        del rows
        for name in ("after_cut", "checkpoint", "export_read"):
            print(json.dumps({name: result[name]}), flush=True)
    finally:
        cluster.stop()
    result["load_avg_end"] = os.getloadavg()[0]
    text = json.dumps(result, indent=2)
    sys.stdout.write(text + "\n")
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
