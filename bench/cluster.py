"""Trainer cluster benchmark: 2 PS + 2 workers against one process, on the same machine.

    streamrec bench cluster [--json FILE] [--rounds 2] [--step-seconds 8] [--e2e-samples 150000]

Every variant (one process; the cluster with float32 or bfloat16 on the wire) runs in a child
process of its own, in alternating order each round, so they see the same host. Reported:
the train step's steps/s, end-to-end examples/s from Kafka, bytes on the wire and CPU per
role; ratios to one process cancel the host's speed out. The variants, the phases and the
JSON keys: docs/internals.md; today's figure: docs/benchmarks.md#trainer-cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.train import time_fits

VARIANTS = ("single", "cluster", "cluster_bf16")
BATCH = 512


def _ss_bytes(ports: set[int]) -> int:
    """Bytes sent + received on established TCP connections whose peer port is in ``ports``."""
    out = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    total, peer = 0, None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            fields = line.split()
            peer = int(fields[-1].rsplit(":", 1)[1]) if len(fields) >= 4 else None
            continue
        if peer in ports:
            for key in ("bytes_sent", "bytes_received"):
                m = re.search(rf"{key}:(\d+)", line)
                total += int(m.group(1)) if m else 0
    return total


def _cpu(clusters: list[Any]) -> dict[str, float]:
    """CPU seconds used so far by this process (the chief) and each server of ``clusters``."""
    from bench.cluster_memory import cpu_s

    out = {"chief": cpu_s(os.getpid())}
    for cluster in clusters:
        out.update({f"{job}{i}": cpu_s(p.pid) for (job, i), p in cluster.procs.items()})
    return out


def _reaped_cpu_s() -> float:
    """CPU seconds of this process's children that have exited and been waited for."""
    t = os.times()
    return t.children_user + t.children_system


def _distinct_rows(batch: Any, window: int) -> int:
    """Rows a step reads and writes: its distinct users, plus its distinct targets and
    history items (negatives aside)."""
    items = np.concatenate([batch.item_keys, batch.history[:, :window].ravel()])
    return int(np.unique(batch.user_keys).size + np.unique(items[items != 0]).size)


def _settings(topic: str, root: Path) -> Any:
    from streamrec.settings import load_settings

    base = load_settings()
    uid = uuid.uuid4().hex[:8]
    return base.model_copy(update={
        "kafka": base.kafka.model_copy(update={"samples_topic": topic,
                                               "dlq_topic": f"{topic}.dlq"}),
        "trainer": base.trainer.model_copy(update={
            "registry_dir": root / uid / "models", "checkpoint_dir": root / uid / "ckpt",
            "group_id": f"bench-cluster-{uid}", "export_every_samples": 10_000_000,
            "export_every_s": 3600.0,
        }),
    })


