"""A backfill interrupted by kill -9, then resumed: does it end where an uninterrupted one does?

For each fault of ``--faults`` (default: none, replay, flink-taskmanager, trainer, kafka) a
fresh private stack replays the same simulated log, the fault kills one process part-way,
``streamrec replay LOG --resume --follow`` finishes the backfill, and the run is compared with
the uninterrupted reference (features of every user, trained sample ids, served rows). The
faults and the comparison in detail: docs/internals.md.

    python bench/backfill_chaos.py --events 100000 --json bench/results/backfill_chaos.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
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

from bench.backfill import COMPONENTS, features_digest, served_items, write_log  # noqa: E402
from bench.harness import service_env, wait_until  # noqa: E402
from streamrec.settings import Settings  # noqa: E402

FAULTS = ["none", "replay", "kafka@send", "flink-taskmanager", "trainer", "kafka"]


def _replay_cmd(log: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "deploy.cli", "replay", str(log), "--speed", "max",
            "--no-progress", "--json", str(out), *extra]


def _events_in_topic(settings: Settings) -> int:
    from deploy.cli_backfill import _ends

    return sum(_ends(settings, settings.kafka.events_topic).values())


def _trained(settings: Settings) -> int:
    import httpx

    try:
        url = f"http://127.0.0.1:{settings.trainer.metrics_port}/health"
        return int(httpx.get(url, timeout=5.0).json().get("samples_trained", 0))
    except (httpx.HTTPError, ValueError):
        return 0


def run_one(fault: str, log: Path, users: int, reference_trained: int | None) -> dict[str, Any]:
    """One backfill with ``fault`` injected; the figures compared between runs."""
    from bench.harness import private_settings, private_stack

    root = Path(tempfile.mkdtemp(prefix=f"bench-chaos-{fault}-"))
    out: dict[str, Any] = {"fault": fault}
    try:
        s = private_settings(root, flink=True, appendonly=True)
        s = s.model_copy(update={"trainer": s.trainer.model_copy(
            update={"export_every_s": 15.0, "batch_size": 512})})
        with private_stack(s, COMPONENTS) as chaos, service_env(s):
            started = time.monotonic()
            env = dict(os.environ)
            if fault == "none":
                subprocess.run(_replay_cmd(log, root / "final.json", "--follow"), cwd=REPO,
                               env=env, check=True, timeout=7200)
            else:
                proc = subprocess.Popen(_replay_cmd(log, root / "first.json"), cwd=REPO, env=env,
                                        start_new_session=True)
                if fault == "replay":
                    total = sum(1 for _ in log.open("rb"))
                    wait_until(lambda: _events_in_topic(s) >= total // 3 or proc.poll() is not None,
                               600, "a third of the log in the events topic", interval_s=0.05)
                    killed_at = _events_in_topic(s)
                    if proc.poll() is not None:
                        raise RuntimeError("the replay ended before it could be killed: "
                                           "use a longer log (--events)")
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)
                    out["killed_at_events"] = killed_at
                else:
                    name, _, when = fault.partition("@")
                    if when == "send":
                        total = sum(1 for _ in log.open("rb"))
                        wait_until(lambda: _events_in_topic(s) >= total // 3, 600,
                                   "a third of the log in the events topic", interval_s=0.05)
                        out["killed_at_events"] = _events_in_topic(s)
                    else:
                        target = max((reference_trained or 3_000) // 3, 1)
                        wait_until(lambda: _trained(s) >= target, 1800,
                                   f"the trainer to train {target:,} samples", interval_s=0.2)
                        out["killed_at_trained"] = _trained(s)
                    chaos.kill_and_restart(name, down_s=2.0)
                    try:  # a replay still sending rides the outage out or fails; both resume
                        out["first_replay_rc"] = proc.wait(1800)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        out["first_replay_rc"] = "killed after 1800 s"
                subprocess.run(_replay_cmd(log, root / "final.json", "--resume", "--follow"),
                               cwd=REPO, env=env, check=True, timeout=7200)
            out["wall_s"] = round(time.monotonic() - started, 1)
            final = json.loads((root / "final.json").read_text())
            status = chaos_status(s)
            out.update({
                "events_sent_by_last_replay": final.get("sent"),
                "already_replayed_by_last_replay": final.get("already_replayed"),
                "trained": int(status.get("samples_trained", 0)),
                "trainer_digest": status.get("digest"),
                "duplicates_dropped": int(status.get("duplicates_dropped", 0)),
                "features_digest": features_digest(s, [f"sim-u{i}" for i in range(users)]),
                "served_item_rows": served_items(s),
            })
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def chaos_status(settings: Settings) -> dict[str, Any]:
    import httpx

    url = f"http://127.0.0.1:{settings.trainer.metrics_port}/health"
    return dict(httpx.get(url, timeout=5.0).json())


COMPARED = ["trained", "trainer_digest", "features_digest", "served_item_rows"]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench backfill_chaos", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--users", type=int, default=5_000)
    p.add_argument("--items", type=int, default=5_000)
    p.add_argument("--faults", default=",".join(FAULTS),
                   help=f"comma-separated, the reference 'none' first (default {','.join(FAULTS)})")
    p.add_argument("--log", type=Path, default=None, help="the simulated log (cached)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    if faults[0] != "none":
        faults.insert(0, "none")
    log = args.log or Path(tempfile.gettempdir()) / (
        f"streamrec-sim-{args.events}-{args.users}x{args.items}.ndjson")
    if not log.exists():
        write_log(log, args.events, args.users, args.items)
    runs: list[dict[str, Any]] = []
    reference: dict[str, Any] | None = None
    for fault in faults:
        run = run_one(fault, log, args.users, reference["trained"] if reference else None)
        if reference is None:
            reference = run
        run["equal_to_reference"] = {k: run[k] == reference[k] for k in COMPARED}
        print(json.dumps(run), flush=True)
        runs.append(run)
    out = {"events": args.events, "users": args.users, "items": args.items, "log": str(log),
           "runs": runs, "all_equal": all(all(r["equal_to_reference"].values()) for r in runs)}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    print(json.dumps({"all_equal": out["all_equal"]}))
    return 0 if out["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
