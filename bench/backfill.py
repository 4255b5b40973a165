"""A backfill end to end: a simulated log -> replay -> feature job -> trainer -> served version.

Starts a private stack on free ports (Kafka, Redis with AOF, a Flink cluster, the feature job,
the trainer, serving; the local stack's default sizes and cadences), replays ``--events``
simulated events at full speed and reports each stage's wall time, rate and CPU seconds. Then
it replays the same log again and checks that nothing changed (the replay ledger's promise).
How it measures and what it reports: docs/internals.md; today's figure: docs/benchmarks.md.

    python bench/backfill.py --events 1000000 --json bench/results/backfill.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import service_env  # noqa: E402
from streamrec.settings import Settings  # noqa: E402

COMPONENTS = ["kafka", "redis", "flink-jobmanager", "flink-taskmanager", "features", "trainer",
              "serving"]


def write_log(path: Path, events: int, users: int, items: int) -> float:
    from stream.simulate import LOG_START_MS, simulated_log, write_ndjson

    started = time.monotonic()
    tmp = path.with_suffix(".tmp")
    write_ndjson(tmp, simulated_log("rating", events, seed=1, users=users, items=items,
                                    start_ms=LOG_START_MS))
    tmp.rename(path)
    return time.monotonic() - started


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes of process group ``pgid``."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def group_threads_cpu_s(pgid: int) -> dict[str, float]:
    """CPU seconds of the threads of process group ``pgid``'s live processes by thread name,
    digits folded (``C2 CompilerThread0`` and ``1`` add up as ``CN CompilerThreadN``; the
    kernel keeps 15 characters of a name: Flink's task threads read ``user-features -``)."""
    import re

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            tasks = list((stat.parent / "task").glob("[0-9]*/stat"))
        except OSError:
            continue
        for task in tasks:
            try:
                text = task.read_text()
            except OSError:
                continue
            name = re.sub(r"\d+", "N", text[text.index("(") + 1 : text.rindex(")")])
            fields = text.rsplit(")", 1)[1].split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def taskmanager_threads_cpu_s(stack: Any) -> dict[str, float]:
    """:func:`group_threads_cpu_s` of the TaskManager (its JIT compiler, operator and client
    threads; the Python stages run on their operators' task threads)."""
    from deploy.process import read_pid

    record = read_pid(stack.pid_path("flink-taskmanager"))
    return group_threads_cpu_s(record.pid) if record is not None else {}


def components_cpu_s(stack: Any, names: Sequence[str]) -> dict[str, float]:
    """CPU seconds so far of each running component's process group (the TaskManager's
    holds the feature job's Python operators)."""
    from deploy.process import read_pid

    out = {}
    for name in names:
        record = read_pid(stack.pid_path(name))
        if record is not None:
            out[name] = group_cpu_s(record.pid)
    return out


def children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def defaults_of_the_stack(private: Settings) -> Settings:
    """``private`` (a throwaway stack's ports, topics and folders) with the sizes and
    cadences of the local stack's defaults where the chaos tests' throwaway settings differ
    (faster checkpoints and versions, smaller batches and JVMs): the backfill is measured
    as ``streamrec up`` would run it."""
    d = Settings()
    return private.model_copy(update={
        "kafka": private.kafka.model_copy(update={"heap": d.kafka.heap}),
        "flink": private.flink.model_copy(update={
            k: getattr(d.flink, k) for k in ("checkpoint_interval_ms", "jobmanager_memory",
                                             "taskmanager_memory", "taskmanager_slots")}),
        "trainer": private.trainer.model_copy(update={
            k: getattr(d.trainer, k) for k in ("export_every_s", "batch_size")}),
    })


def replay(settings: Settings, log: Path, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "deploy.cli", "replay", str(log), "--speed", "max",
           "--follow", "--no-progress", "--json", str(out)]
    with service_env(settings):
        subprocess.run(cmd, cwd=REPO, env=dict(os.environ), check=True, timeout=7200)
    return dict(json.loads(out.read_text()))


def features_digest(settings: Settings, users: list[str]) -> str:
    import hashlib

    from feature_store.store import open_store

    store = open_store(settings)
    try:
        h = hashlib.blake2b(digest_size=16)
        for start in range(0, len(users), 5_000):
            for f in store.read_users(users[start:start + 5_000]):
                h.update(repr(f).encode())
        return h.hexdigest()
    finally:
        store.close()


def served_items(settings: Settings) -> Any:
    import httpx

    return httpx.get(f"http://127.0.0.1:{settings.serving.port}/model", timeout=5).json().get("items")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench backfill", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--users", type=int, default=20_000)
    p.add_argument("--items", type=int, default=10_000)
    p.add_argument("--log", type=Path, default=None, help="the simulated log (cached)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from bench.harness import private_settings, private_stack

    log = args.log or Path(tempfile.gettempdir()) / f"streamrec-sim-{args.events}.ndjson"
    simulate_s = None if log.exists() else round(write_log(log, args.events, args.users,
                                                           args.items), 1)
    root = Path(tempfile.mkdtemp(prefix="bench-backfill-"))
    out: dict[str, Any] = {"events": args.events, "log": str(log), "simulate_s": simulate_s,
                           "load_avg_1m_start": round(os.getloadavg()[0], 2)}
    try:
        s = defaults_of_the_stack(private_settings(root, flink=True, appendonly=True))
        started = time.monotonic()
        with private_stack(s, COMPONENTS) as chaos:
            out["stack_start_s"] = round(time.monotonic() - started, 1)
            cpu_before, replay_before = components_cpu_s(chaos.stack, COMPONENTS), children_cpu_s()
            tm_before = taskmanager_threads_cpu_s(chaos.stack)
            first = replay(s, log, root / "first.json")
            cpu_after = components_cpu_s(chaos.stack, COMPONENTS)
            tm_after = taskmanager_threads_cpu_s(chaos.stack)
            tm_threads = {name: round(cpu - tm_before.get(name, 0.0), 1)
                          for name, cpu in tm_after.items()}
            out["taskmanager_threads_cpu_s"] = dict(sorted(
                ((k, v) for k, v in tm_threads.items() if v >= 0.1), key=lambda kv: -kv[1]))
            cpu = {name: round(cpu_after[name] - cpu_before.get(name, 0.0), 1)
                   for name in cpu_after}
            cpu["replay (process)"] = round(children_cpu_s() - replay_before, 1)
            out["cpu_s_first_replay"] = cpu
            # with every stage's CPU spread over every core, the wall time could not be less
            out["cpu_bound_s"] = round(sum(cpu.values()) / (os.cpu_count() or 1), 1)
            b = first["backfill"]
            stages = b["seconds_by_stage"]
            print(f"first replay: {b}", flush=True)
            out["first"] = b
            out["rates"] = {
                "replay_events_per_s": round(first["sent"] / max(stages["replay"], 1e-9)),
                "features_caught_up_events_per_s": round(
                    first["sent"] / max(stages["replay"] + stages["features"], 1e-9)),
                "trainer_caught_up_samples_per_s": round(b["trained"] / max(
                    stages["replay"] + stages["features"] + stages["trainer"], 1e-9)),
                "end_to_end_events_per_s": round(first["sent"] / max(b["seconds_total"], 1e-9)),
            }
            users = [f"sim-u{i}" for i in range(args.users)]
            before = {"features": features_digest(s, users), "items": served_items(s)}
            second = replay(s, log, root / "second.json")
            b2 = second["backfill"]
            after = {"features": features_digest(s, users), "items": served_items(s)}
            out["second"] = b2
            out["second_replay_identical"] = {
                "events_sent": b2["events_sent"],
                "already_replayed": b2["events_already_replayed"],
                "trained": b2["trained"],
                "trainer_digest_equal": b2["trainer_digest"] == b["trainer_digest"],
                "features_equal": after["features"] == before["features"],
                "served_item_rows_equal": after["items"] == before["items"],
                "served_item_rows": after["items"],
            }
            print(f"second replay: {out['second_replay_identical']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