def run_variant(variant: str, topic: str, e2e_samples: int, seconds: float, warm: int,
                fused_loss: bool = True) -> dict[str, Any]:
    """One variant's figures (runs in its own process); ``fused_loss``:
    ``TrainOptions.fused_loss`` of its trainers."""
    from bench.train import _batches
    from model.towers.two_tower import ModelConfig
    from model.trainer.loop_options import LoopOptions
    from model.trainer.service import TrainerService
    from model.trainer.trainer import Trainer, TrainOptions
    from streamrec.settings import with_trainer

    config = ModelConfig()

    def trainer(options: TrainOptions, tag: str) -> Any:
        if variant == "single":
            return Trainer(config, options, tag=tag)
        from model.cluster.options import ClusterOptions
        from model.cluster.trainer import ClusterTrainer

        wire = "bfloat16" if variant == "cluster_bf16" else "float32"
        return ClusterTrainer(config, options, conn, ClusterOptions(wire), tag=tag)

    ps_ports: set[int] = set()
    all_ports: set[int] = set()
    stack: list[Any] = []
    if variant != "single":
        from model.cluster.coordinator import connect
        from model.cluster.server import launch
        from model.cluster.spec import ClusterLayout

        layout = ClusterLayout.local(2, 2)
        stack.append(launch(layout, timeout_s=180.0))
        conn = connect(layout)
        ps_ports = {int(a.rsplit(":", 1)[1]) for a in layout.ps}
        all_ports = ps_ports | {int(a.rsplit(":", 1)[1]) for a in layout.workers}
    try:
        out: dict[str, Any] = {"variant": variant}
        t = trainer(TrainOptions(batch_size=BATCH, eval_rows=0, evict_every_steps=0,
                                  fused_loss=fused_loss), "step")
        n = max(12, int(seconds * 40_000 / BATCH) + 4)
        batches = _batches(n, BATCH, hist=config.window, warm=warm)
        for b in batches[:4]:
            t.train_step(b, covisit=False)
        t.sync()
        before, before_all = _ss_bytes(ps_ports), _ss_bytes(all_ports)
        cpu_before = _cpu(stack)
        rows_read = 0
        started, steps = time.perf_counter(), 0
        for b in batches[4:]:
            t.train_step(b, covisit=False)
            steps += 1
            rows_read += _distinct_rows(b, config.window)
            if time.perf_counter() - started > seconds:
                break
        t.sync()
        elapsed = time.perf_counter() - started
        out["step_steps_per_s"] = steps / elapsed
        out["step_examples_per_s"] = steps * BATCH / elapsed
        used = {role: c - cpu_before[role] for role, c in _cpu(stack).items()}
        out["cpu_ms_per_step"] = {role: round(1e3 * c / steps, 2) for role, c in used.items()}
        out["rows_per_step"] = rows_read / steps
        if ps_ports:
            wire, wire_all = _ss_bytes(ps_ports) - before, _ss_bytes(all_ports) - before_all
            out["wire_bytes_per_step"] = wire / steps
            out["wire_bytes_per_example"] = wire / (steps * BATCH)
            out["wire_all_bytes_per_step"] = wire_all / steps
            ps_cpu = sum(c for role, c in used.items() if role.startswith("ps"))
            out["ps_cpu_us_per_row"] = 1e6 * ps_cpu / rows_read
        root = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
        try:
            settings = _settings(topic, root)
            service = TrainerService(
                settings, trainer(TrainOptions(batch_size=BATCH, evict_every_steps=0,
                                          spare_epochs=1, fused_loss=fused_loss), "e2e"),
                LoopOptions.from_settings(with_trainer(
                    settings, export_every_s=3600.0, export_every_samples=10_000_000,
                    delta_every_s=0.0, delta_catchup_every_s=0.0, delta_history_lag_s=0.0),
                    max_samples=e2e_samples),
                clock=lambda: datetime.now(UTC),
            )
            # trace the step and the evaluation before the clock starts, as bench train does
            for b in _batches(2, BATCH, seed=99, hist=config.window):
                service.trainer.fit_batch(b)
            service.trainer.wait_evaluation()
            service.trainer.sync()
            fits = time_fits(service.trainer)
            cpu_before = _cpu(stack)
            reaped = _reaped_cpu_s()
            started = time.perf_counter()
            state = service.run()
            elapsed = time.perf_counter() - started
            assert state.samples_trained == e2e_samples, state
            out["e2e_examples_per_s"] = e2e_samples / elapsed
            out["e2e_startup_s"] = fits[0] - started
            out["e2e_finish_s"] = started + elapsed - fits[-1]
            out["e2e_train_examples_per_s"] = e2e_samples / (fits[-1] - fits[0])
            used = {role: c - cpu_before[role] for role, c in _cpu(stack).items()}
            used["fetch"] = _reaped_cpu_s() - reaped  # the fetch process, reaped by run()
            out["e2e_cpu_us_per_example"] = {
                role: round(1e6 * c / e2e_samples, 1) for role, c in used.items()
            }
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return out
    finally:
        for cluster in stack:
            cluster.stop()


