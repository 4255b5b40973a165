"""The stack's one dashboard collector, as its own process (``streamrec dashboard-collector``).

It scrapes ingest, the trainer, serving and Kafka every 2 s (``serving.stats``) and writes the
snapshot after each tick (``serving.stats_file``), so no serving worker scrapes anything in the
process whose latency we tune. SIGTERM or SIGINT stops it; it removes its snapshot on the way
out, so the dashboard says at once that the collector is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path

from serving.stats import StatsCollector
from serving.stats_file import write_stats

log = logging.getLogger(__name__)


async def collect_into(collector: StatsCollector, path: Path) -> None:
    """Run ``collector`` until cancelled, writing its snapshot to ``path`` after each tick;
    close it and remove the snapshot at the end."""
    try:
        await collector.run(on_tick=lambda: write_stats(path, collector.snapshot()))
    finally:
        await collector.aclose()
        path.unlink(missing_ok=True)


def run_until_signalled(collector: StatsCollector, path: Path) -> None:
    """:func:`collect_into` in an event loop of its own, stopped by SIGTERM or SIGINT."""

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await collect_into(collector, path)

    log.info("dashboard collector writing %s every %g s", path, collector.interval_s)
    asyncio.run(main())
