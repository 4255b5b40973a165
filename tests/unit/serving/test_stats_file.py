"""The dashboard collector's snapshot on disk (serving.stats_file) and the collector's own
process loop (serving.dashboard_collector)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from serving.dashboard_collector import collect_into
from serving.stats import SERIES, StatsCollector
from serving.stats_file import (
    STALE_AFTER_S,
    empty_snapshot,
    read_stats,
    stats_path,
    write_stats,
)
from streamrec.settings import load_settings

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def snapshot(now_ms: int = 1000) -> dict:
    snap = empty_snapshot(now_ms / 1000, "unused")
    snap["components"] = {"serving": {"up": True, "reason": None, "url": "http://x/metrics"},
                          "kafka": {"up": True, "reason": None}}
    snap["series"]["t_ms"] = [now_ms]
    snap["series"]["rps"] = [2.5]
    return snap


def test_written_whole_and_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "dashboard" / "stats.json"
    write_stats(path, snapshot())
    write_stats(path, snapshot(3000))  # replaces it
    written = os.stat(path).st_mtime
    body = read_stats(path, written + 1.0)
    assert json.loads(body) == snapshot(3000)
    assert body == path.read_bytes()
    assert [p.name for p in path.parent.iterdir()] == ["stats.json"]  # no temp file left


def test_no_nan_reaches_the_page(tmp_path: Path) -> None:
    import pytest

    with pytest.raises(ValueError):
        write_stats(tmp_path / "stats.json", {"rps": float("nan")})
    assert not (tmp_path / "stats.json").exists()
    assert list(tmp_path.iterdir()) == []


def test_without_a_snapshot_every_component_is_down_with_the_reason(tmp_path: Path) -> None:
    body = json.loads(read_stats(tmp_path / "missing.json", T0.timestamp()))
    assert body["now_ms"] == int(T0.timestamp() * 1000)
    assert set(body["components"]) == {"serving", "ingest", "kafka", "trainer"}
    for state in body["components"].values():
        assert state["up"] is False and "dashboard-collector" in state["reason"]
    assert body["latest"] is None and body["cluster"] is None
    assert body["series"] == {name: [] for name in ("t_ms", *SERIES)}
    assert body["interval_s"] == 2.0 and body["window_s"] == 900.0 and body["k"] == 10
    assert body["model"] == {"version": None, "age_s": None}


def test_a_stale_snapshot_keeps_its_series_with_its_components_down(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    write_stats(path, snapshot())
    written = os.stat(path).st_mtime
    assert json.loads(read_stats(path, written + STALE_AFTER_S)) == snapshot()
    body = json.loads(read_stats(path, written + 60.0))
    assert body["series"] == snapshot()["series"]
    assert body["components"]["serving"] == {"up": False, "url": "http://x/metrics",
                                             "reason": "the dashboard collector stopped 60 s ago"}
    assert body["components"]["kafka"]["up"] is False
    path.write_text("{not json")
    os.utime(path, (written, written))
    broken = json.loads(read_stats(path, written + 60.0))
    assert "unreadable" in broken["components"]["serving"]["reason"]


def test_the_snapshot_lives_in_the_run_folder(tmp_path: Path) -> None:
    settings = load_settings(stack={"run_dir": tmp_path})
    assert stats_path(settings) == tmp_path / "dashboard" / "stats.json"


def test_the_collector_process_writes_each_tick_and_removes_its_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "dashboard" / "stats.json"
    collector = StatsCollector(clock=lambda: T0, serving_url=None, model_url=None,
                               ingest_url=None, trainer_url=None, samples_offsets=None,
                               interval_s=0.01)
    seen: list[dict] = []

    async def scenario() -> None:
        task = asyncio.create_task(collect_into(collector, path))
        deadline = time.monotonic() + 10.0
        while len(seen) < 3:
            assert time.monotonic() < deadline, "no third snapshot within 10 s"
            await asyncio.sleep(0.01)  # polls the file the task writes, under the deadline
            if path.exists():
                seen.append(json.loads(path.read_bytes()))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert len(seen[-1]["series"]["t_ms"]) >= 1
    assert seen[-1]["components"]["serving"]["reason"] == "not configured"
    assert not path.exists()  # a stopped collector leaves no snapshot behind