def _produce(n: int, warm: int) -> str:
    from model.evaluation.synthetic import SyntheticConfig, SyntheticStream
    from model.trainer.samples import encode_sample
    from stream.kafka_client import ensure_topics, make_producer
    from streamrec.settings import load_settings

    kafka = load_settings().kafka
    topic = f"benchcluster{uuid.uuid4().hex[:8]}.samples"
    ensure_topics(kafka, [topic, f"{topic}.dlq"])
    stream = SyntheticStream(SyntheticConfig(users=10_000, items=20_000, clusters=50, seed=3))
    for _ in range(warm):
        stream.next()
    producer = make_producer(kafka, linger_ms=50, batch_size=512 * 1024)
    for s in stream.take(n):
        producer.send(topic, key=s.user_id.encode(), value=encode_sample(s))
    producer.flush(timeout=300)
    producer.close()
    return topic


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamrec bench cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--step-seconds", type=float, default=8.0)
    p.add_argument("--e2e-samples", type=int, default=150_000)
    p.add_argument("--warm-samples", type=int, default=50_000)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--no-fused-loss", action="store_true",
                   help="every trainer's loss op by op (streamrec train --no-fused-loss)")
    p.add_argument("--run", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--topic", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run:  # a child: one variant
        fig = run_variant(args.run, args.topic, args.e2e_samples, args.step_seconds,
                          args.warm_samples, fused_loss=not args.no_fused_loss)
        Path(args.json).write_text(json.dumps(fig))
        return 0
    variants = args.variants.split(",")
    result: dict[str, Any] = {"load_avg_start": os.getloadavg()[0], "batch": BATCH,
                              "fused_loss": not args.no_fused_loss}
    topic = _produce(args.e2e_samples, args.warm_samples)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for v in variants if r % 2 == 0 else variants[::-1]:
                out = Path(tmp) / f"{v}-{r}.json"
                subprocess.run(
                    [sys.executable, "-m", "bench.cluster", "--run", v, "--topic", topic,
                     "--json", str(out), "--e2e-samples", str(args.e2e_samples),
                     "--step-seconds", str(args.step_seconds),
                     "--warm-samples", str(args.warm_samples)]
                    + (["--no-fused-loss"] if args.no_fused_loss else []),
                    check=True, timeout=1800,
                )
                fig = json.loads(out.read_text())
                runs[v].append(fig)
                print(f"{v} round {r}: " + ", ".join(
                    f"{k} {val:,.0f}" if abs(val) >= 100 else f"{k} {val:.2f}"
                    for k, val in fig.items() if isinstance(val, float)),
                    flush=True)
    by: dict[str, Any] = {}
    for v, figs in runs.items():
        agg: dict[str, Any] = {}
        for key in figs[0]:
            if key == "variant":
                continue
            vals = [f[key] for f in figs]
            if isinstance(vals[0], dict):  # per role: the median of each
                agg[key] = {r: round(float(np.median([x[r] for x in vals])), 2) for r in vals[0]}
                continue
            agg[key] = round(float(np.median(vals)), 1)
            agg[f"{key}_runs"] = [round(x, 1) for x in vals]
        by[v] = agg
    result["by_variant"] = by
    if "single" in by and "cluster" in by:
        result["cluster_vs_single_step"] = round(
            by["cluster"]["step_steps_per_s"] / by["single"]["step_steps_per_s"], 3)
    if "single" in by:
        result["e2e_vs_single"] = {
            v: round(by[v]["e2e_examples_per_s"] / by["single"]["e2e_examples_per_s"], 3)
            for v in by if v != "single"}
    if "cluster" in by and "cluster_bf16" in by:
        result["bf16_wire_ratio"] = round(
            by["cluster_bf16"]["wire_bytes_per_step"] / by["cluster"]["wire_bytes_per_step"], 3)
    result["load_avg_end"] = os.getloadavg()[0]
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
