"""Replay against the real broker: the whole latest-small file arrives exactly, in event-time
order per partition; a replay killed mid-file and run again sends the rest and no row twice
(the replay ledger), and a third run sends nothing."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from stream.replay.runner import ReplayOptions, ReplaySource, run_replay
from streamrec.settings import Settings
from tests.support import consume, repo_root, shared_data, wait_until

pytestmark = pytest.mark.integration

RATINGS = shared_data() / "ml-latest-small" / "ratings.csv"
ROWS = 100_836


@pytest.mark.skipif(not RATINGS.exists(), reason="needs ../shared/data/ml-latest-small")
def test_latest_small_replays_exactly(settings: Settings, tmp_path: Path) -> None:
    report = run_replay(
        settings, [ReplaySource.of(RATINGS)], ReplayOptions(), state_path=tmp_path / "state.json"
    )
    assert report.sent == ROWS and report.rejected_total == 0

    records = consume(settings.kafka.bootstrap, settings.kafka.events_topic, ROWS, timeout_s=180)
    events = [json.loads(r.value) for r in records]
    assert len(events) == ROWS
    assert len({e["event_id"] for e in events}) == ROWS

    with RATINGS.open(newline="") as fh:
        expected = Counter(
            (row["userId"], row["movieId"], int(row["timestamp"]) * 1000, float(row["rating"]))
            for row in csv.DictReader(fh)
        )
    got = Counter((e["user_id"], e["item_id"], e["ts"], e["value"]) for e in events)
    assert got == expected
    assert all(e["event_type"] == ("like" if e["value"] >= 4 else "rating") for e in events)
    assert all(r.key == json.loads(r.value)["user_id"].encode() for r in records[:1000])

    by_partition: dict[int, list[int]] = {}
    for r, e in zip(records, events, strict=True):
        by_partition.setdefault(r.partition, []).append(e["ts"])
    for partition, times in by_partition.items():
        assert times == sorted(times), f"partition {partition} is not in event-time order"


def test_resume_after_kill_sends_the_rest_once(settings: Settings, tmp_path: Path) -> None:
    n = 3000
    log_file = tmp_path / "clicks.csv"
    log_file.write_text(
        "t,user,item\n" + "".join(f"{1_600_000_000 + i},u{i % 37},i{i}\n" for i in range(n))
    )
    state = tmp_path / "replay-state.json"
    args = [
        sys.executable, "-m", "deploy.cli", "replay", str(log_file),
        "--map", "user_id=user,item_id=item,ts=t", "--event-type", "click",
        "--topic", settings.kafka.events_topic, "--state", str(state), "--no-progress",
        "--checkpoint-every", "100",
    ]  # fmt: skip
    env = dict(
        os.environ,
        STREAMREC_KAFKA__HOST=settings.kafka.host,
        STREAMREC_KAFKA__PORT=str(settings.kafka.port),
        STREAMREC_STACK__RUN_DIR=str(tmp_path / "run"),
    )
    # 3000 events one event-second apart at 250x real time: about 12 s if left alone.
    proc = subprocess.Popen([*args, "--speed", "250"], cwd=repo_root(), env=env)
    try:

        def acked() -> int:
            return int(json.loads(state.read_text())["acked"]) if state.exists() else 0

        wait_until(lambda: acked() >= 500, timeout_s=60, what="the replay to checkpoint 500 rows")
        assert proc.poll() is None, "replay finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed_at = acked()
    assert 500 <= killed_at < n

    out = tmp_path / "report.json"
    done = subprocess.run([*args, "--speed", "max", "--json", str(out)],
                          cwd=repo_root(), env=env, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0
    report = json.loads(out.read_text())
    # the ledger knew the checkpointed rows and found the rest of the killed run in the topic
    assert report["already_replayed"] >= killed_at and report["resumed"] == 0

    records = consume(settings.kafka.bootstrap, settings.kafka.events_topic, n, timeout_s=60)
    counts = Counter(json.loads(r.value)["item_id"] for r in records)
    assert set(counts) == {f"i{i}" for i in range(n)}
    assert max(counts.values()) == 1, sorted(k for k, v in counts.items() if v > 1)[:10]
    assert report["sent"] + report["already_replayed"] == n

    again = subprocess.run([*args, "--speed", "max", "--json", str(out)],
                           cwd=repo_root(), env=env, timeout=120, check=False)  # fmt: skip
    assert again.returncode == 0
    report = json.loads(out.read_text())
    assert report["sent"] == 0 and report["already_replayed"] == n
